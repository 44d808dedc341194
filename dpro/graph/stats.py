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
from operator import attrgetter, itemgetter
from dataclasses import dataclass

import numpy as np

from dpro.gtrace.schema import GPU_PERIOD_META, NodeTrace


@dataclass(slots=True)
class OpStats:
    """An op's mean own time and host gap over the steps, its start offset, its samples."""

    dur: float
    gap: float
    #: median start offset from the step start (FIFO tie-break, timelines)
    offset: float
    #: per-step samples: step -> (ts, end, P)
    samples: dict[int, tuple[float, float, float]]


_OP, _STEP, _TS, _DUR = attrgetter("op"), attrgetter("step"), attrgetter("ts"), attrgetter("dur")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)

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
    stalls = set(stalled_steps(nodes, steps, stall))
    steps = [s for s in steps if s not in stalls]
    dur = {s: float(np.mean([nt.steps[s][1] for nt in nodes if s in nt.steps] or [0.0])) for s in steps}
    order = sorted(steps, key=lambda s: (dur[s], s))
    k = int(trim * len(order))
    return sorted(order[k : len(order) - k])


def stalled_steps(nodes: list[NodeTrace], steps: list[int], stall: float = STALL) -> list[int]:
    """The steps :func:`typical_steps` leaves out as stalls: those whose slowest node took
    more than ``stall`` x the median over ``steps`` of the slowest node's step."""
    if not steps:
        return []
    peak = {s: max([nt.steps[s][1] for nt in nodes if s in nt.steps] or [0.0]) for s in steps}
    limit = stall * _median(list(peak.values()))
    return [s for s in steps if peak[s] > limit]


def _median(values: list[float]) -> float:
    """``float(np.median(values))`` of finite values, bit for bit, without numpy's NaN
    check (its first call imports ``numpy.ma``, ~20 ms)."""
    v = sorted(values)
    k = len(v) // 2
    return float(v[k]) if len(v) % 2 else (v[k - 1] + v[k]) / 2.0


def node_stats(nt: NodeTrace, steps: list[int] | None = None) -> dict[str, OpStats]:
    """Mean ``dur``/``gap`` of every op of a node over ``steps`` (default: all).

    Vectorised over the ops and the steps: the events in ``steps`` go into an (ops, steps)
    table, each op's ``P`` is the maximum of its predecessors' ends over the edges (one
    numpy reduction), and the ops with the same number of samples are reduced together
    (one numpy mean over an ``(ops, samples)`` array, each row summed in the same order
    and by the same pairwise sum as a 1-D mean of that op alone; the median as
    ``np.median`` takes it), so the results are bit-identical to one op at a time
    (tests/test_node_stats.py). A node with two events of one op in one step (the last
    one counts) takes :func:`_node_stats_per_op`, the same definition one op at a time.
    """
    use = set(steps) if steps else set(nt.steps)
    order = list(use)  # the set's order: the order of every op's samples
    col = {s: j for j, s in enumerate(order)}
    evs = nt.events
    if any(s not in col for s in {e.step for e in evs}):
        evs = [e for e in evs if e.step in col]
    index = {op: i for i, op in enumerate(nt.ops)}
    n_known, k_ev = len(index), len(evs)
    names = list(map(_OP, evs))
    for x in set(names).difference(index):  # events of an op outside the DFG: still a predecessor's end
        index[x] = len(index)
    n, m = len(index), len(order)
    cell = np.fromiter(map(index.__getitem__, names), np.int64, k_ev) * m
    cell += np.fromiter(map(col.__getitem__, map(_STEP, evs)), np.int64, k_ev)
    present = np.zeros(n * m, bool)
    present[cell] = True
    if int(np.count_nonzero(present)) != k_ev:  # a cell twice (not np.unique: it imports numpy.ma, ~20 ms)
        return _node_stats_per_op(nt, steps)
    ts = np.zeros(n * m)
    end = np.zeros(n * m)
    ev_ts = np.fromiter(map(_TS, evs), float, k_ev)
    ts[cell] = ev_ts
    end[cell] = ev_ts + np.fromiter(map(_DUR, evs), float, k_ev)  # as e.ts + e.dur
    present, ts, end = present.reshape(n, m), ts.reshape(n, m), end.reshape(n, m)
    # P: the latest end of a present predecessor, else the step start (else the op's start)
    in_steps = np.array([s in nt.steps for s in order], bool)
    start = np.array([nt.steps[s][0] if s in nt.steps else 0.0 for s in order], float)
    P = np.where(in_steps, start, ts)
    e = _edge_array(nt.edges, index)
    if len(e):
        e = e[np.argsort(e[:, 1], kind="stable")]
        ends = np.where(present[e[:, 0]], end[e[:, 0]], -np.inf)
        heads = np.flatnonzero(np.r_[True, e[1:, 1] != e[:-1, 1]])
        latest = np.maximum.reduceat(ends, heads, axis=0)
        rows = e[heads, 1]
        P[rows] = np.where(latest > -np.inf, latest, P[rows])
    out: dict[str, OpStats] = {}
    if m == 1:  # one step (param_dlrm_8rank): the same samples without a row list and a zip per op
        s0 = order[0]
        for op, f, a, b, c in zip(nt.ops, present[:, 0].tolist(), ts[:, 0].tolist(), end[:, 0].tolist(),
                                  P[:, 0].tolist()):
            out[op] = OpStats(0.0, 0.0, 0.0, {s0: (a, b, c)} if f else {})
    else:
        tsl, endl, Pl, pres = ts.tolist(), end.tolist(), P.tolist(), present.tolist()
        cols = range(m)
        full = present.all(axis=1).tolist()
        for i, op in enumerate(nt.ops):
            a, b, c = tsl[i], endl[i], Pl[i]
            if full[i]:
                samples = dict(zip(order, zip(a, b, c)))
            else:
                r = pres[i]
                samples = {order[j]: (a[j], b[j], c[j]) for j in cols if r[j]}
            out[op] = OpStats(0.0, 0.0, 0.0, samples)
    counts = present[:n_known].sum(axis=1)
    ops = list(nt.ops)
    for k in sorted(set(counts.tolist())):  # np.unique's values, without importing numpy.ma
        if k == 0:
            continue
        sel = np.flatnonzero(counts == k)
        mask = present[sel]
        t = ts[sel][mask].reshape(-1, k)
        P_k = P[sel][mask].reshape(-1, k)
        dur = np.mean(np.maximum(0.0, end[sel][mask].reshape(-1, k) - np.maximum(t, P_k)), axis=1)
        gap = np.mean(np.maximum(0.0, t - P_k), axis=1)
        off = _median_rows(t - np.broadcast_to(start, (len(sel), m))[mask].reshape(-1, k))
        for i, d, g, o in zip(sel.tolist(), dur.tolist(), gap.tolist(), off.tolist()):
            st = out[ops[i]]
            st.dur, st.gap, st.offset = d, g, o
    return out


