"""Per-device Kahn simulation of a compiled DAG.

Every device (a worker's thread or stream, a link, a server) has one clock and a FIFO
of ready ops ordered by ready time (ties: the op's measured start offset, then index).
The simulation always runs the op that can start earliest across all devices, so time
never goes backwards; an op starts at max(device clock, latest predecessor end) and
holds its device for its duration.  Iteration time = the latest end.

The exact rules, ties included (``_simulate_reference`` is the executable statement):

* an op's ready time is the latest end of its DFG predecessors, at least its release
  time (0 without ``release``); it then joins its device's queue, ordered by
  (ready, prio, index);
* devices sit in a heap keyed by (candidate start, device index), candidate start =
  max(clock, ready time of the queue's first op); a device is pushed again when its
  candidate drops, and the entry it leaves behind is skipped when popped but counts for
  the smallest key until then;
* the device popped runs ops from its queue while its next candidate is not later than
  the smallest key in the heap (a device keeps running on a tie);
* an op's binder is its device predecessor when the device was not free before the op
  was ready (ties go to the device; -1 if the device had run nothing, the op starts at
  0), otherwise the first of its DFG predecessors, in the order the simulation ran them,
  whose end is its ready time (-1 if that is its release time or 0).

:func:`simulate` is an optimised implementation of exactly these rules (same floats, same
binders, bit for bit; tests/test_engine.py checks it against a frozen copy of the
reference).  What makes it faster, measured on benchmarks/replay_speed.py:

* per-op data lives in flat ``array.array`` buffers (successors, offsets, durations,
  ready times, starts, binders) rather than lists of Python objects scattered over the
  heap: on a 1.36M-op graph this alone made the loop ~1.5x faster (cache misses) and
  halved the memory;
* ops are renumbered by (prio, index), so a queue entry is a 2-tuple (ready, op) whose
  natural order is the FIFO order, and ops that run close in time are close in memory;
* a device queue is a deque kept sorted by appending ready ops that come in order (almost
  all of them), with a small heap for the few that arrive out of order; an op appended
  behind the queue's head cannot lower the device's candidate, so the device heap is not
  touched;
* the device heap has a sentinel and is popped with ``heappushpop`` when the running
  device goes back into it (one sift instead of two);
* ends are computed with numpy afterwards (``start + dur``, the same IEEE additions) and
  "did every op run" is one ``isnan`` over the starts instead of a counter per op.

When an op did not run (a cycle) or a start came out NaN (NaN times in the input), and
for NaN prios, the reference replays the graph instead: it raises, or returns what it
always returned for such input.

Engines.  :func:`simulate` runs the compiled core (``dpro/replayer/_core.c``, the reference
translated line by line into C: same comparisons, same additions, so bit-identical) when it
was built, else the Python engine above (:func:`simulate_python`).  ``DPRO_ENGINE``
chooses: ``compiled`` (an error if the core is not built), ``python``, ``both`` (run both
and raise :class:`EngineMismatch` unless they agree bit for bit; the test suite runs so) or
``auto`` (the default).  NaN input, cycles and NaN results go to the reference, as above.
"""

from __future__ import annotations

import heapq
import os
from array import array
from collections import deque
from dataclasses import dataclass

import numpy as np

from dpro.compiled import load_compiled
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


ENGINES = ("auto", "compiled", "python", "both")


class EngineMismatch(AssertionError):
    """``DPRO_ENGINE=both``: the compiled and the Python engine disagree (a bug)."""


def _core():
    """The compiled core module, or the reason it cannot be loaded (a string)."""
    return load_compiled("dpro.replayer._core")


def compiled_available() -> bool:
    """Whether the compiled replay core was built and loads."""
    return not isinstance(_core(), str)


def engine_choice() -> str:
    """The engine :func:`simulate` uses now: ``compiled``, ``python`` or ``both``."""
    want = os.environ.get("DPRO_ENGINE", "auto").strip().lower() or "auto"
    if want not in ENGINES:
        raise DproInputError(None, f"DPRO_ENGINE={want!r}: expected one of {', '.join(ENGINES)}")
    if want == "auto":
        return "compiled" if compiled_available() else "python"
    if want in ("compiled", "both") and not compiled_available():
        raise DproInputError(None, f"DPRO_ENGINE={want}: the compiled replay core is {_core()}; "
                             "reinstall dpro with a C compiler (pip install -e .) or use DPRO_ENGINE=python")
    return want


