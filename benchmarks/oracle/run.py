"""Predicted (``dpro oracle``, analytical and ``--simulate``) vs measured iteration time of
every parallel strategy of examples/parallel/ at 2 and 4 processes over gloo.

1. calibrates this machine (gloo_link.py at every process count: all-reduce, all-gather,
   halo exchange; the host copies and autograd.Functions of examples/parallel/), fits it
   (dpro/oracle/calibration.py) into a platform file with an ``oracle`` section
   (``cores``: this host's CPUs, so that 4 processes on 2 cores share them);
2. profiles data parallelism on 2 processes with dpro's recorder (the oracle's input), at
   two global batches (``--profile-batches``, default ``--batch`` and half of it: 16 and 8
   samples per device), so that the oracle fits each layer's time as a + b·batch (issue
   #29; the first profile alone, today's proportional rule, is printed after the main table);
3. runs ``run_oracle`` on it for every strategy and device count (its grids: pipeline
   micro-batches and stages, the hybrids' groups are passed to the launcher as it advises);
4. runs every feasible strategy unprofiled (``--steps``, the first ``--skip`` dropped):
   measured iteration = median over steps of the mean over ranks;
5. with ``--profile-each``, profiles every strategy too and puts dpro's reading of its
   trace next to the prediction: the time breakdown (``dpro replay``'s: compute, the
   collectives' time and their exposed part) and the peak memory per worker (dpro's memory
   model on the recorded allocations, docs/memory.md) against the predicted memory;
6. prints the tables (and writes them as JSON) with the load average of the machine
   (other work on it makes the measurement noisy: say so).

Every job (the calibration, the profiles, the unprofiled runs) runs with the same job
settings of benchmarks/jobenv.py (``--job-setting``, default ``threads1``: one compute
thread per process in every pool, unpinned; ``threads1pin`` also binds each rank to core
``rank % cores``, which made the calibration's per-call costs at 2 processes 1.3-1.8x
higher than unpinned and the jobs no more repeatable: docs/oracle.md), and under
benchmarks/whatif/boost.py's ``boosted()``: their autogroups get nice -19 (root, autogroup
on), so other sessions' work only gets the CPU they leave idle; the header says whether
boosting worked.

    python benchmarks/oracle/run.py [--procs 2,4] [--profile-each] [--out /tmp/dpro-oracle-bench]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "parallel" / "train.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: set by --cap-mbit: ranks run in the capped namespaces (netns_launch.py) instead of under torchrun
CAPPED = False
sys.path.insert(0, str(REPO / "benchmarks"))
import jobenv  # noqa: E402

#: set by --job-setting: the threads and pinning of every rank (calibration, profiles, measured runs);
#: unpinned by default (docs/oracle.md, #29's fourth session: pinned and unpinned back to back)
SETTING = jobenv.SETTINGS["threads1"]


#: steps of a profiled launch: the recorder's 5 warm-up and 5 profiled calls, then the 20 calls it
#: times after its window (DPRO_AFTER_STEPS' default), whose settled pace against the window's
#: is the recorder's overhead the oracle takes out (dpro/graph/overhead.py); with 16 steps only
#: 6 were timed, 3 of them kept (session 27)
PROFILE_STEPS = 30


def launcher(n: int, script: Path, *args: str) -> list[str]:
    """The command that starts ``n`` ranks of ``script`` (torchrun on loopback, or one
    process per network namespace under a cap)."""
    if CAPPED:
        return [sys.executable, str(REPO / "benchmarks" / "oracle" / "netns_launch.py"), str(n), str(_port()),
                *SETTING.script(script), *args]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "--master_addr", "127.0.0.1",
            "--master_port", str(_port()), *SETTING.script(script), *args]


def job_env() -> dict[str, str]:
    """The environment of every job: this one's (without ``DPRO_*``), one thread, the setting's."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DPRO_")} | {"OMP_NUM_THREADS": "1"} | SETTING.env()


