"""Fidelity on the public torch.profiler corpus (docs/fidelity.md, "GPU traces").

For every set of ``../shared/traces/corpus`` (or ``--corpus``) with CPU-side ProfilerStep
spans: the measured step (per step number the mean CPU ProfilerStep over the set's ranks,
then the median over steps, read from the raw JSON), ``dpro replay``'s prediction and its
error, the steps it replayed, and the collectives it modelled. Where the replay keeps
three steps or more, the leave-one-out check: each step s is predicted from the op
statistics (and any fitted link cost) of the other steps only, and compared with step s's
own mean CPU step; the mean and largest |error| are printed.

    python benchmarks/fidelity/kineto_corpus.py
    python benchmarks/fidelity/kineto_corpus.py --json --sets param_dlrm_8rank
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

from dpro.errors import DproInputError  # noqa: E402
from dpro.graph.global_dfg import BuildOptions  # noqa: E402
from dpro.importers.kineto import import_kineto  # noqa: E402
from dpro.replayer.replay import replay  # noqa: E402
from kineto_steps import measured_steps  # noqa: E402

def evaluate(folder: Path) -> dict | None:
    steps = measured_steps(folder)
    if not steps:
        return None
    row: dict = {"set": folder.name, "ranks": sum(1 for f in folder.iterdir() if f.name.endswith((".json", ".json.gz"))),
                 "measured_median_us": statistics.median(steps.values())}
    try:
        gt = import_kineto(folder, progress=False)
    except DproInputError as e:
        row["error"] = str(e)
        return row
    res = replay(gt)
    row |= {"predicted_us": res.predicted_iteration_us, "replay_measured_us": res.measured_iteration_us,
            "error_pct": 100 * (res.predicted_iteration_us - row["measured_median_us"]) / row["measured_median_us"],
            "steps": res.steps, "expanded": res.build.expanded, "measured_collectives": res.build.kept_coarse}
    kept = list(gt.manifest.steps)
    if len(kept) >= 3:
        errs = []
        for s in kept:
            others = [x for x in kept if x != s]
            p = replay(gt, BuildOptions(steps=others)).predicted_iteration_us
            errs.append(100 * (p - steps[s]) / steps[s])
        row["loo_mean_abs_pct"] = statistics.mean(abs(e) for e in errs)
        row["loo_max_abs_pct"] = max(abs(e) for e in errs)
        row["loo_steps"] = len(kept)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "traces" / "corpus")
    ap.add_argument("--sets", nargs="*", help="only these sets")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for d in sorted(p for p in a.corpus.iterdir() if p.is_dir()):
        if a.sets and d.name not in a.sets:
            continue
        r = evaluate(d)
        if r is None:
            continue
        rows.append(r)
        if not a.json:
            if "error" in r:
                print(f"{r['set']:30s} refused: {r['error'][:90]}", flush=True)
                continue
            loo = (f"  LOO over {r['loo_steps']} steps: mean |err| {r['loo_mean_abs_pct']:.1f} %, "
                   f"max {r['loo_max_abs_pct']:.1f} %") if "loo_steps" in r else ""
            print(f"{r['set']:30s} ranks {r['ranks']}  measured {r['measured_median_us'] / 1e3:10.2f} ms  predicted "
                  f"{r['predicted_us'] / 1e3:10.2f} ms  {r['error_pct']:+7.1f} %  steps {r['steps']}  "
                  f"collectives expanded {r['expanded']}, measured {r['measured_collectives']}{loo}", flush=True)
    if a.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
