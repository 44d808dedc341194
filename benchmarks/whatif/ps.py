"""What-if validation on real MXNet parameter-server jobs (ps-lite): profile small, predict larger.

The job ``examples/mxnet/train_ps.py --model MODEL`` is profiled once with 1 worker and
1 server (``dpro profile``), for ``dist_sync`` and ``dist_async``; ``dpro whatif TRACE
--workers 2,3,4 --servers S [--async] --json`` predicts each cluster; every cluster is then
run UNPROFILED (``DPRO_DISABLE=1``) and timed by the training script itself (per-step wall
clock, mean over workers, median over the steps after the warm-up;
benchmarks/fidelity/ps_jobs.py). For ``dist_async`` the comparison is the mean step
time of a worker (workers / throughput). Loopback, or ``--cap-mbit`` (network namespaces,
root). Other load on the machine is reported (foreign CPU %, as benchmarks/fidelity).

Jobs, profiled and measured, run with ``benchmarks/jobenv.py``'s setting for MXNet (one
compute thread per process, workers pinned to core ``index % cores``), so predictions get
``--pinned``. First, ``dpro calibrate --backend ps-lite`` measures ps-lite's CPU per message
on this machine (1 worker + 1 server, never the validation jobs; under ``--cap-mbit`` in
the same capped namespaces) and every prediction gets ``--host-cores CORES --cpu-cost``
with it (``--no-cpu-cost``: without; each row also keeps the prediction without it). Under
``--cap-mbit``, once the first profile exists, the calibration also measures the server
ports' efficiency with N asynchronous senders (calibrate_ps.measure_port: keys of the
profile's sizes, each round after the profile's computation as CPU, the workers pinned as
the jobs', the servers running the jobs' SGD with momentum; the median of 5 tries), and the
predictions get the file as ``--platform`` too: the link and ports measured behind the cap.

    .venv-mx/bin/python benchmarks/whatif/ps.py [--model mlp] [--workers 2,3,4] [--servers 1,2] [--kvstores dist_sync,dist_async]
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
sys.path.insert(0, str(REPO))  # this checkout's dpro (the calibration)
import jobenv  # noqa: E402  (the jobs' thread and pinning settings, shared with the other harnesses)
from scriptload import load_script  # noqa: E402


def _load(name: str, path: Path):
    return load_script(name, path, add_dir=True)


def _steps(timing: Path, skip: int) -> list[float]:
    """The run's steps after the warm-up, each the mean over the workers (µs)."""
    per = [json.loads(p.read_text())["step_us"][skip:] for p in sorted(timing.glob("timing_rank*.json"))]
    return [statistics.mean(v) for v in zip(*per)]


def calibrate(pj, o: argparse.Namespace, env: dict[str, str], path: Path) -> dict:
    """ps-lite's CPU per message (dpro.whatif.calibrate_ps), on loopback or, capped, with the
    server and the worker in namespaces 0 and 1 behind the same cap as the jobs."""
    from dpro.jsonio import write_json
    from dpro.whatif.calibrate_ps import calibrate_ps

    py = str(pj.MX / "python")
    if o.cap_mbit is None:
        d = calibrate_ps(py, env=env)
    else:
        nn = _load("netns", REPO / "benchmarks" / "fidelity" / "netns.py")
        place = _load("ps_netns", pj.PS_NETNS).placer(1)
        with nn.NetnsCluster(2, o.cap_mbit):
            d = calibrate_ps(py, env=env, place=lambda role: place(role, 0), root_uri=nn.BRIDGE_ADDR)
    d["network"] = "loopback" if o.cap_mbit is None else f"{o.cap_mbit:g} Mbit/s"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, d)
    return d


def link_only(plat: Path) -> Path:
    """A copy of the platform file without the CPU costs (``--platform`` would lend them to
    the prediction without ``--cpu-cost``): the link and the ports."""
    d = json.loads(plat.read_text())
    d["ps"] = {k: v for k, v in d["ps"].items() if "_cpu_" not in k}
    out = plat.with_name(plat.stem + "_link.json")
    out.write_text(json.dumps(d))
    return out


#: the jobs' optimizer on the servers (examples/mxnet/train_ps.py: gluon's Trainer, "sgd", momentum 0.9)
JOB_MOMENTUM = 0.9


