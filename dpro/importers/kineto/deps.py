"""Dependencies between one step's segments, derived from the trace itself.

Edges (see docs/kineto.md): program order on each CPU thread / GPU stream; launch ->
kernel (correlation id); collective issue -> collective; collective -> the op that
waited for it; cross-stream waits; CPU synchronisation -> the kernel it waited for;
main thread -> first op of another thread (hand-off); another thread's last op -> the
main-thread op that resumed when it ended (join); everything -> step end.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from operator import attrgetter

from dpro.importers.kineto.segments import Seg

#: gaps shorter than this (µs) are host overhead, never a wait
MIN_WAIT_GAP_US = 50.0
#: cross-stream waits: how close (µs) the other stream's end must be to the start
STREAM_WAIT_TOL_US = 5.0
#: joins: how soon (µs, or 10 % of the wait) after another thread's op ends the main thread resumes
#: (measured: 300-480 µs from autograd's last op to the next main-thread op under torch.profiler on an H200)
JOIN_TOL_US = 500.0

Edge = tuple[Seg, Seg]
#: a segment's (start, end): the order of a device queue
_TS_END = attrgetter("ts", "end")


def chain_edges(by_dev: dict[str, list[Seg]]) -> list[Edge]:
    """Program order on each device queue."""
    return [(a, b) for segs in by_dev.values() for a, b in zip(segs, segs[1:])]


def launch_edges(segs: list[Seg], gpu: list[Seg]) -> list[Edge]:
    """CPU launch segment -> the kernel/memcpy it launched."""
    by_corr = {c: s for s in segs for c in s.launches}
    return [(by_corr[k.corr], k) for k in gpu if k.corr in by_corr]


def consumer_edges(thread: list[Seg], colls: list[tuple[Seg, Seg]]) -> list[Edge]:
    """Collective -> the op on the issuing thread that waited for it, in one step.

    ``colls`` are (issue segment, collective) pairs in issue order.  Candidates are the ops
    after the issue (and not before the previous collective's consumer) that follow a gap
    of at least ``MIN_WAIT_GAP_US``: a blocked thread shows as such a gap.  The consumer is
    the candidate whose gap is nearest to the collective's end (distance 0 when the end
    falls inside the gap, or up to max(200 µs, 5 %) after it, because the record function
    of a communication thread can close late); without candidates, the first op that
    starts after the collective ends.  The caller reconciles steps and clips the
    collective's end to its consumer's start.
    """
    if not thread:
        return []
    index = {id(s): i for i, s in enumerate(thread)}
    starts = [s.ts for s in thread]
    gaps = [i for i in range(1, len(thread)) if thread[i].ts - thread[i - 1].end >= MIN_WAIT_GAP_US]
    out: list[Edge] = []
    lo = 0
    for issue, c in colls:
        i0 = max(lo, index.get(id(issue), -1) + 1)
        tol = max(200.0, 0.05 * (c.end - c.ts))
        best, best_d = None, float("inf")
        for i in gaps:
            if i < i0:
                continue
            g0, g1 = thread[i - 1].end, thread[i].ts
            d = 0.0 if g0 <= c.end <= g1 + tol else min(abs(c.end - g0), abs(c.end - g1))
            if d < best_d:
                best, best_d = i, d
            if g0 > c.end + tol:
                break
        if best is None:
            best = bisect.bisect_left(starts, c.end, lo=i0)
            if best >= len(thread):
                continue
        out.append((c, thread[best]))
        lo = best
    return out


def stream_wait_edges(by_dev: dict[str, list[Seg]], launch_end: dict[int, float]) -> list[Edge]:
    """Kernel that started only when a kernel on another stream ended: a cross-stream wait."""
    # by end, then queue and place on it: GPU ops can share a queue and an end (zero
    # durations in integer-µs traces, CUDA-graph bursts), and a Seg has no order of its own
    ends: list[tuple[float, str, Seg]] = [
        (k.end, dev, k) for _, dev, _, k in sorted(
            ((k.end, dev, i, k) for dev, ks in by_dev.items() if dev.startswith("gpu") for i, k in enumerate(ks)),
            key=lambda x: x[:3],
        )
    ]
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


def join_edges(by_dev: dict[str, list[Seg]]) -> list[Edge]:
    """Another CPU thread's op -> the main-thread op that resumed right after it ended.

    The main thread blocked (a gap of at least ``MIN_WAIT_GAP_US``) while the other thread
    ran, and resumed within ``JOIN_TOL_US`` (or 10 % of the gap) of that thread's last op in
    the gap: on a GPU job, ``loss.backward()`` waits while autograd's device thread runs the
    backward pass. Without the edge the wait would replay as fixed host time, so a faster
    backward pass could not shorten the step.
    """
    main = by_dev.get("cpu:main", [])
    out: list[Edge] = []
    for dev, segs in by_dev.items():
        if not dev.startswith("cpu:") or dev == "cpu:main" or not segs:
            continue
        ends = [s.end for s in segs]
        for i in range(1, len(main)):
            g0, g1 = main[i - 1].end, main[i].ts
            if g1 - g0 < MIN_WAIT_GAP_US:
                continue
            j = bisect.bisect_right(ends, g1) - 1
            if j >= 0 and segs[j].ts >= g0 and g1 - ends[j] <= max(JOIN_TOL_US, 0.1 * (g1 - g0)):
                out.append((segs[j], main[i]))
    return out


def group_by_device(segs: list[Seg]) -> dict[str, list[Seg]]:
    by_dev: dict[str, list[Seg]] = defaultdict(list)
    for s in segs:
        by_dev[s.dev].append(s)
    for v in by_dev.values():
        v.sort(key=_TS_END)
    return dict(by_dev)
