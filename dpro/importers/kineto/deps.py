"""Dependencies between one step's segments, derived from the trace itself.

Edges (see docs/kineto.md): program order on each CPU thread / GPU stream; launch ->
kernel (correlation id); collective issue -> collective; collective -> the op that
waited for it; cross-stream waits; CPU synchronisation -> the kernel it waited for;
main thread -> first op of another thread (hand-off); everything -> step end.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from dpro.importers.kineto.segments import Seg

#: gaps shorter than this (µs) are host overhead, never a wait
MIN_WAIT_GAP_US = 50.0
#: cross-stream waits: how close (µs) the other stream's end must be to the start
STREAM_WAIT_TOL_US = 5.0

Edge = tuple[Seg, Seg]


def chain_edges(by_dev: dict[str, list[Seg]]) -> list[Edge]:
    """Program order on each device queue."""
    return [(a, b) for segs in by_dev.values() for a, b in zip(segs, segs[1:])]


def launch_edges(segs: list[Seg], gpu: list[Seg]) -> list[Edge]:
    """CPU launch segment -> the kernel/memcpy it launched."""
    by_corr = {c: s for s in segs for c in s.launches}
    return [(by_corr[k.corr], k) for k in gpu if k.corr in by_corr]


def consumer_edges(thread: list[Seg], colls: list[tuple[Seg, Seg]]) -> list[Edge]:
    """Collective -> the op on the issuing thread that waited for it.

    ``colls`` are (issue segment, collective) pairs in issue order.  The consumer of a
    collective is the first op after its issue (and not before the previous consumer)
    that starts after a gap which the collective's end falls into, within a tolerance
    (record functions of communication threads can close late); failing that, the first
    op starting after the collective ends.  A collective's end is clipped to its
    consumer's start.
    """
    if not thread:
        return []
    index = {id(s): i for i, s in enumerate(thread)}
    starts = [s.ts for s in thread]
    out: list[Edge] = []
    lo = 0
    for issue, c in colls:
        i0 = max(lo, index.get(id(issue), -1) + 1)
        tol = max(200.0, 0.05 * (c.end - c.ts))
        chosen = None
        for i in range(i0, len(thread)):
            o = thread[i]
            if o.ts > c.end + tol:
                break
            gap_start = thread[i - 1].end if i > 0 else o.ts
            if o.ts - gap_start >= MIN_WAIT_GAP_US and gap_start <= c.end + tol and o.ts >= c.end - tol:
                chosen = i
                break
        if chosen is None:
            chosen = bisect.bisect_left(starts, c.end, lo=i0)
            if chosen >= len(thread):
                continue
        out.append((c, thread[chosen]))
        lo = chosen
    return out


def stream_wait_edges(by_dev: dict[str, list[Seg]], launch_end: dict[int, float]) -> list[Edge]:
    """Kernel that started only when a kernel on another stream ended: a cross-stream wait."""
    ends: list[tuple[float, str, Seg]] = sorted(
        (k.end, dev, k) for dev, ks in by_dev.items() if dev.startswith("gpu") for k in ks
    )
    end_times = [e[0] for e in ends]
    out: list[Edge] = []
    for dev, ks in by_dev.items():
        if not dev.startswith("gpu"):
            continue
        prev_end = float("-inf")
        for k in ks:
            ready = max(prev_end, launch_end.get(id(k), float("-inf")))
            if k.ts - ready > STREAM_WAIT_TOL_US:
                j = bisect.bisect_right(end_times, k.ts + STREAM_WAIT_TOL_US) - 1
                while j >= 0 and ends[j][1] == dev:
                    j -= 1
                if j >= 0 and ends[j][0] >= max(ready, k.ts - STREAM_WAIT_TOL_US * 20):
                    out.append((ends[j][2], k))
            prev_end = k.end
    return out


def sync_edges(segs: list[Seg], gpu: list[Seg]) -> list[Edge]:
    """A blocking CUDA sync waited for the last GPU op that ended inside it."""
    if not gpu:
        return []
    by_end = sorted(gpu, key=lambda k: k.end)
    ends = [k.end for k in by_end]
    out = []
    for s in segs:
        if s.sync:
            j = bisect.bisect_right(ends, s.end + STREAM_WAIT_TOL_US) - 1
            if j >= 0 and by_end[j].end >= s.ts:
                out.append((by_end[j], s))
    return out


def handoff_edges(by_dev: dict[str, list[Seg]]) -> list[Edge]:
    """The first op of a secondary CPU thread follows the main-thread op before it."""
    main = by_dev.get("cpu:main", [])
    if not main:
        return []
    ends = [s.end for s in main]
    out = []
    for dev, segs in by_dev.items():
        if dev.startswith("cpu:") and dev != "cpu:main" and segs:
            j = bisect.bisect_right(ends, segs[0].ts) - 1
            if j >= 0:
                out.append((main[j], segs[0]))
    return out


def group_by_device(segs: list[Seg]) -> dict[str, list[Seg]]:
    by_dev: dict[str, list[Seg]] = defaultdict(list)
    for s in segs:
        by_dev[s.dev].append(s)
    for v in by_dev.values():
        v.sort(key=lambda s: (s.ts, s.end))
    return dict(by_dev)
