"""Replay of a parameter-server worker whose messages share its ports (flow level).

The Kahn replay (:mod:`dpro.replayer.engine`) runs one op at a time per device. A PS
worker's messages do not behave like that: ps-lite keeps one connection per server, so
messages to one server go one after the other (FIFO), but messages to different servers
are in flight at once and share the worker's port. Measured on a capped 2-worker,
4-server MXNet job, a worker's pushes to its four servers all ran together, and those to
one server ended where this model puts them, within 8 % (docs/optimizer.md,
"Parameter-server jobs").

Here every op keeps its FIFO device (for a message: the worker's connection to its
server, ``link:server<S>:push`` or ``:pull``);
a message op (a *flow*) first waits ``alpha`` (its per-message cost) and then moves its
bytes at ``1 / (beta * max(N, m))`` bytes/µs, where m is the number of this worker's
messages moving in the same direction at that moment. ``N`` is there because a server's
port takes the same message from all N workers at once (symmetry), so one connection
never gets more than 1/N of a port; the worker's own port, shared by its m messages,
binds when m > N. Other ops run for their duration, as in the Kahn replay.

Small graphs only (one worker of a PS job: tens to hundreds of ops): a plain event loop.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from dpro.graph.compiled import CompiledGraph
from dpro.replayer.engine import Schedule

#: a flow's direction: pushes (worker -> servers) and pulls share nothing
PUSH, PULL = 0, 1
_EPS = 1e-9


@dataclass(frozen=True)
class Flow:
    """A message: this worker's bytes and its direction."""

    nbytes: float
    direction: int


def simulate_port_sharing(g: CompiledGraph, flows: dict[int, Flow], alpha: float, beta: float, workers: int) -> Schedule:
    """Replay ``g`` with the ops in ``flows`` as shared-port messages (module docstring)."""
    n = g.n
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    binder = np.full(n, -1, dtype=np.int64)
    pending = g.indegree().tolist()
    ready_at = [0.0] * n
    rank = np.empty(n, dtype=np.int64)
    rank[np.argsort(g.prio, kind="stable")] = np.arange(n)
    queues: list[list[tuple[float, int, int]]] = [[] for _ in g.devices]  # (ready, rank, op)
    busy = [False] * len(g.devices)
    last = [-1] * len(g.devices)
    timed: list[tuple[float, int, int]] = []  # (time, kind 0 = end / 1 = latency over, op)
    moving: dict[int, float] = {}  # op -> bytes left
    per_dir = [0, 0]
    for i in np.flatnonzero(np.asarray(pending) == 0).tolist():
        heapq.heappush(queues[g.device[i]], (0.0, int(rank[i]), i))
    t, done = 0.0, 0

    def launch(now: float) -> None:
        """Start the next queued op on every idle device."""
        for d, q in enumerate(queues):
            if busy[d] or not q:
                continue
            r, _, i = heapq.heappop(q)
            busy[d] = True
            start[i] = now
            if r < now - _EPS and last[d] >= 0:
                binder[i] = last[d]
            if i in flows:
                heapq.heappush(timed, (now + alpha, 1, i))
            else:
                heapq.heappush(timed, (now + float(g.dur[i]), 0, i))

    def rate(direction: int) -> float:
        return 1.0 / (beta * max(workers, per_dir[direction]))

    launch(t)
    while done < n:
        nxt = timed[0][0] if timed else float("inf")
        for i, left in moving.items():
            te = t + left / rate(flows[i].direction)
            if te < nxt - _EPS:
                nxt = te
        if nxt == float("inf"):
            raise RuntimeError("port-sharing replay: ops left that can never run (a cycle)")
        dt = nxt - t
        for i in moving:
            moving[i] -= dt * rate(flows[i].direction)
        t = nxt
        finished: list[int] = []
        while timed and timed[0][0] <= t + _EPS:
            _, kind, i = heapq.heappop(timed)
            if kind == 1 and flows[i].nbytes * beta > _EPS:
                moving[i] = flows[i].nbytes
                per_dir[flows[i].direction] += 1
            else:
                finished.append(i)
        for i in [i for i, left in moving.items() if left * beta <= _EPS]:
            del moving[i]
            per_dir[flows[i].direction] -= 1
            finished.append(i)
        for i in finished:
            end[i] = t
            done += 1
            d = int(g.device[i])
            busy[d], last[d] = False, i
            for j in g.succ_idx[g.succ_ptr[i]:g.succ_ptr[i + 1]].tolist():
                pending[j] -= 1
                if t >= ready_at[j]:
                    ready_at[j] = t
                    binder[j] = i
                if pending[j] == 0:
                    heapq.heappush(queues[g.device[j]], (ready_at[j], int(rank[j]), j))
        launch(t)
    return Schedule(start, end, binder)
