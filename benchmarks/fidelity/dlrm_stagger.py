"""PARAM's DLRM (8 ranks, one profiled step each): what the ranks' staggered starts do to
the replay (docs/kineto.md, "Single-step traces: staggered ranks"; issue #26).

The ranks' ProfilerStep spans start up to 7.5 ms apart on one clock and end within 1 ms
(the all-to-alls and all-reduces hold them together). ``dpro replay`` starts every rank at
0. This experiment replays the same job a second time with each rank held back by its
observed start offset (a delay op before its first ops; the trace's clocks are one host's)
and prints, per rank, its measured CPU step, the replay's span of that rank (its last op's
end, minus its offset), and the errors. It changes nothing in dpro.

    python benchmarks/fidelity/dlrm_stagger.py [--set DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from dpro.gtrace.schema import Event, GTrace, Op  # noqa: E402
from dpro.importers.kineto import import_kineto  # noqa: E402
from dpro.replayer.replay import ReplayResult, replay  # noqa: E402

DEFAULT = REPO.parent / "shared" / "traces" / "corpus" / "param_dlrm_8rank"
OFFSET = "STAGGER_OFFSET@cpu:main"


def rank_ends(res: ReplayResult) -> dict[str, float]:
    """The replayed end of each worker's last op (µs from the replay's start)."""
    g, s = res.graph, res.schedule
    ends: dict[str, float] = {}
    for i in range(g.n):
        o = g.owners[g.device_owner[g.device[i]]]
        ends[o] = max(ends.get(o, 0.0), float(s.end[i]))
    return ends


def hold_back(gt: GTrace, step: int, offsets: dict[str, float]) -> None:
    """Prepend to every node a delay op of its offset, before every op without a predecessor."""
    for name, nt in gt.nodes.items():
        heads = [o for o in nt.ops if o not in {b for _, b in nt.edges}]
        nt.ops = {OFFSET: Op(id=OFFSET, name="STAGGER_OFFSET", cat="OTHER", device="cpu:main"), **nt.ops}
        nt.edges = sorted(set(nt.edges) | {(OFFSET, o) for o in heads})
        nt.events.insert(0, Event(op=OFFSET, step=step, ts=nt.steps[step][0], dur=offsets[name]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", type=Path, default=DEFAULT, help="a multi-rank trace directory with one step per rank")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    gt = import_kineto(args.set, progress=False)
    if len(gt.manifest.steps) != 1:
        sys.exit(f"{args.set}: {len(gt.manifest.steps)} common steps; this experiment is for one-step traces")
    step = gt.manifest.steps[0]
    together = replay(gt)
    starts = {n: nt.steps[step][0] for n, nt in gt.nodes.items()}
    measured = {n: nt.steps[step][1] for n, nt in gt.nodes.items()}
    offsets = {n: s - min(starts.values()) for n, s in starts.items()}
    hold_back(gt, step, offsets)
    staggered = replay(gt)
    ends0, ends1 = rank_ends(together), rank_ends(staggered)
    rows = [{"node": n, "offset_us": offsets[n], "measured_us": measured[n], "together_us": ends0[n],
             "staggered_us": ends1[n] - offsets[n]} for n in sorted(gt.nodes)]
    last = max(rows, key=lambda r: r["offset_us"])
    mean_cpu = statistics.mean(measured.values())
    out = {
        "set": str(args.set), "step": step, "mean_cpu_step_us": mean_cpu,
        "together_makespan_us": together.predicted_iteration_us,
        "together_error_vs_mean": together.predicted_iteration_us / mean_cpu - 1,
        "together_error_vs_last_rank": together.predicted_iteration_us / last["measured_us"] - 1,
        "together_mean_span_us": statistics.mean(r["together_us"] for r in rows),
        "together_max_rank_error": max(abs(r["together_us"] / r["measured_us"] - 1) for r in rows),
        "staggered_makespan_us": staggered.predicted_iteration_us,
        "staggered_mean_span_us": statistics.mean(r["staggered_us"] for r in rows),
        "staggered_error_vs_mean": statistics.mean(r["staggered_us"] for r in rows) / mean_cpu - 1,
        "staggered_last_rank_error": last["staggered_us"] / last["measured_us"] - 1,
        "staggered_max_rank_error": max(abs(r["staggered_us"] / r["measured_us"] - 1) for r in rows),
        "ranks": rows,
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{'node':8} {'offset ms':>9} {'measured':>9} {'together':>9} {'staggered':>9}")
    for r in rows:
        print(f"{r['node']:8} {r['offset_us'] / 1e3:9.2f} {r['measured_us'] / 1e3:9.2f} {r['together_us'] / 1e3:9.2f} "
              f"{r['staggered_us'] / 1e3:9.2f}")
    print(f"mean CPU step {mean_cpu / 1e3:.2f} ms; replay (all ranks at 0): {together.predicted_iteration_us / 1e3:.2f} ms "
          f"({out['together_error_vs_mean']:+.1%} vs the mean, {out['together_error_vs_last_rank']:+.1%} vs the last "
          f"rank's step {last['measured_us'] / 1e3:.2f} ms)")
    print(f"replay (all ranks at 0): mean rank span {out['together_mean_span_us'] / 1e3:.2f} ms, largest per-rank "
          f"|error| {out['together_max_rank_error']:.1%}")
    print(f"staggered replay: makespan {staggered.predicted_iteration_us / 1e3:.2f} ms; mean rank span {out['staggered_mean_span_us'] / 1e3:.2f} ms "
          f"({out['staggered_error_vs_mean']:+.1%} vs the mean, offsets given); last rank {last['node']} "
          f"{out['staggered_last_rank_error']:+.1%}; largest per-rank |error| {out['staggered_max_rank_error']:.1%}")


if __name__ == "__main__":
    main()
