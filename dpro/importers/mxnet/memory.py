"""An MXNet worker's storage counter attributed to its DFG ops, for memory estimation
(dpro/replayer/memory.py).

The instrument is MXNet's own storage counter: with ``mx.profiler.set_config(profile_memory=True)``
(:mod:`dpro.profiler.mxnet.backend`) every ``Storage::Alloc`` / ``Storage::Free`` on the CPU
(NDArray chunks: activations, gradients, workspaces, the batch) moves a counter
``Memory: cpu/0`` (domain ``Device Storage``) by the handle's size and the profiler writes
its new value as a Chrome counter event (``"ph": "C"``) at that instant. The counter counts
only while the profiler runs, and a free of a block allocated before it started is
subtracted (clamped at 0), so the counter is the live bytes *minus the lowest live level
seen since the profiler started*: exact deltas, unknown offset.

:func:`attach_counter` turns the counter events of the rank's trace into each DFG op's
``peak`` / ``alloc`` / ``free`` (same schema as PyTorch's,
:mod:`dpro.importers.recording.allocations`) and the ``carry_in`` (the counter's level at
the step's start above the lowest level of the analysed steps, i.e. assuming that at the
iteration's emptiest instant only the static arrays are live), beside the static facts the
recorder wrote (:mod:`dpro.profiler.mxnet.memory`).

An allocation or free belongs to the op on the compute thread running at its time (MXNet
allocates an op's outputs and workspace on the engine thread when it executes; a freed
array's ``DeleteVariable`` engine op, not a DFG op, runs between ops), or else to the next
op to start on that thread (its host gap), or to the step's end marker. The counter has no
addresses: within one op a free equal in size to an earlier allocation of the same op is
taken as that op's temporary; ``lifetimes`` are not recorded.
"""

from __future__ import annotations

import bisect
import logging
from collections import defaultdict
from typing import TYPE_CHECKING

from dpro.contracts.recording import MetaKey

if TYPE_CHECKING:
    from dpro.gtrace.schema import NodeTrace

log = logging.getLogger(__name__)

#: the profiler's counter domain and the prefix of its CPU counters
COUNTER_CAT = "Device Storage"
CPU_COUNTER = "Memory: cpu"


def counter_deltas(events: list[dict]) -> list[tuple[float, int]]:
    """(ts, change in bytes) of every CPU storage counter event, in time order."""
    per: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "C" or e.get("cat") != COUNTER_CAT:
            continue
        name = str(e.get("name", ""))
        if not name.startswith(CPU_COUNTER):
            continue
        v = (e.get("args") or {}).get(name)
        ts = e.get("ts")
        if isinstance(v, (int, float)) and isinstance(ts, (int, float)):
            per[name].append((float(ts), int(v)))
    out: list[tuple[float, int]] = []
    for series in per.values():
        prev = 0  # the counter starts at 0 when the profiler starts
        # the file is not in time order (each thread's events are written in blocks); each
        # event holds the counter's value after its change
        for ts, v in sorted(series, key=lambda x: x[0]):
            out.append((ts, v - prev))
            prev = v
    out.sort(key=lambda x: x[0])
    return out


def _split_temporaries(deltas: list[int]) -> tuple[int, int, int]:
    """(peak, alloc, free) of one op's changes in order; a free equal to an earlier
    unmatched allocation of the same op is that allocation's end (a temporary)."""
    level = peak = 0
    open_: dict[int, int] = defaultdict(int)
    alloc = free = 0
    for d in deltas:
        level += d
        peak = max(peak, level)
        if d > 0:
            open_[d] += 1
            alloc += d
        elif d < 0:
            if open_[-d]:
                open_[-d] -= 1
                alloc += d
            else:
                free -= d
    return peak, alloc, free


def attach_counter(nt: "NodeTrace", events: list[dict], facts: dict | None, main_device: str = "cpu:main") -> None:
    """Fill ``nt.meta["memory"]`` from the rank's storage-counter events and its recorded facts.

    Steps analysed: every profiled step of ``nt`` but the first (the counter's clamped
    start). Each step owns the changes after the previous step's end up to its own end.
    """
    mem = dict(facts or {})
    deltas = counter_deltas(events)
    steps = sorted(nt.steps)
    if not deltas or len(steps) < 2:
        if facts:
            nt.meta[MetaKey.MEMORY] = mem
        if not deltas:
            log.info("%s: no storage counter events (profile_memory off?): static arrays only", nt.info.name)
        return
    by_step: dict[int, list] = defaultdict(list)
    for e in nt.events:
        if e.step in nt.steps:
            op = nt.ops.get(e.op)
            if op is not None and op.device.startswith("cpu:") and op.cat != "COMM":
                by_step[e.step].append((e.ts, e.ts + e.dur, e.op, op.device == main_device))
    ts_all = [d[0] for d in deltas]
    analysed = steps[1:]
    per_op: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    starts: list[int] = []
    level = sum(d for t, d in deltas if t <= sum(nt.steps[steps[0]]))
    lowest = level
    end_op = next((o for o in nt.ops if o.startswith("STEP_END")), None)
    for prev, s in zip(steps, analysed):
        lo, hi = sum(nt.steps[prev]), sum(nt.steps[s])
        i0, i1 = bisect.bisect_right(ts_all, lo), bisect.bisect_right(ts_all, hi)
        starts.append(level)
        evs = sorted(by_step[s])
        main = [x for x in evs if x[3] and not x[2].startswith("STEP_END")]
        main_starts = [x[0] for x in main]
        changes: dict[str, list[int]] = defaultdict(list)
        for t, d in deltas[i0:i1]:
            level += d
            lowest = min(lowest, level)
            owner = next((x[2] for x in main if x[0] <= t <= x[1]), None)
            if owner is None:
                owner = next((x[2] for x in evs if not x[3] and x[0] <= t <= x[1]), None)
            if owner is None:
                j = bisect.bisect_left(main_starts, t)
                owner = main[j][2] if j < len(main) else end_op
            if owner is not None:
                changes[owner].append(d)
        for op, ds in changes.items():
            pk, al, fr = _split_temporaries(ds)
            acc = per_op[op]
            acc[0] += pk
            acc[1] += al
            acc[2] += fr
    n = len(analysed)
    if mem.get("counter_started") == "recorder" and isinstance(mem.get("static"), dict):
        # the counter holds everything allocated since the recorder was made: at the
        # emptiest instant, the static arrays allocated since then plus what else lasts
        other = lowest - (int(mem.get("static_bytes", 0)) - int(mem.get("static_before_counter", 0)))
        if other < 0:
            log.warning("%s: the storage counter's floor is %d bytes below the static arrays made since it "
                        "started (a free of an older array?): no 'other' static bytes", nt.info.name, -other)
        mem["static"] = {**mem["static"], "other": max(0, other)}
        mem["static_bytes"] = sum(int(v) for v in mem["static"].values())
    ops = {op: {"peak": round(a[0] / n), "alloc": round(a[1] / n), "free": round(a[2] / n)} for op, a in per_op.items()}
    mem.update({
        "steps": analysed,
        "carry_in": round(sum(starts) / n - lowest),
        "ops": ops,
        "unattributed_bytes": 0,
        "counter_lowest": lowest,
    })
    nt.meta[MetaKey.MEMORY] = mem