def engine_line() -> str:
    """One line saying which replay engine runs, and why not the compiled one."""
    choice = engine_choice()
    if choice == "compiled":
        return "replay engine: compiled (C core)"
    if choice == "both":
        return "replay engine: compiled and python, compared bit for bit (DPRO_ENGINE=both)"
    if compiled_available():
        return "replay engine: python (DPRO_ENGINE=python)"
    return (f"replay engine: python (the compiled core is {_core()}; "
            "reinstall dpro with a C compiler for a ~10x faster replay)")


def simulate(g: CompiledGraph, release: np.ndarray | None = None) -> Schedule:
    """Replay ``g``; ``release`` optionally gives an earliest start per op (partial replay).

    Runs the engine :func:`engine_choice` names; every engine gives the same schedule, bit
    for bit."""
    choice = engine_choice()
    if choice == "python":
        return simulate_python(g, release)
    s = simulate_compiled(g, release)
    if choice == "both":
        p = simulate_python(g, release)
        for what in ("start", "end", "binder"):
            a, b = getattr(s, what), getattr(p, what)
            if a.dtype != b.dtype or a.shape != b.shape:
                raise EngineMismatch(f"{what}: compiled {a.dtype}{a.shape}, python {b.dtype}{b.shape}")
            # bit for bit: compare the raw 64-bit patterns (NaN == NaN, 0.0 != -0.0)
            bad = np.flatnonzero(a.view(np.int64) != b.view(np.int64))
            if len(bad):
                i = int(bad[0])
                raise EngineMismatch(f"compiled and python engines differ on the {what} of {len(bad)} of {g.n} ops "
                                     f"(first: op {i} {g.names[i]!r}, {a[i]!r} vs {b[i]!r})")
    return s


def simulate_compiled(g: CompiledGraph, release: np.ndarray | None = None) -> Schedule:
    """:func:`simulate` on the compiled core (which must be built); NaN input goes to the reference."""
    core = _core()
    if isinstance(core, str):
        raise RuntimeError(f"the compiled replay core is {core}")
    n = g.n
    rel = None if release is None else np.asarray(release, dtype=np.float64)
    if n >= 2**31 - 1 or len(g.devices) >= 2**31 - 1:
        return simulate_python(g, release)  # the core counts ops and devices in 32 bits
    if n == 0 or np.isnan(g.prio).any() or np.isnan(g.dur).any() or (rel is not None and np.isnan(rel).any()):
        return _simulate_reference(g, release)
    f8, i8 = np.float64, np.int64
    dur = np.ascontiguousarray(g.dur, dtype=f8)
    binder = np.empty(n, dtype=i8)
    start = np.empty(n)
    end = np.empty(n)
    ran = core.simulate(
        len(g.devices), dur, np.ascontiguousarray(g.device, dtype=i8), np.ascontiguousarray(g.prio, dtype=f8),
        np.ascontiguousarray(g.succ_ptr, dtype=i8), np.ascontiguousarray(g.succ_idx, dtype=i8),
        None if rel is None else np.ascontiguousarray(rel), binder, start, end,
    )
    if ran != n or np.isnan(start).any() or np.isnan(end).any():
        # a cycle, NaN out of inf - inf, or infinite times that stall the loop (ran -2):
        # the reference decides and words the error
        return _simulate_reference(g, release)
    return Schedule(start, end, binder)


