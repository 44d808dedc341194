"""Fidelity on real parameter-server jobs: MXNet 1.9.1 dist_sync over ps-lite, loopback.

For each job (model x workers x servers): one run under `dpro profile` (the trace; replayed
by `dpro replay --json`) and ``--truth`` runs with the recorder switched off
(``DPRO_DISABLE=1``, so MXNet keeps its default bulked execution), timed by the training
script itself (examples/mxnet/train_ps.py: wall clock per step, ending in ``waitall``).
Measured = median over runs of the per-run median step (mean over workers), steps after the
warm-up. Prints predicted vs measured, predicted vs the trace's own steps, and the
profiling overhead (trace vs measured); then, apart, the overhead the recorder measured
itself (its step walls, warm-up vs window: dpro.replayer.overhead) and the prediction with
it removed (``predicted_unprofiled_iteration_us``; n/a when none was removed).

    .venv/bin/python benchmarks/fidelity/ps_jobs.py [--truth 2] [--jobs mlp-2w1s,conv-4w2s] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MX = REPO / ".venv-mx" / "bin"
JOBS = [(m, w, s) for m in ("mlp", "conv") for w in (2, 4) for s in (1, 2)]
WARMUP, STEPS = 12, 8  # 12 warm-up calls: the recorder needs a settled warm-up pace (overhead)


def name(m: str, w: int, s: int) -> str:
    return f"{m}-{w}w{s}s"


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: int = 400) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd[:6])} ...: exit {r.returncode}: {(r.stdout + r.stderr)[-1500:]}")
    return r


def job_cmd(m: str, w: int, s: int, timing: Path, steps: int) -> list[str]:
    return [str(MX / "python"), "examples/mxnet/launch_local.py", "-n", str(w), "-s", str(s), "--timeout", "300",
            "--", "examples/mxnet/train_ps.py", "--model", m, "--steps", str(steps), "--timing-out", str(timing)]


def measured_us(timing: Path, skip: int) -> float:
    per = [json.loads(p.read_text())["step_us"][skip:] for p in sorted(timing.glob("timing_rank*.json"))]
    return statistics.median(statistics.mean(v) for v in zip(*per))


def fidelity_row(job: str, pred: float, trace: float, meas: float, **extra: object) -> dict:
    """One table row: predicted vs measured (unprofiled) and vs the trace, profiling overhead."""
    return {"job": job, "predicted_us": pred, "trace_us": trace, "measured_us": meas,
            "error_pct": 100 * (pred - meas) / meas, "vs_trace_pct": 100 * (pred - trace) / trace,
            "overhead_pct": 100 * (trace - meas) / meas, **extra}


def one(m: str, w: int, s: int, truth: int, tmp: Path) -> dict:
    d = tmp / name(m, w, s)
    run([str(MX / "dpro"), "profile", "-o", str(d / "trace"), "--warmup", str(WARMUP), "--steps", str(STEPS), "--",
         *job_cmd(m, w, s, d / "timing_prof", WARMUP + STEPS + 2)])
    rep = json.loads(run([str(MX / "dpro"), "replay", str(d / "trace"), "--json"]).stdout)
    truths = []
    for i in range(truth):
        run(job_cmd(m, w, s, d / f"timing_{i}", WARMUP + 15), env={**os.environ, "DPRO_DISABLE": "1"})
        truths.append(measured_us(d / f"timing_{i}", WARMUP))
    meas = statistics.median(truths)
    pred, trace = rep["predicted_iteration_us"], rep["measured_iteration_us"]
    ov = rep.get("profiling_overhead") or {}
    return fidelity_row(name(m, w, s), pred, trace, meas, truth_runs_us=truths,
                        recorder_overhead_pct=ov.get("overhead_pct"),
                        predicted_overhead_removed_us=rep.get("predicted_unprofiled_iteration_us"))


def _pct(x: float | None) -> str:
    return "   n/a" if x is None else f"{x:+5.1f}%"


def _ms(x: float | None) -> str:
    return "    n/a" if x is None else f"{x / 1e3:7.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--truth", type=int, default=2, help="unprofiled runs per job")
    ap.add_argument("--jobs", default=None, help="comma-separated job names (default: all 8)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    want = set(a.jobs.split(",")) if a.jobs else None
    rows = []
    with tempfile.TemporaryDirectory(prefix="dpro-psfid-") as tmp:
        for m, w, s in JOBS:
            if want and name(m, w, s) not in want:
                continue
            rows.append(one(m, w, s, a.truth, Path(tmp)))
            if not a.json:
                r = rows[-1]
                print(f"{r['job']:<12} measured {r['measured_us'] / 1e3:7.2f} ms  trace {r['trace_us'] / 1e3:7.2f} ms  "
                      f"predicted {r['predicted_us'] / 1e3:7.2f} ms  error {r['error_pct']:+6.1f}%  "
                      f"vs trace {r['vs_trace_pct']:+6.1f}%  overhead {r['overhead_pct']:+6.1f}%  "
                      f"| recorder's overhead {_pct(r['recorder_overhead_pct'])}  "
                      f"predicted w/o it {_ms(r['predicted_overhead_removed_us'])}", flush=True)
    med = statistics.median(abs(r["error_pct"]) for r in rows)
    med_t = statistics.median(abs(r["vs_trace_pct"]) for r in rows)
    if a.json:
        print(json.dumps({"rows": rows, "median_abs_error_pct": med, "median_abs_vs_trace_pct": med_t}, indent=1))
    else:
        print(f"median |error| vs measured {med:.1f}%, vs trace {med_t:.1f}%")


if __name__ == "__main__":
    main()