def torchrun(n: int, script: Path, *args: str, env: dict | None = None) -> None:
    cmd = launcher(n, script, *args)
    e = job_env() | (env or {})
    r = subprocess.run(cmd, cwd=REPO, env=e, capture_output=True, text=True, timeout=1200)
    if r.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r.stderr[-3000:]}")


def platform_file(out: Path, procs: list[int], compute_us: float = 0.0, idle_us: float = 8000.0) -> Path:
    """Calibrate at every process count of ``procs`` (the host costs at the first) with
    dpro/oracle/measure.py in ranks of this run's launcher (loopback or the capped
    namespaces: what ``dpro calibrate --oracle`` measures in local processes) and write the
    platform file the library builds from the samples (``platform_from_samples``: the
    first count's all-reduce as α, β, ``cores``, the ``oracle`` section with its token
    bucket and topology); ``compute_us``: every calibrated collective comes after that much compute."""
    from dpro.oracle.calibration import platform_from_samples

    samples = {}
    for k, n in enumerate(procs):
        f = out / f"gloo_link_{n}_c{compute_us:g}.json"
        torchrun(n, REPO / "benchmarks" / "oracle" / "gloo_link.py", "--out", str(f), "--compute-us", str(compute_us),
                 "--idle-us", str(idle_us), *(["--no-host"] if k else []))
        samples[n] = json.loads(f.read_text())
    plat = out / f"platform_c{compute_us:g}.json"
    plat.write_text(json.dumps(platform_from_samples(samples, cores=os.cpu_count())))
    return plat


def measure(n: int, strategies: list[str], extra: list[str], out: Path, steps: int, skip: int,
            repeats: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per strategy, one iteration time per launch (median over steps of the mean over
    ranks), and the time of it spent inside the strategy's torch.distributed calls (the
    same statistic of train.py's ``cpu_us`` ``comm``: waiting for the peers included);
    launches alternate the order of the strategies."""
    got: dict[str, list[float]] = {s: [] for s in strategies}
    comm: dict[str, list[float]] = {s: [] for s in strategies}
    for k in range(repeats):
        order = strategies if k % 2 == 0 else strategies[::-1]
        pattern = out / f"timing{n}_{k}_{{rank}}.json"
        torchrun(n, TRAIN, "--strategy", ",".join(order), "--steps", str(steps), "--timing-skip", str(skip),
                 "--timing-out", str(pattern), *extra)
        files = [json.loads(Path(str(pattern).format(rank=r)).read_text()) for r in range(n)]
        per_rank = [f["step_us"] for f in files]
        for s in strategies:
            got[s].append(statistics.median(float(np.mean([pr[s][i] for pr in per_rank]))
                                            for i in range(len(per_rank[0][s]))))
            comm[s].append(statistics.median(float(np.mean([f["cpu_us"][s][i]["comm"] for f in files]))
                                             for i in range(len(per_rank[0][s]))))
    return got, comm


def profiled(n: int, strategy: str, extra: list[str], out: Path) -> dict:
    """dpro's reading of a profiled run of ``strategy``: breakdown (µs) and peak memory per worker."""
    import dpro

    trace = out / f"prof_{strategy.replace('+', '_')}_{n}"
    for attempt in (1, 2):  # a second try (new port): a profiled launch seldom fails (seen: a collective
        # missing from one rank's recorded trace, dpro profile exit 2)
        cmd = [sys.executable, "-m", "dpro.cli", "profile", "--force", "--shapes", "--memory", "-o", str(trace), "--",
               *launcher(n, TRAIN, "--strategy", strategy, "--steps", str(PROFILE_STEPS), *extra)]
        p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=job_env())
        if p.returncode == 0:
            break
        print(f"# profile of {strategy} x{n} failed (try {attempt}): {p.stderr.strip()[-600:]}", file=sys.stderr)
    else:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    r = dpro.open(trace).replay()
    b = r.breakdown_us
    compute = sum(b.get(k, 0.0) for k in ("FW", "BW", "UPDATE", "OTHER", "host_gap"))
    peaks = [m.peak_bytes for m in r.memory.values() if m.source == "allocations"]
    return {"profiled_iteration_us": r.measured_iteration_us, "compute_us": compute, "comm_us": b.get("COMM", 0.0),
            "exposed_comm_us": b.get("exposed_COMM", 0.0), "idle_us": b.get("idle", 0.0),
            "peak_bytes": max(peaks) if peaks else None}