def simulate_python(g: CompiledGraph, release: np.ndarray | None = None) -> Schedule:
    """:func:`simulate` in Python (the fallback when the compiled core is not built)."""
    n = g.n
    if n == 0 or np.isnan(g.prio).any():
        return _simulate_reference(g, release)
    inf = float("inf")
    ndev = len(g.devices)

    # Renumber ops by (prio, index): new index order == FIFO tie order.
    order = np.argsort(g.prio, kind="stable")
    inv = np.empty(n, dtype=np.int64)
    inv[order] = np.arange(n)
    old_ptr = g.succ_ptr
    cnt = np.diff(old_ptr)[order]
    nptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(cnt, out=nptr[1:])
    # successors keep their original order within a row (it decides binder ties)
    gather = np.repeat(old_ptr[:-1][order] - nptr[:-1], cnt) + np.arange(len(g.succ_idx))
    succ = array("q", inv[g.succ_idx[gather]].tobytes())
    del gather, cnt
    ptr = array("q", nptr.tobytes())
    dur = array("d", g.dur[order].astype(np.float64, copy=False).tobytes())
    devn = g.device[order]
    dev = devn.tolist()
    indeg = g.indegree()[order]
    pending = (indeg - 1).tolist()  # predecessors still to end, minus one
    rel = None if release is None else np.asarray(release, dtype=float)[order]
    ready = array("d", bytes(8 * n)) if rel is None else array("d", rel.tobytes())
    binder = array("q", [-1]) * n
    start = array("d", [float("nan")]) * n
    clock = [0.0] * ndev
    last = [-1] * ndev
    key = [inf] * (ndev + 1)  # the candidate start registered in the device heap
    queues = [deque() for _ in range(ndev)]  # sorted (ready, op)
    ovf: list[list] = [[] for _ in range(ndev)]  # heap of the ops that came out of order
    heappush, heappop, heappushpop = heapq.heappush, heapq.heappop, heapq.heappushpop

    heap = [(inf, ndev)]  # sentinel: pops last, ends the loop
    zero = np.flatnonzero(indeg == 0)  # ready at the start: queues sorted by (ready, op)
    if len(zero):
        r0 = np.zeros(len(zero)) if rel is None else rel[zero]
        srt = np.lexsort((zero, r0, devn[zero]))
        zero, r0 = zero[srt], r0[srt]
        cuts = (np.flatnonzero(np.diff(devn[zero])) + 1).tolist()
        for a, b in zip([0] + cuts, cuts + [len(zero)]):
            d = int(devn[zero[a]])
            queues[d].extend(zip(r0[a:b].tolist(), zero[a:b].tolist()))
            key[d] = queues[d][0][0]
            heap.append((key[d], d))
    heapq.heapify(heap)

    cs, d = heappop(heap)
    while d < ndev:
        if cs != key[d]:  # stale entry
            cs, d = heappop(heap)
            continue
        q = queues[d]
        o = ovf[d]
        c = clock[d]
        li = last[d]
        top = heap[0][0]
        while True:
            if o and (not q or o[0] < q[0]):
                r, i = heappop(o)
            else:
                r, i = q.popleft()
            if c >= r:
                s = c
                binder[i] = li
            else:
                s = r
            start[i] = s
            c = e = s + dur[i]
            li = i
            for j in succ[ptr[i]:ptr[i + 1]]:
                p = pending[j]
                rj = ready[j]
                if p:
                    pending[j] = p - 1
                    if e > rj or e == rj and binder[j] == -1:
                        ready[j] = e
                        binder[j] = i
                    continue
                # the last predecessor: j is ready
                if e > rj or e == rj and binder[j] == -1:
                    rj = e
                    binder[j] = i
                dj = dev[j]
                x = (rj, j)
                qj = queues[dj]
                if qj:
                    if x > qj[-1]:
                        qj.append(x)  # behind the head: the device's candidate stays
                        continue
                    heappush(ovf[dj], x)
                else:
                    qj.append(x)
                if dj != d:
                    cj = clock[dj]
                    if rj < cj:
                        rj = cj
                    if rj < key[dj]:
                        key[dj] = rj
                        heappush(heap, (rj, dj))
                        if rj < top:
                            top = rj
            if q:
                h = q[0]
                if o and o[0] < h:
                    h = o[0]
            elif o:
                h = o[0]
            else:
                key[d] = inf
                clock[d] = c
                last[d] = li
                cs, d = heappop(heap)
                break
            nxt = h[0]
            if nxt < c:
                nxt = c
            if nxt > top:
                key[d] = nxt
                clock[d] = c
                last[d] = li
                cs, d = heappushpop(heap, (nxt, d))
                break
    st = np.frombuffer(start, dtype=np.float64)
    if np.isnan(st).any():
        # an op never ran (a cycle) or NaN came in: the reference decides and words the error
        return _simulate_reference(g, release)
    st = st[inv]
    b = np.append(order, -1)[np.frombuffer(binder, dtype=np.int64)[inv]]
    return Schedule(st, st + g.dur, b)


def _simulate_reference(g: CompiledGraph, release: np.ndarray | None = None) -> Schedule:
    """The straightforward implementation of the rules above (the specification)."""
    n = g.n
    dur = g.dur.tolist()
    dev = g.device.tolist()
    prio = g.prio.tolist()
    ptr = g.succ_ptr.tolist()
    succ = g.succ_idx.tolist()
    pending = g.indegree().tolist()
    ready = np.asarray(release, dtype=float).tolist() if release is not None else [0.0] * n
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
