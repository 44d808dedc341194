"""P3 on a real MXNet parameter-server job, predicted from the plain job's profile (issue #28).

The plain job (``examples/mxnet/train_ps.py --model MODEL``, gluon's Trainer, ``waitall``
every step) is profiled once with ``--profile-workers`` workers and 1 server (``dpro
profile --mxnet-unbulk``: the forward's layers op by op, so the P3 model sees which
layer waits for which pull); ``dpro whatif TRACE --workers W --servers 1 --json`` predicts
the plain job and, with ``--apply p3:slice_bytes=N``, the P3 job (``train_ps.py --p3
--slice-bytes N``: sliced keys, first layer first, no barrier between steps). Then the
plain job and every P3 variant run UNPROFILED (``DPRO_DISABLE=1``), interleaved in
``--rounds`` rounds (the order alternates from round to round), each timed by the
training script itself: per-step wall clock (P3: backward end to backward end), mean
over workers, median over every step after the warm-up of every run. The speed-up is
measured per round (plain run / P3 run of the same round, median over rounds) and
predicted (plain prediction / P3 prediction).

Everything else is benchmarks/whatif/ps.py's: the cap (``--cap-mbit``, each process in a
network namespace, root), the jobs' settings (benchmarks/jobenv.py: one thread, workers
pinned, so predictions get ``--host-cores CORES --pinned``), ps-lite's CPU calibration
(``--cpu-cost``; capped, the calibration's link as ``--platform`` too: the trace's fit
is faster than the cap's payload rate, its per-message intercept absorbing the difference,
which every P3 slice would pay again), the other load on the machine, the boosted measured
jobs. Run it
through benchmarks/measure.sh:

    benchmarks/measure.sh .venv-mx/bin/python benchmarks/whatif/p3.py --cap-mbit 1000 [--slice-bytes 524288,131072]

Writes ``OUT/results_p3[_capR].json`` (rows for benchmarks/whatif/table.py) and prints the
table and the speed-ups.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


sys.path.insert(0, str(REPO / "benchmarks"))
from scriptload import load_script  # noqa: E402

psh = load_script("whatif_ps", HERE / "ps.py")  # its job helpers, calibration and loaders (it sets up sys.path)
import jobenv  # noqa: E402


def _kib(n: int) -> str:
    return f"{n >> 10} KiB" if n % 1024 == 0 else f"{n} B"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--profile-workers", type=int, default=1, help="workers of the plain profile (1 server)")
    ap.add_argument("--slice-bytes", default="524288,131072", help="P3 variants: slice sizes in bytes")
    ap.add_argument("--cap-mbit", type=float, default=None)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of (plain, every P3 variant), unprofiled")
    ap.add_argument("--out", type=Path, default=Path("/tmp/dpro-whatif-p3"))
    ap.add_argument("--no-cpu-cost", action="store_true", help="predict without ps-lite's CPU cost (no calibration)")
    o = ap.parse_args()
    sizes = [int(x) for x in o.slice_bytes.split(",") if x]
    pj = psh._load("ps_jobs", REPO / "benchmarks" / "fidelity" / "ps_jobs.py")
    fid = psh._load("fidelity_run", REPO / "benchmarks" / "fidelity" / "run.py")
    dpro = [str(pj.MX / "python"), "-m", "dpro.cli"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    js = jobenv.default_for("mx")
    net = "loopback" if o.cap_mbit is None else f"{o.cap_mbit:g} Mbit/s"
    tag = "" if o.cap_mbit is None else f"_cap{o.cap_mbit:g}"
    plat = o.out / f"platform_ps{tag}.json"
    if not o.no_cpu_cost and not plat.exists():
        t0 = time.monotonic()
        ps = psh.calibrate(pj, o, {**env, **js.env()}, plat)["ps"]
        print(f"# ps-lite calibration ({time.monotonic() - t0:.0f} s): worker {ps['worker_cpu_alpha_us']:.0f} us + "
              f"{ps['worker_cpu_beta_us_per_byte'] * 1e3:.3f} ns/B, server {ps['server_cpu_alpha_us']:.0f} us + "
              f"{ps['server_cpu_beta_us_per_byte'] * 1e3:.3f} ns/B", flush=True)
    trace = o.out / f"profile_{o.profile_workers}w1s{tag}"
    if not trace.exists():
        pj.run([*dpro, "profile", "-o", str(trace), "--warmup", str(pj.WARMUP), "--steps", str(pj.STEPS),
                "--mxnet-unbulk", "--",
                *js.apply(pj.job_cmd(o.model, o.profile_workers, 1, o.out / f"timing_prof{tag}",
                                     pj.WARMUP + pj.STEPS + 2, o.cap_mbit))], env=env)
    # the model is fixed before any measured run: predict first
    args = ["whatif", str(trace), "--workers", str(o.workers), "--servers", "1", "--json",
            "--host-cores", str(os.cpu_count())]
    if js.pin:
        args.append("--pinned")
    if not o.no_cpu_cost:
        args += ["--cpu-cost", str(plat)]
        if o.cap_mbit is not None:  # as ps.py: the link measured behind the cap, not the trace's fit
            args += ["--platform", str(psh.link_only(plat))]
    variants: dict[str, tuple[list[str], list[str]]] = {"plain": ([], [])}
    for n in sizes:
        variants[f"p3 {_kib(n)}"] = (["--apply", f"p3:slice_bytes={n}"], ["--p3", "--slice-bytes", str(n)])
    pred = {v: json.loads(pj.run([*dpro, *args, *wa], env=env).stdout) for v, (wa, _) in variants.items()}
    for v, p in pred.items():
        print(f"# predicted {v}: {p['predicted_iteration_us'] / 1e3:.2f} ms", flush=True)
    steps: dict[str, list[float]] = {v: [] for v in variants}
    per_run: dict[str, list[float]] = {v: [] for v in variants}
    loads: dict[str, list[dict]] = {v: [] for v in variants}
    for k in range(o.rounds):
        order = list(variants) if k % 2 == 0 else list(reversed(variants))
        for v in order:
            tdir = o.out / f"truth{tag}" / v.replace(" ", "_") / f"run{k}"
            if not (tdir / "load.json").exists():
                meter = fid.CpuMeter()
                pj.run([*js.apply(pj.job_cmd(o.model, o.workers, 1, tdir, pj.WARMUP + 15, o.cap_mbit)),
                        *variants[v][1]], env={**env, "DPRO_DISABLE": "1"})
                (tdir / "load.json").write_text(json.dumps({"foreign_cpu_pct": meter.foreign_pct(),
                                                            "load_avg_1m": os.getloadavg()[0]}))
            s = psh._steps(tdir, pj.WARMUP)
            steps[v] += s
            per_run[v].append(statistics.median(s))
            loads[v].append(json.loads((tdir / "load.json").read_text()))
            print(f"# round {k} {v}: {per_run[v][-1] / 1e3:.2f} ms", flush=True)
    rows = []
    for v, (wa, _) in variants.items():
        meas = statistics.median(steps[v])
        q = statistics.quantiles(steps[v], n=4)
        p = pred[v]["predicted_iteration_us"]
        row = {"variant": v, "whatif": wa[1] if wa else "none", "workers": o.workers, "servers": 1,
               "profiled_workers": o.profile_workers, "predicted_us": p, "measured_us": meas,
               "error_pct": 100 * (p - meas) / meas, "noise_pct": 100 * (q[2] - q[0]) / meas,
               "run_medians_us": per_run[v], "repeat_pct": 100 * (max(per_run[v]) - min(per_run[v])) / meas,
               "foreign_cpu_pct": statistics.mean(x["foreign_cpu_pct"] or 0 for x in loads[v]),
               "load_avg_1m": statistics.mean(x["load_avg_1m"] for x in loads[v]), "network": net,
               "settings": js.name, "cpu_cost": None if o.no_cpu_cost else str(plat),
               "profile_measured_us": pred[v]["measured_iteration_us"]}
        if v != "plain":
            row["measured_speedup"] = statistics.median(a / b for a, b in zip(per_run["plain"], per_run[v]))
            row["predicted_speedup"] = pred["plain"]["predicted_iteration_us"] / p
        rows.append(row)
    print(f"{'case':18} {'pred ms':>9} {'meas ms':>9} {'err %':>7} {'noise %':>8} {'repeat %':>8} "
          f"{'speed-up meas':>13} {'pred':>6}")
    for r in rows:
        sp = f"{r['measured_speedup']:13.3f} {r['predicted_speedup']:6.3f}" if "measured_speedup" in r else ""
        print(f"{r['variant']:18} {r['predicted_us'] / 1e3:9.2f} {r['measured_us'] / 1e3:9.2f} {r['error_pct']:+7.1f} "
              f"{r['noise_pct']:8.1f} {r['repeat_pct']:8.1f} {sp}")
    print(f"{o.model} {o.profile_workers}w1s profile -> {o.workers}w1s, {net}, {o.rounds} rounds, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    o.out.mkdir(parents=True, exist_ok=True)
    (o.out / f"results_p3{tag}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    from boost import boosted  # noqa: E402  (benchmarks/whatif: the script's own directory)

    with boosted() as on:  # the measured jobs before other sessions' work (autogroup nice)
        print(f"# measured jobs boosted: {'yes' if on else 'no'}", file=sys.stderr, flush=True)
        main()
