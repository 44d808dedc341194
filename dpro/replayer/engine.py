"""Per-device Kahn simulation of a compiled DAG.

Every device (a worker's thread or stream, a link, a server) has one clock and a FIFO
of ready ops ordered by ready time (ties: the op's measured start offset, then index).
The simulation always runs the op that can start earliest across all devices, so time
never goes backwards; an op starts at max(device clock, latest predecessor end) and
holds its device for its duration.  Iteration time = the latest end.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from dpro.errors import DproInputError
from dpro.graph.compiled import CompiledGraph


@dataclass
class Schedule:
    """Result of a simulation: per-op start/end and the op that decided each start."""

    start: np.ndarray
    end: np.ndarray
    #: the predecessor (DFG or same-device) whose end fixed the op's start, -1 if none
    binder: np.ndarray

    @property
    def makespan(self) -> float:
        return float(self.end.max()) if len(self.end) else 0.0


def simulate(g: CompiledGraph, release: np.ndarray | None = None) -> Schedule:
    """Replay ``g``; ``release`` optionally gives an earliest start per op (partial replay)."""
    n = g.n
    dur = g.dur.tolist()
    dev = g.device.tolist()
    prio = g.prio.tolist()
    ptr = g.succ_ptr.tolist()
    succ = g.succ_idx.tolist()
    pending = g.indegree().tolist()
    ready = release.astype(float).tolist() if release is not None else [0.0] * n
    binder = [-1] * n
    start = [0.0] * n
    end = [0.0] * n
    ndev = len(g.devices)
    clock = [0.0] * ndev
    last = [-1] * ndev
    queues: list[list] = [[] for _ in range(ndev)]
    key = [float("inf")] * ndev  # the candidate start registered in the device heap
    heap: list[tuple[float, int]] = []
    push, pop = heapq.heappush, heapq.heappop

    for i in range(n):
        if pending[i] == 0:
            push(queues[dev[i]], (ready[i], prio[i], i))
    for d in range(ndev):
        if queues[d]:
            key[d] = queues[d][0][0]
            push(heap, (key[d], d))

    done = 0
    while heap:
        cs, d = pop(heap)
        if cs != key[d]:
            continue
        q = queues[d]
        c = clock[d]
        top = heap[0][0] if heap else float("inf")
        while True:
            r, _, i = pop(q)
            if c >= r:
                s = c
                binder[i] = last[d]
            else:
                s = r
            e = s + dur[i]
            start[i] = s
            end[i] = e
            c = e
            last[d] = i
            done += 1
            for k in range(ptr[i], ptr[i + 1]):
                j = succ[k]
                if e > ready[j] or binder[j] == -1 and e == ready[j]:
                    ready[j] = e
                    binder[j] = i
                pending[j] -= 1
                if pending[j] == 0:
                    dj = dev[j]
                    qj = queues[dj]
                    push(qj, (ready[j], prio[j], j))
                    if dj != d:
                        cand = ready[j] if ready[j] > clock[dj] else clock[dj]
                        if cand < key[dj]:
                            key[dj] = cand
                            push(heap, (cand, dj))
                            if cand < top:
                                top = cand
            if not q:
                key[d] = float("inf")
                break
            nxt = q[0][0] if q[0][0] > c else c
            if nxt > top:
                key[d] = nxt
                push(heap, (nxt, d))
                break
        clock[d] = c
    if done != n:
        stuck = [g.names[i] for i in range(n) if pending[i] > 0][:3]
        raise DproInputError(None, f"the global DFG has a cycle or unmet dependency (stuck at {', '.join(stuck)})")
    return Schedule(np.array(start), np.array(end), np.array(binder, dtype=np.int64))
