"""Priority list scheduling of a compiled DAG (the ``schedule(policy)`` primitive).

The replayer's engine runs a device's ops first ready, first served. Under a priority
policy a device that becomes free runs, among the ops already ready on it, the one with
the lowest key (ties: the lower index); when none is ready it waits for the next to
become ready (ties among those: the lowest key). No preemption: an op that started runs to
its end, so a large transfer delays a more urgent one that becomes ready meanwhile unless
it is sliced (P3). Devices advance in time order, as in the engine.
"""

from __future__ import annotations

import heapq

import numpy as np

from dpro.errors import DproInputError
from dpro.graph.compiled import CompiledGraph
from dpro.replayer.engine import Schedule


def simulate_priority(g: CompiledGraph, key: np.ndarray) -> Schedule:
    """Replay ``g`` with each device running its ready op of lowest ``key`` first."""
    n, ndev = g.n, len(g.devices)
    dur = g.dur.tolist()
    dev = g.device.tolist()
    ptr, succ = g.succ_ptr.tolist(), g.succ_idx.tolist()
    pend = g.indegree().tolist()
    k = [float(x) for x in key]
    ready = [0.0] * n
    start = np.full(n, np.nan)
    binder = np.full(n, -1, dtype=np.int64)
    waiting: list[list] = [[] for _ in range(ndev)]  # (ready, key, op): not yet ready at the device's time
    avail: list[list] = [[] for _ in range(ndev)]  # (key, op, ready): ready, by priority
    clock = [0.0] * ndev
    last = [-1] * ndev
    bound_by: list[int] = [-1] * n  # the predecessor whose end made the op ready
    for i in range(n):
        if pend[i] == 0:
            heapq.heappush(waiting[dev[i]], (0.0, k[i], i))

    def candidate(d: int) -> float:
        c = clock[d]
        w = waiting[d]
        if avail[d] or (w and w[0][0] <= c):
            return c
        return w[0][0] if w else float("inf")

    heap = [(candidate(d), d) for d in range(ndev) if waiting[d]]
    heapq.heapify(heap)
    done = 0
    while heap:
        s, d = heapq.heappop(heap)
        if s != candidate(d) or s == float("inf"):
            continue
        w, a = waiting[d], avail[d]
        while w and w[0][0] <= s:
            r, kk, i = heapq.heappop(w)
            heapq.heappush(a, (kk, i, r))
        _, i, r = heapq.heappop(a)
        start[i] = s
        binder[i] = last[d] if clock[d] >= r and last[d] >= 0 else bound_by[i]
        e = s + dur[i]
        clock[d], last[d] = e, i
        done += 1
        for j in succ[ptr[i]:ptr[i + 1]]:
            if e >= ready[j]:
                ready[j], bound_by[j] = e, i
            pend[j] -= 1
            if pend[j] == 0:
                dj = dev[j]
                before = candidate(dj)
                heapq.heappush(waiting[dj], (ready[j], k[j], j))
                if candidate(dj) < before or not np.isfinite(before):
                    heapq.heappush(heap, (candidate(dj), dj))
        heapq.heappush(heap, (candidate(d), d))
    if done != n:
        raise DproInputError(None, f"the graph has a cycle: {n - done} of {n} ops never became ready")
    return Schedule(start=start, end=start + g.dur, binder=binder)