def median_profiles(out: Path, batches: list[int], k: int) -> tuple[list[Path], list[Path]]:
    """Profile data parallelism on 2 processes ``k`` times at each global batch of
    ``batches`` (the oracle's input; launches interleaved over the batches) and keep, per
    batch, as ``out/trace`` (the first batch) and ``out/trace_b<B>`` (the others), the
    profile whose per-iteration layer compute (the oracle's reading, recorder overhead taken
    out) is the median: one profile catches the VM's slow or fast spells (12:01 and 12:19
    UTC: 15.1 and 7.6 ms of layer compute for the same job). Two batches or more: the oracle
    fits each layer's time as a + b·batch (``--profile-at``, issue #29). Returns the kept
    profiles and the other repeats (``out/trace_b<B>_<i>``), which the guarded affine rule
    also reads (the spread at each batch)."""
    import shutil

    import dpro
    from dpro.oracle.layers import model_profile

    got: dict[int, list[tuple[float, Path]]] = {b: [] for b in batches}
    for i in range(k):
        for b in (batches if i % 2 == 0 else batches[::-1]):
            t = out / f"trace_b{b}_{i}"
            subprocess.run([sys.executable, "-m", "dpro.cli", "profile", "--force", "--shapes", "--memory", "-o", str(t),
                            "--", *launcher(2, TRAIN, "--strategy", "data", "--steps", str(PROFILE_STEPS), "--batch", str(b))],
                           cwd=REPO, check=True, capture_output=True, env=job_env())
            m = model_profile(dpro.open(t))
            got[b].append((sum((x.fw_us + x.bw_us) * m.batch + x.fw_call_us + x.bw_call_us for x in m.layers), t))
    kept, repeats = [], []
    for j, b in enumerate(batches):
        got[b].sort()
        print(f"# profiles' layer compute at batch {b} on 2 processes (ms): "
              + ", ".join(f"{c / 1e3:.2f}" for c, _ in got[b]) + "; the median kept", file=sys.stderr, flush=True)
        trace = out / ("trace" if j == 0 else f"trace_b{b}")
        shutil.rmtree(trace, ignore_errors=True)
        got[b][len(got[b]) // 2][1].rename(trace)
        kept.append(trace)
        repeats += [t for i, (_, t) in enumerate(got[b]) if i != len(got[b]) // 2]
    return kept, repeats


def main() -> None:
    global CAPPED, SETTING
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", default="2,4")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=10)
    p.add_argument("--repeats", type=int, default=2, help="launches per device count (order alternated)")
    p.add_argument("--profiles", type=int, default=3,
                   help="profiles of data parallelism (the oracle's input); the median by layer compute is used")
    p.add_argument("--profile-batches", default=None,
                   help="global batches of the profiles on 2 processes (default: --batch and --batch / 2): with two "
                        "or more the oracle fits each layer's time as a + b x batch (issue #29); one keeps the "
                        "proportional rule")
    p.add_argument("--profile-each", action="store_true", help="also profile every strategy: breakdown and memory")
    p.add_argument("--cap-mbit", type=float, default=None,
                   help="run every rank in its own network namespace with a tbf cap (Mbit/s per direction; root)")
    p.add_argument("--calib-idle-us", type=float, default=8000.0,
                   help="idle before every calibrated call (µs): a token bucket on the link refills")
    p.add_argument("--calib-compute-us", default="0,2000",
                   help="calibrate the collectives after this much compute (µs), one platform each; the first "
                        "one's predictions are the main table, the others follow")
    p.add_argument("--job-setting", default=SETTING.name, choices=list(jobenv.SETTINGS),
                   help="threads and pinning of every job (benchmarks/jobenv.py; default %(default)s)")
    p.add_argument("--out", type=Path, default=Path("/tmp/dpro-oracle-bench"))
    args = p.parse_args()
    SETTING = jobenv.SETTINGS[args.job_setting]
    sys.path.insert(0, str(REPO))
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO / "benchmarks" / "whatif"))
    from boost import boosted

    with boosted() as on:  # the measured jobs before other sessions' work (autogroup nice)
        print(f"# measured jobs boosted: {'yes' if on else 'no'}", file=sys.stderr, flush=True)
        if args.cap_mbit:
            sys.path.insert(0, str(REPO / "benchmarks" / "fidelity"))
            from netns import NetnsCluster

            CAPPED = True
            with NetnsCluster(max(int(x) for x in args.procs.split(",")), rate_mbit=args.cap_mbit):
                return run(args, on)
        run(args, on)


