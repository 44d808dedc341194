"""How far an error in the clock offset moves the replay's prediction of coarse-collective jobs.

Traces recorded on one machine have one clock.  For each trace given, the first half of
the workers (by rank) are labelled hostA and the rest hostB, hostB's timestamps are moved
by D (µs), and the trace is replayed *without* alignment: the spread of the predictions is
what an offset error of up to |D| costs (docs/alignment.md, "Replay").  Gloo collectives
identify offsets only to a few ms on a 2-core machine; NCCL's to microseconds.

    python benchmarks/clock_sensitivity.py /tmp/fid/mlp-4r-nocap/trace /tmp/fid/convnet-4r-nocap/trace
    python benchmarks/clock_sensitivity.py --shifts-us -3000,0,3000 --json TRACE...

A trace directory is a gTrace or a directory of Kineto rank files (what
``benchmarks/fidelity/run.py`` keeps under ``<job>/trace``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def sensitivity(trace: Path, shifts_us: list[float]) -> dict:
    """Predicted iteration (µs) at each hostB shift, and the spread in points of the unshifted."""
    from dpro.alignment import shift_nodes
    from dpro.graph.global_dfg import BuildOptions
    from dpro.loader import open_trace
    from dpro.replayer.replay import replay

    gt = open_trace(trace)
    workers = sorted((nt.info.rank, n) for n, nt in gt.nodes.items() if nt.info.role == "worker")
    host_b = {n for _, n in workers[len(workers) // 2:]}
    pred = {}
    for d in shifts_us:
        shifted = shift_nodes(gt, {n: (d if n in host_b else 0.0) for n in gt.nodes})
        pred[d] = replay(shifted, BuildOptions(remove_overhead=True), align_clocks=False).predicted_iteration_us
    ref = pred.get(0.0) or next(iter(pred.values()))
    return {"trace": str(trace), "workers": len(workers), "predicted_us": pred,
            "spread_points": 100.0 * (max(pred.values()) - min(pred.values())) / ref}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--shifts-us", default="-6000,-3000,0,3000,6000", help="hostB shifts, µs (comma-separated)")
    ap.add_argument("--json", action="store_true", help="one JSON object per trace")
    a = ap.parse_args()
    shifts = [float(x) for x in a.shifts_us.split(",")]
    if not a.json:
        print(f"{'trace':40s} {'n':>2s} " + " ".join(f"{d / 1e3:+8.1f}ms" for d in shifts) + "   spread")
    for t in a.traces:
        r = sensitivity(t, shifts)
        if a.json:
            print(json.dumps(r))
            continue
        name = t.name if t.name != "trace" else t.parent.name
        cells = " ".join(f"{r['predicted_us'][d] / 1e3:10.2f}" for d in shifts)
        print(f"{name:40s} {r['workers']:2d} {cells}   {r['spread_points']:5.1f} pts")


if __name__ == "__main__":
    main()
