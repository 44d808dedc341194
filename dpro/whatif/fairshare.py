"""Max-min fair sharing of links by concurrent transfers (fluid, event-driven).

A transfer (flow) crosses a set of resources, each of a capacity in bytes/µs: in a
parameter-server job a push crosses its worker's link (out) and its server's port (in), a
pull the server's port (out) and the worker's link (in). The flows active at a moment get
the max-min fair rates (:func:`max_min_rates`, progressive filling / water-filling): every
flow's rate grows at the same pace until a resource it crosses is full; those flows stay
at that rate and the others keep growing. A flow that a small transfer leaves alone on a
link gets the whole link once the small one ends: the rates are solved again whenever a
flow starts or ends (:func:`transfer_ends`; :func:`simulate_fluid` does the same inside
a replay of a dependency graph, where a flow starts when its op does).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np

from dpro.errors import DproInputError
from dpro.graph.compiled import CompiledGraph
from dpro.replayer.engine import Schedule

#: relative tolerance of "a resource is full" and "a flow is done"
_EPS = 1e-9


def max_min_rates(flows: Sequence[Iterable[Hashable]], capacities: Mapping[Hashable, float]) -> list[float]:
    """The max-min fair rate of each flow (bytes/µs); ``flows[i]`` names the resources flow
    ``i`` crosses, ``capacities`` their bytes/µs (a resource not in it is unlimited; a flow
    crossing no limited resource gets ``inf``)."""
    res = [[r for r in set(f) if r in capacities] for f in flows]
    if any(not capacities[r] > 0 for f in res for r in f):
        raise ValueError("a resource's capacity must be > 0")
    rate = [0.0] * len(res)
    left = {r: float(capacities[r]) for f in res for r in f}
    users: dict[Hashable, set[int]] = {}
    for i, f in enumerate(res):
        for r in f:
            users.setdefault(r, set()).add(i)
    growing = {i for i, f in enumerate(res) if f}
    for i, f in enumerate(res):
        if not f:
            rate[i] = math.inf
    while growing:
        # the resource that fills first if every growing flow grows by the same amount
        step = min(left[r] / len(u) for r, u in users.items() if u)
        full = [r for r, u in users.items() if u and left[r] / len(u) <= step * (1 + _EPS)]
        for i in growing:
            rate[i] += step
            for r in res[i]:
                left[r] -= step
        frozen = set().union(*(users[r] for r in full))
        growing -= frozen
        for i in frozen:
            for r in res[i]:
                users[r].discard(i)
    return rate


def transfer_ends(flows: Sequence[tuple[float, float, Iterable[Hashable]]],
                  capacities: Mapping[Hashable, float]) -> list[float]:
    """End time (µs) of each flow ``(start µs, bytes, resources)``, the active flows sharing
    the resources max-min fairly, solved again at every start and end."""
    n = len(flows)
    order = sorted(range(n), key=lambda i: flows[i][0])
    ends = [0.0] * n
    left: dict[int, float] = {}
    t, k = 0.0, 0
    while k < n or left:
        if not left:
            t = max(t, flows[order[k]][0])
        while k < n and flows[order[k]][0] <= t:
            i = order[k]
            k += 1
            if flows[i][1] <= 0:
                ends[i] = t
            else:
                left[i] = float(flows[i][1])
        if not left:
            continue
        active = list(left)
        rates = max_min_rates([flows[i][2] for i in active], capacities)
        dt = min(left[i] / r for i, r in zip(active, rates))
        if k < n:
            dt = min(dt, flows[order[k]][0] - t)
        t += dt
        for i, r in zip(active, rates):
            left[i] -= r * dt
            if left[i] <= _EPS * max(1.0, flows[i][1]):
                ends[i] = t
                del left[i]
    return ends


def max_min_law(resources: Mapping[int, Iterable[Hashable]],
                capacities: Mapping[Hashable, float]) -> Callable[[Sequence[int]], list[float]]:
    """The rate law of :func:`simulate_fluid` for flows that share links max-min fairly:
    flow ``i`` crosses ``resources[i]`` (bytes/µs ``capacities``)."""
    return lambda ids: max_min_rates([resources[i] for i in ids], capacities)


def simulate_fluid(g: CompiledGraph, key: np.ndarray | None, sizes: Mapping[int, float],
                   rates: Callable[[Sequence[int]], Sequence[float]], fixed: Mapping[int, float] | None = None) -> Schedule:
    """Replay ``g`` as :func:`dpro.whatif.priority.simulate_priority` does (a free device
    runs its ready op of lowest ``key``; no preemption; ``key=None``: the first ready,
    then the lowest measured start offset, as the replayer's engine), except that an op in
    ``sizes`` (a flow) lasts its own duration (a fixed latency) and then until its size has
    moved at the rate ``rates(flows moving)`` gives it, solved again whenever a flow starts or
    ends (:func:`max_min_law`: bytes over shared links; :mod:`dpro.whatif.overlap`: µs of work
    at the speed computation and collectives leave each other). ``fixed``: a flow's fixed
    part where it is not its compiled duration (0: all of it moves at the rate)."""
    n = g.n
    dur = g.dur.tolist()
    for i, d in (fixed or {}).items():
        dur[i] = d
    dev = g.device.tolist()
    ptr, succ = g.succ_ptr.tolist(), g.succ_idx.tolist()
    pend = g.indegree().tolist()
    prio = g.prio.tolist()
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    binder = np.full(n, -1, dtype=np.int64)
    bound_by = [-1] * n
    ready_at = [0.0] * n
    last = [-1] * len(g.devices)
    busy = [False] * len(g.devices)
    ready: list[list[tuple[tuple[float, ...], int]]] = [[] for _ in g.devices]  # (key, op), ready now
    timed: list[tuple[float, int]] = []  # (time, op): a fixed part ends
    moving: dict[int, float] = {}  # flow op -> bytes left

    def rank(i: int) -> tuple[float, ...]:
        return (float(key[i]),) if key is not None else (ready_at[i], prio[i])

    for i in range(n):
        if pend[i] == 0:
            heapq.heappush(ready[dev[i]], (rank(i), i))
    now, done = 0.0, 0
    rate: dict[int, float] = {}
    changed = True

    def finish(i: int) -> None:
        nonlocal done
        end[i] = now
        busy[dev[i]] = False
        done += 1
        for j in succ[ptr[i]:ptr[i + 1]]:
            bound_by[j], ready_at[j] = i, now
            pend[j] -= 1
            if pend[j] == 0:
                heapq.heappush(ready[dev[j]], (rank(j), j))

    while True:
        for d, q in enumerate(ready):
            if q and not busy[d]:
                _, i = heapq.heappop(q)
                start[i] = now
                binder[i] = last[d] if last[d] >= 0 and end[last[d]] >= ready_at[i] else bound_by[i]
                busy[d], last[d] = True, i
                heapq.heappush(timed, (now + dur[i], i))
        if changed:
            ids = list(moving)
            rate = dict(zip(ids, rates(ids)))
            changed = False
        t_next = timed[0][0] if timed else math.inf
        for i, b in moving.items():
            t_next = min(t_next, now + b / rate[i])
        if t_next == math.inf:
            break
        dt = t_next - now
        now = t_next
        ended = []
        for i in moving:
            moving[i] -= rate[i] * dt
            # done, or what is left is below the clock's resolution at ``now`` (it would never end)
            if moving[i] <= _EPS * max(1.0, sizes[i]) or now + moving[i] / rate[i] <= now:
                ended.append(i)
        for i in ended:
            del moving[i]
            finish(i)
            changed = True
        while timed and timed[0][0] <= now:
            _, i = heapq.heappop(timed)
            if sizes.get(i, 0.0) > 0:
                moving[i] = float(sizes[i])
                changed = True
            else:
                finish(i)
    if done != n:
        raise DproInputError(None, f"the graph has a cycle: {n - done} of {n} ops never became ready")
    return Schedule(start=start, end=end, binder=binder)