def run(args: argparse.Namespace, boosted_: bool = False) -> None:
    import dpro
    from dpro.oracle import run_oracle

    load0 = os.getloadavg()
    procs = [int(x) for x in args.procs.split(",")]
    calibs = [float(x) for x in args.calib_compute_us.split(",")]
    plats = {c: platform_file(args.out, procs, c, args.calib_idle_us) for c in calibs}
    plat = plats[calibs[0]]
    pbatches = [int(x) for x in args.profile_batches.split(",")] if args.profile_batches else \
        [args.batch, args.batch // 2]
    (trace, *others), repeats = median_profiles(args.out, pbatches, args.profiles)
    # the other batches' median profiles and every repeat: the guarded affine rule weighs the
    # fit against the spread of the repeats at each batch (issue #29, session 27)
    at = [dpro.open(t) for t in [*others, *repeats]]
    res = run_oracle(dpro.open(trace), procs, batch=args.batch, platform=str(plat), simulate=True, profile_at=at)
    alts = {c: run_oracle(dpro.open(trace), procs, batch=args.batch, platform=str(plats[c]), simulate=True,
                          profile_at=at) for c in calibs[1:]}  # the same profiles under the other calibrations
    # the first profile alone (today's proportional rule), for the rows that moved
    prop = run_oracle(dpro.open(trace), procs, batch=args.batch, platform=str(plat), simulate=True) if at else None
    rows = []
    for n in procs:
        preds = {x.strategy: x for x in res.predictions if x.devices == n and x.feasible}
        extra = []
        if "pipeline" in preds:
            launch = res.launcher(preds["pipeline"]).split()
            extra += launch[launch.index("--micro"):launch.index("--micro") + 2]
            if "--cuts" in launch:
                extra += launch[launch.index("--cuts"):launch.index("--cuts") + 2]
        hyb = [s for s in preds if "+" in s]
        if hyb:
            extra += ["--p2", str(n // preds[hyb[0]].grid["data"])]
        runs, in_comm = measure(n, list(preds), extra + ["--batch", str(args.batch)], args.out, args.steps,
                                args.skip, args.repeats)
        for s, x in preds.items():
            seen = profiled(n, s, extra + ["--batch", str(args.batch)], args.out) if args.profile_each else None
            sim, m = res.simulated.get((s, n)), statistics.median(runs[s])
            rows.append({"strategy": s, "devices": n, "measured_us": m, "runs_us": runs[s],
                         "measured_comm_us": statistics.median(in_comm[s]), "runs_comm_us": in_comm[s],
                         "spread_pct": 100 * (max(runs[s]) - min(runs[s])) / m, "predicted_us": x.iteration_us,
                         "error_pct": 100 * (x.iteration_us - m) / m, "simulated_us": sim,
                         "sim_error_pct": 100 * (sim - m) / m if sim == sim else None,
                         "compute_us": x.compute_us, "communication_us": x.communication_us, "host_us": x.host_us,
                         "memory_bytes": x.memory_bytes, "grid": x.grid, "profiled": seen, "alt": {}})
            if prop is not None:
                y = next(q for q in prop.predictions if q.strategy == s and q.devices == n)
                ys = prop.simulated.get((s, n), math.nan)
                rows[-1]["proportional"] = {"predicted_us": y.iteration_us, "error_pct": 100 * (y.iteration_us - m) / m,
                                            "simulated_us": ys, "sim_error_pct": 100 * (ys - m) / m,
                                            "compute_us": y.compute_us, "host_us": y.host_us}
            for c, other in alts.items():
                y = next(q for q in other.predictions if q.strategy == s and q.devices == n)
                ys = other.simulated.get((s, n), math.nan)
                rows[-1]["alt"][c] = {"predicted_us": y.iteration_us, "error_pct": 100 * (y.iteration_us - m) / m,
                                      "simulated_us": ys, "sim_error_pct": 100 * (ys - m) / m,
                                      "compute_us": y.compute_us, "host_us": y.host_us,
                                      "communication_us": y.communication_us}
    load1 = os.getloadavg()
    if args.profile_each:
        print("\nbreakdown (ms) and memory (MiB): predicted | dpro's reading of the profiled run")
        print(f"{'strategy':<13} {'p':>2} {'compute':>8} {'comm':>6} | {'compute':>8} {'comm':>6} {'exposed':>7} "
              f"{'idle':>6} | {'memory':>7} {'peak':>7}")
        for r in rows:
            q = r["profiled"]
            peak = f"{q['peak_bytes'] / 2**20:7.2f}" if q["peak_bytes"] else "      -"
            print(f"{r['strategy']:<13} {r['devices']:>2} {r['compute_us'] / 1e3:8.2f} "
                  f"{sum(r['communication_us'].values()) / 1e3:6.2f} | {q['compute_us'] / 1e3:8.2f} "
                  f"{q['comm_us'] / 1e3:6.2f} {q['exposed_comm_us'] / 1e3:7.2f} {q['idle_us'] / 1e3:6.2f} | "
                  f"{r['memory_bytes'] / 2**20:7.2f} {peak}")
    mean_err = statistics.mean(abs(r["error_pct"]) for r in rows)
    sims = [abs(r["sim_error_pct"]) for r in rows if r["sim_error_pct"] is not None]
    net = f"tbf cap {args.cap_mbit:g} Mbit/s in network namespaces" if args.cap_mbit else "loopback"
    print(f"network: {net}; platform: α {res.platform.alpha_us:.1f} µs, β {res.platform.beta_us_per_byte * 1e3:.3f} ns/B; "
          f"load average before {load0[0]:.2f}, after {load1[0]:.2f} on {os.cpu_count()} CPUs; "
          f"measured jobs boosted: {'yes' if boosted_ else 'no'}")
    print(f"job setting: {SETTING.name} ({SETTING.notes}); 'in comm': measured time inside the strategy's "
          f"torch.distributed calls (waits for peers included; DDP's all-reduce is inside its backward: -) | predicted "
          f"communication")
    print(f"{'strategy':<13} {'p':>2} {'measured ms':>11} {'runs ±%':>7} {'oracle ms':>9} {'err %':>6} {'sim ms':>7} {'err %':>6}"
          f"  {'in comm':>7} | {'pred':>6}  {'compute':>7} {'host':>5}  communication by phase (ms)")
    for r in rows:
        comm = " ".join(f"{k} {v / 1e3:.2f}" for k, v in r["communication_us"].items() if v)
        sim = "" if r["sim_error_pct"] is None else f"{r['simulated_us'] / 1e3:7.2f} {r['sim_error_pct']:+6.1f}"
        incomm = f"{r['measured_comm_us'] / 1e3:7.2f}" if r["strategy"] != "data" else "-"
        print(f"{r['strategy']:<13} {r['devices']:>2} {r['measured_us'] / 1e3:11.2f} {r['spread_pct']:7.1f} "
              f"{r['predicted_us'] / 1e3:9.2f} "
              f"{r['error_pct']:+6.1f} {sim:>14}  {incomm:>7} | {sum(r['communication_us'].values()) / 1e3:6.2f}  "
              f"{r['compute_us'] / 1e3:7.2f} {sum(r['host_us'].values()) / 1e3:5.2f}  {comm}")
    print(f"mean |error|: analytical {mean_err:.1f} %, simulated {statistics.mean(sims) if sims else float('nan'):.1f} %"
          f" (calibrated after {calibs[0]:g} µs of compute; batch rule {res.model.rule}, profiles at "
          f"{', '.join(map(str, res.model.batches))} samples per device)")
    if prop is not None:
        print(f"\nthe same, the first profile alone (proportional rule, {prop.model.batch} samples per device)")
        print(f"{'strategy':<13} {'p':>2} {'measured ms':>11} {'oracle ms':>9} {'err %':>6} {'sim ms':>7} {'err %':>6}"
              f"  {'compute':>7} | affine: {'compute':>7} {'err %':>6}")
        for r in rows:
            a = r["proportional"]
            print(f"{r['strategy']:<13} {r['devices']:>2} {r['measured_us'] / 1e3:11.2f} {a['predicted_us'] / 1e3:9.2f} "
                  f"{a['error_pct']:+6.1f} {a['simulated_us'] / 1e3:7.2f} {a['sim_error_pct']:+6.1f}  "
                  f"{a['compute_us'] / 1e3:7.2f} |         {r['compute_us'] / 1e3:7.2f} {r['error_pct']:+6.1f}")
        errs = [abs(r["proportional"]["error_pct"]) for r in rows]
        serrs = [abs(r["proportional"]["sim_error_pct"]) for r in rows
                 if r["proportional"]["sim_error_pct"] == r["proportional"]["sim_error_pct"]]
        print(f"mean |error|: analytical {statistics.mean(errs):.1f} %, simulated {statistics.mean(serrs):.1f} %")
    for c, other in alts.items():
        print(f"\nthe same, calibrated after {c:g} µs of compute: platform α {other.platform.alpha_us:.1f} µs, "
              f"β {other.platform.beta_us_per_byte * 1e3:.3f} ns/B")
        print(f"{'strategy':<13} {'p':>2} {'measured ms':>11} {'oracle ms':>9} {'err %':>6} {'sim ms':>7} {'err %':>6}"
              f"  {'compute':>7} {'host':>5}  communication by phase (ms)")
        for r in rows:
            a = r["alt"][c]
            comm = " ".join(f"{k} {v / 1e3:.2f}" for k, v in a["communication_us"].items() if v)
            print(f"{r['strategy']:<13} {r['devices']:>2} {r['measured_us'] / 1e3:11.2f} {a['predicted_us'] / 1e3:9.2f} "
                  f"{a['error_pct']:+6.1f} {a['simulated_us'] / 1e3:7.2f} {a['sim_error_pct']:+6.1f}  "
                  f"{a['compute_us'] / 1e3:7.2f} {sum(a['host_us'].values()) / 1e3:5.2f}  {comm}")
        errs = [abs(r["alt"][c]["error_pct"]) for r in rows]
        serrs = [abs(r["alt"][c]["sim_error_pct"]) for r in rows if r["alt"][c]["sim_error_pct"] == r["alt"][c]["sim_error_pct"]]
        print(f"mean |error|: analytical {statistics.mean(errs):.1f} %, simulated {statistics.mean(serrs):.1f} %")
    (args.out / "result.json").write_text(json.dumps({"rows": rows, "load": [load0, load1], "cap_mbit": args.cap_mbit,
                                                      "job_setting": SETTING.name,
                                                      "batch_rule": res.model.rule,
                                                      "profiled_batches_per_device": res.model.batches,
                                                      "boosted": boosted_,
                                                      "platform": res.platform.to_json()}, indent=1))
    print(f"wrote {args.out / 'result.json'}")


if __name__ == "__main__":
    main()
