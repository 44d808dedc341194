"""Per-op durations from the profiled steps.

For op o in step s, with P = the latest end of o's DFG predecessors in s (the step start
for ops without predecessors): ``gap = max(0, ts - P)`` is host time before o could
start, ``dur = end - max(ts, P)`` is o's own time (time overlapped with a predecessor,
e.g. a collective that began before its peers joined, is not o's own).  The replayer
charges ``gap + dur``, so replaying one profiled step with its own values reproduces the
step exactly when the DFG holds every binding dependency.  Across steps we take the
**mean** over a robust selection of steps (:func:`typical_steps`): a mean, because the
sum of means along a path is the mean of the sums (taking each op's median, or a per-op
trimmed mean, underestimates an iteration in which every step is slowed somewhere else);
whole steps, not per-op samples, are dropped (stalls) and trimmed, so that outlier steps
do not move it.  The measured iteration time uses the same steps.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from dpro.gtrace.schema import NodeTrace


@dataclass(slots=True)
class OpStats:
    """An op's mean own time and host gap over the steps, its start offset, its samples."""

    dur: float
    gap: float
    #: median start offset from the step start (FIFO tie-break, timelines)
    offset: float
    #: per-step samples: step -> (ts, end, P)
    samples: dict[int, tuple[float, float, float]]


TRIM = 0.2
#: a step in which some node took more than this times the median step is a stall
STALL = 1.5


def typical_steps(nodes: list[NodeTrace], steps: list[int], trim: float = TRIM, stall: float = STALL) -> list[int]:
    """``steps`` without stalls, then without the ``floor(trim * n)`` slowest and fastest.

    A stall (the VM or the OS took a process off its core for hundreds of ms) shows in two
    steps, not one: the stalled node's and, its peers' steps being staggered, the step in
    which the others waited for it, each at half weight in the mean over nodes. So stalls
    are found by the slowest node of a step: above ``stall`` x the median of that, dropped
    (at most half the steps, by the median's definition); then the trim, by the mean.
    """
    if not steps:
        return []
    peak = {s: max([nt.steps[s][1] for nt in nodes if s in nt.steps] or [0.0]) for s in steps}
    limit = stall * float(np.median(list(peak.values())))
    steps = [s for s in steps if peak[s] <= limit]
    dur = {s: float(np.mean([nt.steps[s][1] for nt in nodes if s in nt.steps] or [0.0])) for s in steps}
    order = sorted(steps, key=lambda s: (dur[s], s))
    k = int(trim * len(order))
    return sorted(order[k : len(order) - k])


def node_stats(nt: NodeTrace, steps: list[int] | None = None) -> dict[str, OpStats]:
    """Mean ``dur``/``gap`` of every op of a node over ``steps`` (default: all)."""
    use = set(steps) if steps else set(nt.steps)
    ev: dict[tuple[str, int], tuple[float, float]] = {}
    for e in nt.events:
        if e.step in use:
            ev[(e.op, e.step)] = (e.ts, e.ts + e.dur)
    preds: dict[str, list[str]] = defaultdict(list)
    for a, b in nt.edges:
        preds[b].append(a)
    out: dict[str, OpStats] = {}
    for op in nt.ops:
        samples = {}
        for s in use:
            x = ev.get((op, s))
            if x is None:
                continue
            ts, end = x
            p = [ev[(q, s)][1] for q in preds.get(op, ()) if (q, s) in ev]
            P = max(p) if p else nt.steps[s][0] if s in nt.steps else ts
            samples[s] = (ts, end, P)
        if not samples:
            out[op] = OpStats(0.0, 0.0, 0.0, {})
            continue
        arr = np.array(list(samples.values()))
        ts, end, P = arr[:, 0], arr[:, 1], arr[:, 2]
        starts = np.array([nt.steps[s][0] if s in nt.steps else 0.0 for s in samples])
        out[op] = OpStats(
            dur=float(np.mean(np.maximum(0.0, end - np.maximum(ts, P)))),
            gap=float(np.mean(np.maximum(0.0, ts - P))),
            offset=float(np.median(ts - starts)),
            samples=samples,
        )
    return out


def measured_iteration_us(nodes: list[NodeTrace], steps: list[int]) -> float | None:
    """Mean over ``steps`` and nodes of the step duration (the framework's own marker).

    Not the slowest node's: steps run back to back, so in steady state every node's mean
    step time is the iteration time, but in any one step the ranks are staggered and the
    one that started earliest (and waited in the first collective) looks slowest; the
    per-step maximum is biased upwards by that jitter.
    """
    per_step = []
    for s in steps:
        durs = [nt.steps[s][1] for nt in nodes if s in nt.steps]
        if durs:
            per_step.append(float(np.mean(durs)))
    return float(np.mean(per_step)) if per_step else None