def calibrate_ports(pj, o: argparse.Namespace, env: dict[str, str], path: Path, trace: Path, pin: bool) -> None:
    """Capped: the server ports' efficiency with N asynchronous senders (N of --workers above
    1, S of --servers) behind the same cap, in the jobs' conditions: each worker pushing and
    pulling keys of the profile's sizes (its message mix) after the profile's computation
    (as CPU), pinned as the jobs' workers (``pin``), the servers running the jobs' optimizer;
    the median of 5 tries (dpro.whatif.calibrate_ps.measure_port), against the calibration's
    link; added to the platform file."""
    import dpro
    from dpro.jsonio import write_json
    from dpro.whatif.calibrate_ps import measure_port, port_efficiency
    from dpro.whatif.scaleout import ps_compute_us, ps_key_sizes

    d = json.loads(path.read_text())
    job = dpro.open(trace)
    sizes, compute_us = ps_key_sizes(job), ps_compute_us(job)
    nn = _load("netns", REPO / "benchmarks" / "fidelity" / "netns.py")
    placer = _load("ps_netns", pj.PS_NETNS).placer
    rows = d["ps"].get("port_efficiency", [])
    have = {(r["workers"], r["servers"]) for r in rows}
    for s in [int(x) for x in o.servers.split(",")]:
        for w in [int(x) for x in o.workers.split(",") if int(x) > 1]:
            if (w, s) in have:  # measured by an earlier command of the same run
                continue
            with nn.NetnsCluster(w + s, o.cap_mbit):
                r = measure_port(str(pj.MX / "python"), w, s, place=placer(s), root_uri=nn.BRIDGE_ADDR, env=env,
                                 sizes=sizes, compute_us=compute_us, pin=pin, momentum=JOB_MOMENTUM)
            r["efficiency"] = port_efficiency(r, d["ps"]["alpha_us"], d["ps"]["beta_us_per_byte"])
            rows.append(r)
    if len(rows) == len(have):
        return
    d["ps"]["port_efficiency"] = rows
    d["ps"]["port_sizes"] = sizes
    write_json(path, d)
    print(f"# port efficiency (the profile's keys, {compute_us / 1e3:.1f} ms of computation a round, pinned {pin}, "
          f"momentum {JOB_MOMENTUM}, median of tries): "
          + ", ".join(f"{r['workers']}w{r['servers']}s {r['round_us'] / 1e3:.0f} ms {r['efficiency']:.3f} (tries "
                      + "/".join(f"{port_efficiency({**r, 'round_us': x}, d['ps']['alpha_us'], d['ps']['beta_us_per_byte']):.3f}"
                                 for x in r.get("tries_round_us", [r["round_us"]])) + ")" for r in rows),
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--workers", default="2,3,4")
    ap.add_argument("--servers", default="1,2")
    ap.add_argument("--kvstores", default="dist_sync,dist_async")
    ap.add_argument("--cap-mbit", type=float, default=None)
    ap.add_argument("--runs", type=int, default=2, help="unprofiled runs per cluster (median over all their steps)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/dpro-whatif-ps"))
    ap.add_argument("--no-cpu-cost", action="store_true", help="predict without ps-lite's CPU cost (no calibration)")
    o = ap.parse_args()
    pj = _load("ps_jobs", REPO / "benchmarks" / "fidelity" / "ps_jobs.py")
    fid = _load("fidelity_run", REPO / "benchmarks" / "fidelity" / "run.py")
    dpro = [str(pj.MX / "python"), "-m", "dpro.cli"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    js = jobenv.default_for("mx")  # profiled and measured alike
    plat = o.out / ("platform_ps" + ("" if o.cap_mbit is None else f"_cap{o.cap_mbit:g}") + ".json")
    if not o.no_cpu_cost and not plat.exists():
        t0 = time.monotonic()
        ps = calibrate(pj, o, {**env, **js.env()}, plat)["ps"]
        print(f"# ps-lite calibration ({time.monotonic() - t0:.0f} s): CPU per message worker "
              f"{ps['worker_cpu_alpha_us']:.0f} us + {ps['worker_cpu_beta_us_per_byte'] * 1e3:.3f} ns/B, server "
              f"{ps['server_cpu_alpha_us']:.0f} us + {ps['server_cpu_beta_us_per_byte'] * 1e3:.3f} ns/B; link "
              f"{ps['alpha_us']:.0f} us + {ps['beta_us_per_byte'] * 1e3:.3f} ns/B", flush=True)
    rows = []
    for kv in o.kvstores.split(","):
        d = o.out / kv
        trace = d / "profile_1w1s"
        if not trace.exists():
            pj.run([*dpro, "profile", "-o", str(trace), "--warmup", str(pj.WARMUP), "--steps", str(pj.STEPS), "--",
                    *js.apply(pj.job_cmd(o.model, 1, 1, d / "timing_prof", pj.WARMUP + pj.STEPS + 2, o.cap_mbit)),
                    "--kvstore", kv], env=env)
        if o.cap_mbit is not None and not o.no_cpu_cost:
            calibrate_ports(pj, o, {**env, **js.env()}, plat, trace, js.pin)  # the (workers, servers) not measured yet
        for s in [int(x) for x in o.servers.split(",")]:
            args = ["whatif", str(trace), "--workers", o.workers, "--servers", str(s), "--json",
                    "--host-cores", str(os.cpu_count())]
            if kv == "dist_async":
                args.append("--async")
            if js.pin:  # the workers are bound to core index % cores
                args.append("--pinned")
            link = []
            if o.cap_mbit is not None and not o.no_cpu_cost:  # the link and ports measured behind the same cap
                link = ["--platform", str(link_only(plat))]  # its CPU costs only with --cpu-cost
            plain = json.loads(pj.run([*dpro, *args, *link], env=env).stdout)
            pred = plain if o.no_cpu_cost else json.loads(pj.run([*dpro, *args, *link, "--cpu-cost", str(plat)],
                                                                 env=env).stdout)
            for pt, pt0 in zip(pred["scaling"], plain["scaling"]):
                w = pt["workers"]
                steps, loads, per_run = [], [], []
                for k in range(o.runs):  # each run its own directory; a rerun only predicts again
                    tdir = d / f"truth_{w}w{s}s" / f"run{k}"
                    if not (tdir / "load.json").exists():
                        meter = fid.CpuMeter()
                        pj.run([*js.apply(pj.job_cmd(o.model, w, s, tdir, pj.WARMUP + 15, o.cap_mbit)), "--kvstore", kv],
                               env={**env, "DPRO_DISABLE": "1"})
                        (tdir / "load.json").write_text(json.dumps({"foreign_cpu_pct": meter.foreign_pct(),
                                                                    "load_avg_1m": os.getloadavg()[0]}))
                    steps += _steps(tdir, pj.WARMUP)
                    per_run.append(statistics.median(_steps(tdir, pj.WARMUP)))
                    loads.append(json.loads((tdir / "load.json").read_text()))
                meas = statistics.median(steps)
                q = statistics.quantiles(steps, n=4)
                rows.append({"kvstore": kv, "workers": w, "servers": s, "predicted_us": pt["iteration_us"],
                             "measured_us": meas, "error_pct": 100 * (pt["iteration_us"] - meas) / meas,
                             "noise_pct": 100 * (q[2] - q[0]) / meas, "run_medians_us": per_run,
                             "repeat_pct": 100 * (max(per_run) - min(per_run)) / meas,
                             "foreign_cpu_pct": statistics.mean(x["foreign_cpu_pct"] or 0 for x in loads),
                             "load_avg_1m": statistics.mean(x["load_avg_1m"] for x in loads),
                             "network": "loopback" if o.cap_mbit is None else f"{o.cap_mbit:g} Mbit/s",
                             "profile_measured_us": pred["measured_iteration_us"],
                             "predicted_without_cpu_cost_us": pt0["iteration_us"], "settings": js.name,
                             "cpu_cost": None if o.no_cpu_cost else str(plat)})
                print(f"# {kv} {w}w{s}s: predicted {pt['iteration_us'] / 1e3:.2f} ms, measured {meas / 1e3:.2f} ms",
                      flush=True)
    print(f"{'case':26} {'pred ms':>9} {'meas ms':>9} {'err %':>7} {'noise %':>8} {'repeat %':>8} {'foreign %':>9}")
    for r in rows:
        print(f"{o.model + ' ' + r['kvstore'] + ' 1w1s->' + str(r['workers']) + 'w' + str(r['servers']) + 's':26} "
              f"{r['predicted_us'] / 1e3:9.2f} {r['measured_us'] / 1e3:9.2f} {r['error_pct']:+7.1f} "
              f"{r['noise_pct']:8.1f} {r['repeat_pct']:8.1f} {r['foreign_cpu_pct'] or 0:9.0f}")
    errs = sorted(abs(r["error_pct"]) for r in rows)
    if errs:
        print(f"median |error| {statistics.median(errs):.1f}%, max {errs[-1]:.1f}% over {len(errs)} cases "
              f"({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    o.out.mkdir(parents=True, exist_ok=True)
    name = "results" + ("" if o.cap_mbit is None else f"_cap{o.cap_mbit:g}") + ".json"
    (o.out / name).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from boost import boosted

    with boosted() as on:  # the measured jobs before other sessions' work (autogroup nice)
        print(f"# measured jobs boosted: {'yes' if on else 'no'}", file=sys.stderr, flush=True)
        main()
