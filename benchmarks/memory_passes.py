"""Recomputation, gradient accumulation and mixed precision on real 2-rank DDP (gloo) jobs:
predicted vs measured.

    python benchmarks/memory_passes.py                 # every case
    python benchmarks/memory_passes.py --cases transformer-recompute --json out.json

For each case:

1. the job **as it is** runs under ``dpro profile``; from that trace dpro predicts the
   iteration time and peak memory of the job **with the change** (recomputation of the
   named blocks / k micro-batches / bf16 autocast) —
   :func:`dpro.optimizer.memory.fit.evaluate_memory`, the numbers ``dpro optimize
   --memory-budget`` decides with;
2. the job **with the change applied for real** (``torch.utils.checkpoint`` on the blocks /
   ``no_sync()`` accumulation, as ``dpro.apply`` does / forward and loss under
   ``torch.autocast("cpu", dtype=torch.bfloat16)``) runs twice without dpro:
   once under torch.profiler with ``profile_memory=True`` (the measured peak, rebuilt
   from the allocator's events as in benchmarks/memory_fidelity.py), once timed with
   ``perf_counter`` around each step (median over ranks and steps), in the same processes
   as the unchanged job, their steps alternating (``--time-ab``: the machine's drift
   between runs, up to ±30 % here, hits both alike); ``--repeats`` such runs, medians.

The profiled run pays the profiler's overhead, so its predicted times are compared in
absolute terms and as the ratio changed / unchanged (which cancels the overhead).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).absolute().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import memory_fidelity as mf  # noqa: E402

TIMED_STEPS = 12
#: profiled runs: enough warm-up calls for the recorder to measure its own overhead (>= 4)
PROFILE_WARMUP = 6
PROFILE_STEPS = ["--steps", str(PROFILE_WARMUP + mf.STEPS + 1)]

#: case -> (memory_fidelity config, blocks to recompute, micro-batches, bf16 autocast or "compile")
CASES: dict[str, tuple[str, tuple[str, ...], int, bool | str]] = {
    "transformer-recompute": ("transformer-adamw", ("encoder.layers.0", "encoder.layers.1", "encoder.layers.2"), 1, False),
    "transformer-accum2": ("transformer-adamw", (), 2, False),
    "mlp-accum2": ("mlp-sgdm", (), 2, False),
    "convnet-accum2": ("convnet-adam", (), 2, False),
    "mlp-amp": ("mlp-sgdm", (), 1, True),
    "convnet-amp": ("convnet-adam", (), 1, True),
    # the whole model under torch.compile, priced by the recorder's measurement (--measure-compile)
    "convnet-compile": ("convnet-adam", (), 1, "compile"),
    "transformer-compile": ("transformer-adamw", (), 1, "compile"),
}


def _run(cmd: list[str], what: str) -> None:
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    if r.returncode:
        raise SystemExit(f"{what} failed:\n{r.stderr[-3000:]}")


def _change_args(recompute: tuple[str, ...], k: int, amp: bool | str) -> list[str]:
    return [*(["--checkpoint", ",".join(recompute)] if recompute else []), "--accum", str(k),
            *(["--compile"] if amp == "compile" else ["--amp"] if amp else [])]


def _timed_ab(config: str, extra: list[str], out: Path) -> tuple[float, float]:
    """Median step µs of the unchanged and the changed job, run in the same processes with
    their steps alternating (memory_fidelity.py --time-ab)."""
    model, opt, set_to_none, view = mf.CONFIGS[config]
    _run(mf._job(["--time-ab", str(out), "--steps", str(mf.WARMUP + TIMED_STEPS), *extra], model, opt, set_to_none,
                 view), f"timing run {extra}")
    rows = [json.loads(f.read_text()) for f in sorted(out.glob("rank*.json"))]
    return (statistics.median([t for r in rows for t in r["a_us"]]),
            statistics.median([t for r in rows for t in r["b_us"]]))


def run_case(name: str, work: Path, repeats: int = 2) -> dict:
    from dpro.graph.global_dfg import BuildOptions
    from dpro.gtrace.io import load_gtrace
    from dpro.optimizer.memory.fit import evaluate_memory
    from dpro.optimizer.job_model import job_model
    from dpro.optimizer.strategy import Strategy
    from dpro.replayer.replay import replay

    config, recompute, k, amp = CASES[name]
    model, opt, set_to_none, view = mf.CONFIGS[config]
    d = work / name
    traces = d / "traces"
    _run([sys.executable, "-m", "dpro.cli", "profile", "--memory", "-o", str(traces), "--warmup", str(PROFILE_WARMUP), "--steps",
          str(mf.STEPS), "--force", *(["--measure-compile"] if amp == "compile" else []), "--",
          *mf._job(PROFILE_STEPS, model, opt, set_to_none, view)], "dpro profile")
    gt = load_gtrace(traces)
    rr = replay(gt, BuildOptions())
    jm = job_model(gt, rr.build.link_cost, rr.steps)
    base = Strategy.from_groups(jm.baseline_groups)
    p0 = evaluate_memory(jm, base)
    changed = base.with_memory(recompute, k)
    if amp == "compile":
        from dpro.optimizer.optimize import compiled_model_strategy

        changed = compiled_model_strategy(jm)
    elif amp:
        from dpro.optimizer.passes.base import PassContext
        from dpro.passes.mixed_precision import MixedPrecision

        changed = changed.with_scales(MixedPrecision().scales(PassContext(jm, changed, None)))  # type: ignore[arg-type]
    p1 = evaluate_memory(jm, changed)
    p1_interp = None
    if k > 1:  # the same job at batch/k too: micro-batch op times measured (dpro optimize --micro-trace)
        from dpro.optimizer.memory.micro_batch import attach_micro_trace

        bs = mf._build(model)[3]
        _run([sys.executable, "-m", "dpro.cli", "profile", "--memory", "-o", str(d / "traces-micro"), "--warmup", str(PROFILE_WARMUP),
              "--steps", str(mf.STEPS), "--force", "--",
              *mf._job(["--batch-size", str(bs // k), *PROFILE_STEPS], model, opt, set_to_none, view)],
             "dpro profile (micro-batch)")
        attach_micro_trace(jm, gt, load_gtrace(d / "traces-micro"))
        p1_interp = evaluate_memory(jm, changed)
    change = _change_args(recompute, k, amp)
    _run(mf._job(["--truth", str(d / "truth"), *change], model, opt, set_to_none, view), "measurement run")
    meas_peak = max(max(json.loads(f.read_text())["peaks"].values()) for f in (d / "truth").glob("rank*.json"))
    # both jobs in the same processes, steps alternating (the machine drifts by up to +-30 %
    # between runs here); medians over ``repeats`` such runs
    tb, tc = [], []
    for i in range(repeats):
        a, b = _timed_ab(config, change, d / f"time-ab{i}")
        tb.append(a)
        tc.append(b)
    t_base, t_change = statistics.median(tb), statistics.median(tc)
    return {
        "case": name, "recompute": list(recompute), "accumulation_steps": k, "amp": amp,
        "predicted_peak_bytes": p1.peak_bytes, "measured_peak_bytes": meas_peak,
        "peak_error_pct": 100.0 * (p1.peak_bytes - meas_peak) / meas_peak,
        "predicted_peak_unchanged_bytes": p0.peak_bytes,
        "predicted_us": p1.iteration_us, "measured_us": t_change,
        "predicted_interpolated_us": p1_interp.iteration_us if p1_interp else None,
        "predicted_interpolated_ratio": p1_interp.iteration_us / p0.iteration_us if p1_interp else None,
        "time_error_pct": 100.0 * (p1.iteration_us - t_change) / t_change,
        "predicted_unchanged_us": p0.iteration_us, "measured_unchanged_us": t_base,
        "predicted_ratio": p1.iteration_us / p0.iteration_us, "measured_ratio": t_change / t_base,
        "ratio_error_pct": 100.0 * ((p1.iteration_us / p0.iteration_us) / (t_change / t_base) - 1.0),
        "measured_unchanged_runs_us": tb, "measured_runs_us": tc,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    ap.add_argument("--repeats", type=int, default=2, help="timed runs (unchanged and changed alternating in each)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--work", type=Path, default=None, help="keep traces here (default: a temporary dir)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dpro-mempass-") as tmp:
        work = args.work or Path(tmp)
        print(f"{'case':<24} {'pred MB':>8} {'meas MB':>8} {'err %':>6} | {'pred ms':>8} {'meas ms':>8} {'err %':>6} | "
              f"{'pred x':>6} {'meas x':>6} {'err %':>6} | {'unchanged MB':>12}")
        for name in args.cases:
            t0 = time.perf_counter()
            r = run_case(name, work, args.repeats)
            rows.append(r)
            print(f"{name:<24} {r['predicted_peak_bytes'] / 1e6:>8.2f} {r['measured_peak_bytes'] / 1e6:>8.2f} "
                  f"{r['peak_error_pct']:>6.2f} | {r['predicted_us'] / 1e3:>8.2f} {r['measured_us'] / 1e3:>8.2f} "
                  f"{r['time_error_pct']:>6.1f} | {r['predicted_ratio']:>6.3f} {r['measured_ratio']:>6.3f} "
                  f"{r['ratio_error_pct']:>6.1f} | {r['predicted_peak_unchanged_bytes'] / 1e6:>12.2f}", flush=True)
            if r["predicted_interpolated_ratio"]:
                x = r["predicted_interpolated_ratio"]
                print(f"{'  with --micro-trace':<24} {'':>8} {'':>8} {'':>6} | "
                      f"{r['predicted_interpolated_us'] / 1e3:>8.2f} {r['measured_us'] / 1e3:>8.2f} "
                      f"{100 * (r['predicted_interpolated_us'] / r['measured_us'] - 1):>6.1f} | {x:>6.3f} "
                      f"{r['measured_ratio']:>6.3f} {100 * (x / r['measured_ratio'] - 1):>6.1f} |", flush=True)
            print(f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
