"""What-if validation of graph what-ifs on real one-process jobs: mixed precision (bf16
autocast on CPU) and a fused / foreach optimizer.

The plain job (``examples/whatif/train_variant.py --model MODEL``) is profiled
``--profiles`` times (it is memory-bound: one profile's times move with what the other core
does); ``dpro whatif TRACE --apply NAME --json`` predicts each variant from each, the
median is the prediction; each variant then runs
UNPROFILED ``--runs`` times, each right after a run of the plain job, timed by the
script itself (median step). Reports predicted vs measured and the machine's load (foreign CPU %).

The what-ifs' parameters are measured on this machine by microbenchmarks, never on the
variant runs: the autocast times by ``benchmarks/amp_calibration.py --model MODEL`` (the
model's own layer shapes; ``mixed_precision:absolute=1``), the optimizers' speed-ups by
``benchmarks/whatif/optimizer_calibration.py --model MODEL``.

    .venv/bin/python benchmarks/whatif/variants.py [--model mlp] [--out /tmp/dpro-whatif-variants]
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

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "whatif" / "train_variant.py"
#: variant -> (train_variant.py options, what-if to apply; {speedup}: optimizer_calibration.py's)
VARIANTS = {
    "amp-bf16": (["--amp"], "mixed_precision:absolute=1"),
    "sgd-foreach": (["--optimizer", "sgd-foreach"], "fused_optimizer:speedup={speedup}"),
    "sgd-fused": (["--optimizer", "sgd-fused"], "fused_optimizer:speedup={speedup}"),
}


def _fid():
    spec = importlib.util.spec_from_file_location("fidelity_run", REPO / "benchmarks" / "fidelity" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fidelity_run"] = mod
    spec.loader.exec_module(mod)
    return mod


def train(args: list[str], timing: Path | None = None) -> list[float]:
    cmd = [sys.executable, str(SCRIPT), *args] + (["--timing-out", str(timing)] if timing else [])
    subprocess.run(cmd, check=True, timeout=1200, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return json.loads(timing.read_text())["step_us"] if timing else []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--runs", type=int, default=2, help="unprofiled runs per variant, each after a run of the plain job")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--profiles", type=int, default=3,
                    help="profiles of the plain job (one after the other); the prediction is the median of theirs")
    ap.add_argument("--amp-factors", type=Path, default=None,
                    help="DPRO_AMP_FACTORS for the prediction (default: measured here by benchmarks/amp_calibration.py)")
    ap.add_argument("--optimizer-speedups", type=Path, default=None,
                    help="optimizer_calibration.py --json file (default: measured here first)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/dpro-whatif-variants"))
    o = ap.parse_args()
    fid = _fid()
    o.out.mkdir(parents=True, exist_ok=True)
    base = ["--model", o.model, "--steps", str(o.steps), "--warmup", str(o.warmup)]
    traces = [o.out / f"plain{k}" for k in range(o.profiles)]
    for trace in traces:
        if not trace.exists():
            train([*base, "--profile-dir", str(trace)])
    factors = o.amp_factors or o.out / "amp_factors.json"
    if not factors.exists():  # the pass's factors are this machine's, not the defaults (another CPU)
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "amp_calibration.py"), "--repeats", "5",
                        "--model", o.model, "--json", str(factors)], check=True, capture_output=True, timeout=1800,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    speedups = o.optimizer_speedups or o.out / "optimizer_speedups.json"
    if not speedups.exists():
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "whatif" / "optimizer_calibration.py"),
                        "--model", o.model, "--json", str(speedups)], check=True, capture_output=True,
                       timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    speedup = json.loads(speedups.read_text())["speedup"]
    env = dict(os.environ, PYTHONPATH=str(REPO), DPRO_AMP_FACTORS=str(factors))
    rows = []
    for name in o.variants.split(","):
        opts, spec = VARIANTS[name]
        spec = spec.format(speedup=speedup.get(name, 1.0))
        meter = fid.CpuMeter()
        preds = [json.loads(subprocess.run([sys.executable, "-m", "dpro.cli", "whatif", str(t), "--apply", spec,
                                            "--json"], check=True, capture_output=True, text=True, env=env).stdout)
                 for t in traces]
        pred = {k: statistics.median(x[k] for x in preds) for k in ("predicted_iteration_us", "baseline_iteration_us")}
        steps, plain, per_run = [], [], []
        for k in range(o.runs):  # interleaved plain / variant: the machine's drift hits both sides alike
            pl = train(base, o.out / f"plain_{name}_{k}.json")
            va = train([*base, *opts], o.out / f"{name}_{k}.json")
            plain += pl
            steps += va
            per_run.append(statistics.median(va))
        meas = statistics.median(steps)
        q = statistics.quantiles(steps, n=4)
        rows.append({"variant": name, "whatif": spec, "predicted_us": pred["predicted_iteration_us"],
                     "baseline_predicted_us": pred["baseline_iteration_us"], "measured_us": meas,
                     "plain_measured_us": statistics.median(plain),
                     "error_pct": 100 * (pred["predicted_iteration_us"] - meas) / meas,
                     # against the drift of a shared machine: the change, each side against its own baseline
                     "predicted_ratio": pred["predicted_iteration_us"] / pred["baseline_iteration_us"],
                     "measured_ratio": meas / statistics.median(plain),
                     "noise_pct": 100 * (q[2] - q[0]) / meas, "run_medians_us": per_run,
                     "foreign_cpu_pct": meter.foreign_pct(), "load_avg_1m": os.getloadavg()[0]})
    print(f"{'variant':14} {'what-if':30} {'pred ms':>9} {'meas ms':>9} {'err %':>7} {'plain ms':>9} "
          f"{'pred x':>7} {'meas x':>7} {'noise %':>8} {'foreign %':>9}")
    for r in rows:
        print(f"{r['variant']:14} {r['whatif']:30} {r['predicted_us'] / 1e3:9.2f} {r['measured_us'] / 1e3:9.2f} "
              f"{r['error_pct']:+7.1f} {r['plain_measured_us'] / 1e3:9.2f} {r['predicted_ratio']:7.3f} "
              f"{r['measured_ratio']:7.3f} {r['noise_pct']:8.1f} {r['foreign_cpu_pct'] or 0:9.0f}")
    print(f"({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    (o.out / "results.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from boost import boosted

    with boosted() as on:  # the measured jobs before other sessions' work (autogroup nice)
        print(f"# measured jobs boosted: {'yes' if on else 'no'}", file=sys.stderr, flush=True)
        main()
