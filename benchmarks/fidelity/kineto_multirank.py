"""Fidelity on real multi-rank torch.profiler traces recorded here (docs/fidelity.md,
"Multi-rank CPU jobs recorded with torch.profiler").

Each RUN directory is what ``examples/kineto_multirank/{tp_dp,pipeline}.py RUN`` wrote:
``trace/`` (one torch.profiler file per rank) and ``timing.json`` (the same job's steps
unprofiled, timed by the script's own perf_counter after a barrier). Prints per run:

* measured (trace): per step number the mean CPU ProfilerStep over the ranks, then the
  median over steps (read from the raw JSON, not from dpro);
* measured (unprofiled): per timed step the mean over ranks, then the median over steps;
* dpro's prediction (collectives and p2p transfers on the model) and its error against both;
* leave-one-out: each kept step s replayed from its own op statistics with alpha/beta
  fitted on the other steps only, against step s's measured mean CPU step: mean and
  largest |error|.

    python benchmarks/fidelity/kineto_multirank.py RUN [RUN ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dpro.graph.global_dfg import BuildOptions, build_global_dfg  # noqa: E402
from dpro.importers.kineto import import_kineto  # noqa: E402
from dpro.replayer.replay import replay  # noqa: E402
from kineto_steps import measured_steps  # noqa: E402


def loo_errors(gt, measured: dict[int, float]) -> list[float]:
    """% error of each kept step replayed with alpha/beta fitted on the other steps."""
    kept = list(gt.manifest.steps)
    errs = []
    for s in kept:
        others = [x for x in kept if x != s]
        _, fit = build_global_dfg(gt, BuildOptions(steps=others))
        if fit.link_cost is None:
            continue
        p = replay(gt, BuildOptions(steps=[s], link_cost=fit.link_cost, group_costs=fit.group_costs))
        errs.append(100 * (p.predicted_iteration_us - measured[s]) / measured[s])
    return errs


def evaluate(run: Path) -> dict:
    steps = measured_steps(run / "trace")
    timing = json.loads((run / "timing.json").read_text())["step_us_per_rank"]
    unprof = statistics.median(statistics.mean(v) for v in zip(*timing))
    gt = import_kineto(run / "trace", progress=False)
    res = replay(gt)
    meas = statistics.median(steps.values())
    loo = loo_errors(gt, steps)
    return {"run": str(run), "ranks": len(gt.nodes), "steps": res.steps, "measured_trace_us": meas,
            "measured_unprofiled_us": unprof, "predicted_us": res.predicted_iteration_us,
            "error_vs_trace_pct": 100 * (res.predicted_iteration_us - meas) / meas,
            "error_vs_unprofiled_pct": 100 * (res.predicted_iteration_us - unprof) / unprof,
            "expanded": res.build.expanded, "measured_collectives": res.build.kept_coarse,
            "loo_mean_abs_pct": statistics.mean(abs(e) for e in loo) if loo else None,
            "loo_max_abs_pct": max(abs(e) for e in loo) if loo else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for run in a.runs:
        r = evaluate(run)
        rows.append(r)
        if not a.json:
            loo = (f"  LOO mean |err| {r['loo_mean_abs_pct']:.1f} %, max {r['loo_max_abs_pct']:.1f} %"
                   if r["loo_mean_abs_pct"] is not None else "")
            print(f"{run}: measured {r['measured_trace_us'] / 1e3:.2f} ms (trace), "
                  f"{r['measured_unprofiled_us'] / 1e3:.2f} ms (unprofiled)  predicted {r['predicted_us'] / 1e3:.2f} ms  "
                  f"{r['error_vs_trace_pct']:+.1f} % / {r['error_vs_unprofiled_pct']:+.1f} %  steps {r['steps']}  "
                  f"expanded {r['expanded']}, measured {r['measured_collectives']}{loo}", flush=True)
    if a.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