def _edge_array(edges: list[tuple[str, str]], index: dict[str, int]) -> np.ndarray:
    """The edges between ops of ``index`` as an (edges, 2) array of their indices."""
    k = len(edges)
    try:  # every edge's ops known (a validated trace): no list of pairs in between
        return np.stack([np.fromiter(map(index.__getitem__, map(_FIRST, edges)), np.int64, k),
                         np.fromiter(map(index.__getitem__, map(_SECOND, edges)), np.int64, k)], axis=1) \
            if k else np.empty((0, 2), np.int64)
    except KeyError:
        return np.array([(index[a], index[b]) for a, b in edges if a in index and b in index], np.int64).reshape(-1, 2)


def _median_rows(a: np.ndarray) -> np.ndarray:
    """``np.median(a, axis=1)`` of finite values, bit for bit (the middle value, or the
    mean of the two middle ones), without its NaN check (which imports ``numpy.ma``)."""
    k = a.shape[1]
    s = np.sort(a, axis=1)
    if k % 2:
        return s[:, k // 2]
    return (s[:, k // 2 - 1] + s[:, k // 2]) / 2.0


def _node_stats_per_op(nt: NodeTrace, steps: list[int] | None = None) -> dict[str, OpStats]:
    """:func:`node_stats` one op at a time (a dict of the events, a loop over each op's
    steps and predecessors): the definition, and the way for a node with two events of one
    op in one step (the last one counts)."""
    use = set(steps) if steps else set(nt.steps)
    order = list(use)  # the set's order: the order of every op's samples
    ev: dict[tuple[str, int], tuple[float, float]] = {}
    for e in nt.events:
        if e.step in use:
            ev[(e.op, e.step)] = (e.ts, e.ts + e.dur)
    preds: dict[str, list[str]] = defaultdict(list)
    for a, b in nt.edges:
        preds[b].append(a)
    start = {s: nt.steps[s][0] if s in nt.steps else 0.0 for s in order}
    out: dict[str, OpStats] = {}
    groups: dict[int, tuple[list[str], list[list[float]]]] = defaultdict(lambda: ([], []))
    for op in nt.ops:
        samples = {}
        rows = []
        pq = preds.get(op, ())
        for s in order:
            x = ev.get((op, s))
            if x is None:
                continue
            ts, end = x
            P = None  # the latest end of a predecessor (max() of them, in the same order)
            for q in pq:
                y = ev.get((q, s))
                if y is not None and (P is None or y[1] > P):
                    P = y[1]
            if P is None:
                P = start[s] if s in nt.steps else ts
            samples[s] = (ts, end, P)
            rows.append((ts, end, P, start[s]))
        out[op] = OpStats(0.0, 0.0, 0.0, samples)
        if samples:
            g = groups[len(rows)]
            g[0].append(op)
            g[1].append(rows)
    for ops, rows in groups.values():
        arr = np.array(rows, dtype=float)  # (ops, samples, 4)
        ts, end, P, starts = arr[..., 0].copy(), arr[..., 1].copy(), arr[..., 2].copy(), arr[..., 3].copy()
        dur = np.mean(np.maximum(0.0, end - np.maximum(ts, P)), axis=1)
        gap = np.mean(np.maximum(0.0, ts - P), axis=1)
        off = np.median(ts - starts, axis=1)
        for i, op in enumerate(ops):
            st = out[op]
            st.dur, st.gap, st.offset = float(dur[i]), float(gap[i]), float(off[i])
    return out


def measured_iteration_us(nodes: list[NodeTrace], steps: list[int]) -> float | None:
    """Mean over ``steps`` and nodes of the step duration (the framework's own marker).

    Not the slowest node's: steps run back to back, so in steady state every node's mean
    step time is the iteration time, but in any one step the ranks are staggered and the
    one that started earliest (and waited in the first collective) looks slowest; the
    per-step maximum is biased upwards by that jitter. A node whose GPU sets its period
    (``GPU_PERIOD_META``: its GPU falls further behind its CPU at every step) counts that
    period where it exceeds the marker's step.
    """
    per_step = []
    for s in steps:
        durs = [max(nt.steps[s][1], float(nt.meta.get(GPU_PERIOD_META, 0.0))) for nt in nodes if s in nt.steps]
        if durs:
            per_step.append(float(np.mean(durs)))
    return float(np.mean(per_step)) if per_step else None
