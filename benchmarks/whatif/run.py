"""What-if validation: predicted vs measured step time of real DDP (gloo) jobs at other scales.

For each profile size P (default 1 and 2 workers) the job
``examples/pytorch/train_ddp.py --model MODEL`` is profiled with torch.profiler at P ranks
(loopback, torchrun); ``dpro whatif TRACE --workers 2,3,4 --json`` predicts each target
scale (a 1-worker profile has no collective to fit: it gets ``--platform`` from
``dpro calibrate``, run once here); then every target is run UNPROFILED and timed by the
training script itself (``--timing-out``: ``time.perf_counter()`` step to step, mean over
the ranks, median over the timed steps and runs) -- the harness trusts nothing dpro says
about the measured side. ``foreign_cpu_pct`` is the CPU time other processes used during
each measured run (benchmarks/fidelity/run.py's meter): other work on a shared machine.

Usage::

    python benchmarks/whatif/run.py [--model mlp] [--profiles 1,2] [--targets 2,3,4] [--out /tmp/dpro-whatif]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
TRAIN = ROOT / "examples" / "pytorch" / "train_ddp.py"


def _fidelity():
    spec = importlib.util.spec_from_file_location("fidelity_run", ROOT / "benchmarks" / "fidelity" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fidelity_run"] = mod
    spec.loader.exec_module(mod)
    return mod


def torchrun(n: int, port: int, args: list[str], timeout: float = 600) -> None:
    cmd = [PY, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "--master_port", str(port), str(TRAIN), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, timeout=timeout, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def measure(n: int, model: str, out: Path, port: int, steps: int, warmup: int, meter_cls, reuse: bool) -> dict:
    """Unprofiled run of n ranks: median step time (mean over ranks), µs, and foreign CPU %."""
    out.mkdir(parents=True, exist_ok=True)
    meter = meter_cls()
    if reuse and (out / "meta.json").exists():
        return json.loads((out / "meta.json").read_text())
    torchrun(n, port, ["--model", model, "--steps", str(steps), "--warmup", str(warmup),
                       "--timing-out", str(out / "t{rank}.json")])
    per_rank = [json.loads((out / f"t{r}.json").read_text())["step_us"] for r in range(n)]
    per_step = [sum(v) / len(v) for v in zip(*per_rank)]
    q = statistics.quantiles(per_step, n=4) if len(per_step) >= 4 else [0, 0, 0]
    med = statistics.median(per_step)
    res = {"measured_us": med, "noise_pct": 100 * (q[2] - q[0]) / med, "foreign_cpu_pct": meter.foreign_pct(),
           "load_avg_1m": os.getloadavg()[0]}
    (out / "meta.json").write_text(json.dumps(res))
    return res


def dpro(*args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([PY, "-m", "dpro.cli", *args], capture_output=True, text=True, env=env, timeout=900)
    if p.returncode:
        raise RuntimeError(f"dpro {' '.join(args)}: {p.stderr.strip()}")
    return json.loads(p.stdout) if "--json" in args else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--profiles", default="1,2")
    ap.add_argument("--targets", default="2,3,4")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("/tmp/dpro-whatif"))
    ap.add_argument("--port", type=int, default=29900)
    ap.add_argument("--reuse", action="store_true", help="keep the measurements and profiles already in OUT")
    ap.add_argument("--host-cores", type=int, default=os.cpu_count(),
                    help="passed to dpro whatif: the ranks share this host's cores (default: all of them)")
    o = ap.parse_args()
    fid = _fidelity()
    o.out.mkdir(parents=True, exist_ok=True)
    targets = [int(x) for x in o.targets.split(",")]
    port = o.port
    plat = o.out / "platform.json"
    if not plat.exists():
        dpro("calibrate", "-o", str(plat))
    truth = {}
    rows = []
    for n in targets:
        port += 1
        truth[n] = measure(n, o.model, o.out / f"truth{n}", port, o.steps, o.warmup, fid.CpuMeter, o.reuse)
        print(f"# measured {n} workers: {truth[n]['measured_us'] / 1e3:.2f} ms "
              f"(noise {truth[n]['noise_pct']:.0f}%, foreign cpu {truth[n]['foreign_cpu_pct']:.0f}%)", flush=True)
    for p in [int(x) for x in o.profiles.split(",")]:
        port += 1
        tdir = o.out / f"profile{p}"
        if not (o.reuse and tdir.exists()):
            torchrun(p, port, ["--model", o.model, "--steps", str(o.warmup + 6), "--warmup", str(o.warmup),
                               "--profile-dir", str(tdir), "--active", "5"])
        extra = (["--platform", str(plat)] if p == 1 else []) + ["--host-cores", str(o.host_cores)]
        pred = dpro("whatif", str(tdir), "--workers", o.targets, "--json", *extra)
        for pt in pred["scaling"]:
            n = pt["workers"]
            m = truth[n]["measured_us"]
            rows.append({"model": o.model, "network": "loopback", "profiled_workers": p, "workers": n,
                         "predicted_us": pt["iteration_us"], **truth[n],
                         "error_pct": 100 * (pt["iteration_us"] - m) / m, "transfer": pred["transfer"],
                         "profile_measured_us": pred["measured_iteration_us"]})
    print(f"{'case':28} {'pred ms':>9} {'meas ms':>9} {'err %':>7} {'noise %':>8} {'foreign %':>9} {'profile ms':>10}")
    for r in rows:
        case = f"{r['model']} {r['network']} P{r['profiled_workers']}->N{r['workers']}"
        print(f"{case:28} {r['predicted_us'] / 1e3:9.2f} {r['measured_us'] / 1e3:9.2f} {r['error_pct']:+7.1f} "
              f"{r['noise_pct']:8.1f} {r['foreign_cpu_pct'] or 0:9.0f} {r['profile_measured_us'] / 1e3:10.2f}")
    errs = sorted(abs(r["error_pct"]) for r in rows)
    if errs:
        print(f"median |error| {statistics.median(errs):.1f}%, max {errs[-1]:.1f}% over {len(errs)} cases "
              f"(machine: {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    (o.out / "results.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
