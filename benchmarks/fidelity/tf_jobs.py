"""Fidelity on real TensorFlow 2 + Horovod (gloo) jobs, ground truth from separate runs.

For each job (model x workers): ``--profiled`` runs under `dpro profile` (each replayed by
`dpro replay --json`; medians) and ``--truth`` runs of the same script with the recorder off
(``DPRO_DISABLE=1``), interleaved, timed by the script itself (examples/tensorflow/hvd_recorder.py: wall clock per
step). Measured = median over runs of the per-run median step after the warm-up (mean over
workers). Separate runs, not the steps after the window of the profiled run: on this VM
the machine's speed drifts within a run (docs/fidelity.md).

    .venv/bin/python benchmarks/fidelity/tf_jobs.py [--truth 3] [--profiled 3] [--jobs convnet-2w] [--json]

Jobs ``*-cap200`` put each worker in its own network namespace with a 200 Mbit/s tbf cap
on its link (benchmarks/fidelity/hvd_netns.py; needs root).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from ps_jobs import fidelity_row, run, work_dir

REPO = Path(__file__).resolve().parents[2]
TF = REPO / ".venv-tf" / "bin"
#: (model, workers, bandwidth cap in Mbit/s per direction of every worker's link, or None: loopback)
JOBS = [(m, w, None) for m in ("convnet", "transformer") for w in (2, 4)] + [(m, 2, 200.0) for m in ("convnet", "transformer")]
WARMUP, STEPS, TOTAL = 5, 5, 30  # 20 calls after the window: the recorder's settled unprofiled pace
HVD_NETNS = Path(__file__).resolve().parent / "hvd_netns.py"


def job_name(m: str, w: int, cap: float | None) -> str:
    return f"{m}-{w}w" + (f"-cap{cap:g}" if cap else "")


def job_cmd(m: str, w: int, timing: Path, cap: float | None = None) -> list[str]:
    """Loopback: horovodrun. Capped: each worker in its own network namespace behind a tbf cap
    (hvd_netns.py, root; one TF thread pool of 1 per worker, as on loopback with 2 workers)."""
    script = [str(TF / "python"), "examples/tensorflow/hvd_recorder.py", "--model", m, "--steps", str(TOTAL),
              "--timing-out", str(timing)]
    if cap:
        return [str(TF / "python"), str(HVD_NETNS), "--np", str(w), "--rate-mbit", f"{cap:g}", "--",
                *script, "--threads", "1"]
    return [str(TF / "horovodrun"), "-np", str(w), "--gloo", "-H", f"localhost:{w}", *script]


def measured_us(prefix: Path) -> float:
    per = [json.loads(p.read_text())["step_us"][WARMUP:] for p in sorted(prefix.parent.glob(prefix.name + ".*.json"))]
    return statistics.median(statistics.mean(v) for v in zip(*per))


def one(m: str, w: int, cap: float | None, truth: int, profiled: int, tmp: Path) -> dict:
    d = tmp / job_name(m, w, cap)
    d.mkdir()
    preds, traces, truths, unprof = [], [], [], []
    for i in range(max(truth, profiled)):
        if i < profiled:
            run([str(TF / "dpro"), "profile", "-o", str(d / f"trace{i}"), "--warmup", str(WARMUP), "--steps",
                 str(STEPS), "--", *job_cmd(m, w, d / f"prof{i}", cap)])
            rep = json.loads(run([str(TF / "dpro"), "replay", str(d / f"trace{i}"), "--json"]).stdout)
            preds.append(rep["predicted_iteration_us"])
            traces.append(rep["measured_iteration_us"])
            # the recorder's own overhead taken off (None when it measured none)
            unprof.append(rep.get("predicted_unprofiled_iteration_us") or rep["predicted_iteration_us"])
        if i < truth:
            run(job_cmd(m, w, d / f"truth{i}", cap), env={**os.environ, "DPRO_DISABLE": "1"})
            truths.append(measured_us(d / f"truth{i}"))
    meas, pred, trace = statistics.median(truths), statistics.median(preds), statistics.median(traces)
    pu = statistics.median(unprof)
    return fidelity_row(job_name(m, w, cap), pred, trace, meas, truth_runs_us=truths, trace_runs_us=traces,
                        predicted_runs_us=preds, predicted_unprofiled_us=pu,
                        error_unprofiled_pct=100 * (pu - meas) / meas)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--truth", type=int, default=2, help="unprofiled runs per job")
    ap.add_argument("--profiled", type=int, default=1, help="profiled runs per job")
    ap.add_argument("--jobs", default=None,
                    help="comma-separated job names, e.g. convnet-2w,transformer-2w-cap200 (default: all; capped jobs need root)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the traces, timings and results.json in this directory")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    want = set(a.jobs.split(",")) if a.jobs else None
    rows = []
    with work_dir(a.keep, "dpro-tffid-") as tmp:
        for m, w, cap in JOBS:
            if want and job_name(m, w, cap) not in want:
                continue
            rows.append(one(m, w, cap, a.truth, a.profiled, Path(tmp)))
            if a.keep is not None:  # what is done so far survives an interrupted run
                (a.keep / "results.json").write_text(json.dumps(rows, indent=1))
            if not a.json:
                r = rows[-1]
                print(f"{r['job']:<14} measured {r['measured_us'] / 1e3:7.2f} ms  trace {r['trace_us'] / 1e3:7.2f} ms  "
                      f"predicted {r['predicted_us'] / 1e3:7.2f} ms  error {r['error_pct']:+6.1f}%  "
                      f"vs trace {r['vs_trace_pct']:+6.1f}%  overhead {r['overhead_pct']:+6.1f}%  "
                      f"| overhead removed: predicted {r['predicted_unprofiled_us'] / 1e3:7.2f} ms  "
                      f"error {r['error_unprofiled_pct']:+6.1f}%", flush=True)
    med = statistics.median(abs(r["error_pct"]) for r in rows)
    med_u = statistics.median(abs(r["error_unprofiled_pct"]) for r in rows)
    if a.json:
        print(json.dumps({"rows": rows, "median_abs_error_pct": med, "median_abs_error_unprofiled_pct": med_u},
                         indent=1))
    else:
        print(f"median |error| vs measured {med:.1f}% (overhead removed: {med_u:.1f}%)")


if __name__ == "__main__":
    main()
