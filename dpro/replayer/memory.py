"""Peak-memory estimation per worker (model: docs/memory.md).

The live bytes of a worker over one iteration are

    static (parameters, persistent gradients, optimizer state, buffers, DDP buckets)
    + carry-in (blocks an earlier iteration allocated that are still live: e.g. the
      gradients of the previous step until ``zero_grad`` frees them)
    + what the ops allocate and free, at the times the schedule gives them.

Each op is summarised by two numbers recorded by the profiler
(:func:`dpro.importers.recording.allocations.attach_allocations`): ``peak``, how far the live bytes
rise above their level at the op's start while it runs (its temporaries included), and
its net change ``alloc - free`` (the blocks it allocates that outlive it, minus the blocks
of other ops it frees: activations freed by their last backward consumer, gradients freed
by ``zero_grad``...). On the timeline an op adds ``peak`` at its start and
``alloc - free - peak`` (never positive) at its end, so its peak is seen while it runs and
concurrent ops add up.

:func:`peak_memory` places the ops at their replayed times (``dpro replay``) or, without
a replay, at their mean measured times.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dpro.gtrace.schema import GTrace, NodeTrace

if TYPE_CHECKING:
    from dpro.replayer.replay import ReplayResult

log = logging.getLogger(__name__)

META_KEY = "memory"


@dataclass(frozen=True, slots=True)
class OpMemory:
    """One op's memory behaviour and when it runs (µs from the iteration start)."""

    op: str
    start: float
    end: float
    #: rise of the live bytes above their level at the op's start, while it runs (>= 0)
    peak: int
    #: live bytes after the op minus before it (alloc - free)
    net: int


@dataclass
class MemoryEstimate:
    """Predicted memory of one worker over one iteration (bytes, µs)."""

    worker: str
    peak_bytes: int
    #: when the peak is reached (µs from the iteration start) and the op running then
    peak_us: float
    peak_op: str | None
    #: live bytes at the iteration start: static + carry-in
    base_bytes: int
    static_bytes: int
    static: dict[str, int]
    carry_in_bytes: int
    #: (µs, live bytes) after each change, in time order
    timeline: list[tuple[float, int]]
    #: "allocations" (recorded per op), "static" (no allocation record: static tensors only)
    source: str
    notes: list[str] = field(default_factory=list)
    #: what is live at the peak, beyond the static part: bytes by the category of the op
    #: that allocated them (FW: activations, BW: gradients and backward buffers, ...), and
    #: "running" (temporaries of the ops running then, and what the blocks do not explain)
    at_peak: dict[str, int] = field(default_factory=dict)

    def to_json(self, timeline: bool = False) -> dict:
        """As ``dpro replay --json`` prints it under ``memory``; ``timeline``: with the
        live-bytes timeline."""
        d = {
            "peak_bytes": self.peak_bytes,
            "peak_us": self.peak_us,
            "peak_op": self.peak_op,
            "base_bytes": self.base_bytes,
            "static_bytes": self.static_bytes,
            "static": dict(self.static),
            "carry_in_bytes": self.carry_in_bytes,
            "at_peak": dict(self.at_peak),
            "source": self.source,
            "notes": list(self.notes),
        }
        if timeline:
            d["timeline"] = [[t, b] for t, b in self.timeline]
        return d


def live_timeline(base: int, ops: list[OpMemory]) -> tuple[list[tuple[float, int]], int, float, str | None]:
    """The live bytes over time from ``base`` and the ops' memory at their times.

    Returns (timeline, peak bytes, time of the peak, op whose start reached it). At equal
    times, ops that end are applied before ops that start (a queue frees before it runs
    the next op); a zero-length op's end comes after every start at its time.
    """
    points: list[tuple[float, int, int, int, str]] = []  # (t, phase, seq, delta, op)
    for k, o in enumerate(ops):
        points.append((o.start, 1, k, o.peak, o.op))
        points.append((o.end, 0 if o.end > o.start else 2, k, o.net - o.peak, o.op))
    points.sort(key=lambda p: (p[0], p[1], p[2]))
    level = base
    peak, peak_t, peak_op = base, 0.0, None
    timeline: list[tuple[float, int]] = [(0.0, base)]
    for t, _, _, d, op in points:
        level += d
        timeline.append((t, level))
        if level > peak:
            peak, peak_t, peak_op = level, t, op
    return timeline, peak, peak_t, peak_op


def live_at(t: float, lifetimes: list, times: dict[str, tuple[float, float]], cat: dict[str, str]) -> dict[str, int]:
    """Bytes of the recorded blocks live at ``t``, by the category of their producer.

    A block lives from its producer's start to its releaser's end; when the releaser runs
    before the producer in the iteration, the block is freed in the next iteration: it is
    live from the producer's start to the iteration's end, and (the previous iteration's
    copy) from 0 to the releaser's end. A block never freed in the window lives from its
    producer's start on. Ends at ``t`` come before starts at ``t``, as on the timeline.
    """
    out: dict[str, int] = defaultdict(int)
    for prod, rel, nbytes in lifetimes:
        if prod not in times or (rel is not None and rel not in times):
            continue
        ps = times[prod][0]
        live = ps <= t
        if rel is not None:
            re_ = times[rel][1]
            live = (ps <= t < re_) if re_ > ps else (ps <= t or t < re_)
        if live:
            out[cat.get(prod, "OTHER")] += int(nbytes)
    return dict(out)


def _static_from_tensors(nt: NodeTrace) -> dict[str, int]:
    """Without the recorder's facts: parameters and gradients from the gradient tensors."""
    b = sum(t.bytes for t in nt.tensors)
    return {"params": b, "grads": b}


def _measured_times(nt: NodeTrace, steps: list[int]) -> dict[str, tuple[float, float]]:
    """op -> mean (start, end) from its step's start, over ``steps``."""
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for e in nt.events:
        if e.step in steps and e.step in nt.steps:
            t0 = nt.steps[e.step][0]
            a = acc[e.op]
            a[0] += e.ts - t0
            a[1] += e.ts + e.dur - t0
            a[2] += 1
    return {op: (a[0] / a[2], a[1] / a[2]) for op, a in acc.items()}


def _owner(name: str, workers: dict[str, dict]) -> tuple[str, str] | None:
    """(worker, op) of a graph op's name "<worker>/<op>", the longest worker name first
    (worker names and op ids may both hold "/"); None for an op of no worker."""
    k = len(name)
    while (k := name.rfind("/", 0, k)) > 0:
        if name[:k] in workers:
            return name[:k], name[k + 1:]
    return None


def _replayed_times(workers: set[str], rr: "ReplayResult") -> dict[str, dict[str, tuple[float, float]]]:
    """Each of ``workers``' ops at their replayed (start, end), µs from the replay's start,
    in one pass over the graph's names (one pass per worker took ~5 ms each on
    param_dlrm_8rank's 11k ops)."""
    g, s = rr.graph, rr.schedule
    t0 = float(s.start.min()) if len(s.start) else 0.0
    out: dict[str, dict[str, tuple[float, float]]] = {w: {} for w in workers}
    slashed = any("/" in w for w in workers)
    for n, a, b in zip(g.names, s.start.tolist(), s.end.tolist()):
        w, sep, rest = n.partition("/")
        if slashed:
            owner = _owner(n, out)
            if owner is None:
                continue
            w, rest = owner
        elif not sep or w not in out:
            continue
        out[w][rest] = (float(a) - t0, float(b) - t0)
    return out


def estimate_node(nt: NodeTrace, times: dict[str, tuple[float, float]]) -> MemoryEstimate:
    """The memory estimate of one node, its ops placed at ``times`` (op -> (start, end) µs)."""
    mem = nt.meta.get(META_KEY) if isinstance(nt.meta, dict) else None
    return estimate_record(nt.info.name, mem, times, {k: o.cat for k, o in nt.ops.items()},
                           fallback_static=_static_from_tensors(nt))


def estimate_record(worker: str, mem: dict | None, times: dict[str, tuple[float, float]], cat: dict[str, str],
                    fallback_static: dict[str, int] | None = None) -> MemoryEstimate:
    """The memory estimate from a memory record (``meta["memory"]``, schema in docs/memory.md).

    ``times``: op -> (start, end) µs; ``cat``: op -> category (for :attr:`MemoryEstimate.at_peak`);
    ``fallback_static``: the static bytes to use when ``mem`` has none.
    """
    notes: list[str] = []
    if not isinstance(mem, dict) or not isinstance(mem.get("static"), dict):
        static = dict(fallback_static or {})
        notes.append("no memory record from dpro's recorder: parameters and gradients only")
        mem = {}
    else:
        static = {str(k): int(v) for k, v in mem["static"].items()}
    ops_mem = mem.get("ops") if isinstance(mem.get("ops"), dict) else None
    carry = int(mem.get("carry_in", 0)) if ops_mem is not None else 0
    static_bytes = sum(static.values())
    base = static_bytes + carry
    ops: list[OpMemory] = []
    missing = 0
    for op, m in (ops_mem or {}).items():
        if op not in times:
            missing += int(m.get("alloc", 0)) + int(m.get("peak", 0))
            continue
        s, e = times[op]
        peak, net = int(m.get("peak", 0)), int(m.get("alloc", 0)) - int(m.get("free", 0))
        ops.append(OpMemory(op, s, e, max(peak, net, 0), net))
    if missing:
        notes.append(f"{missing} bytes allocated by ops that are not in the schedule were left out")
    if ops_mem is None and mem:
        notes.append("the trace has no allocation events (profile_memory off): static tensors only")
    if mem.get("unattributed_bytes"):
        notes.append(f"{mem['unattributed_bytes']} bytes per step allocated outside the main thread's ops are not placed")
    timeline, peak, peak_t, peak_op = live_timeline(base, ops)
    at_peak: dict[str, int] = {}
    if ops_mem is not None:
        at_peak = live_at(peak_t, mem.get("lifetimes") or [], times, cat)
        at_peak["running"] = peak - static_bytes - sum(at_peak.values())
    return MemoryEstimate(
        worker=worker, peak_bytes=peak, peak_us=peak_t, peak_op=peak_op, base_bytes=base,
        static_bytes=static_bytes, static=static, carry_in_bytes=carry, timeline=timeline,
        source="allocations" if ops_mem is not None else "static", notes=notes, at_peak=at_peak,
    )


def peak_memory(gt: GTrace, replay_result: "ReplayResult | None" = None) -> dict[str, MemoryEstimate]:
    """Predicted peak memory and live-bytes timeline of every worker.

    With ``replay_result`` (:func:`dpro.replayer.replay.replay` of ``gt``) the ops run at
    their replayed times; without it at their mean measured times over the steps the
    profiler analysed. Returns worker node name -> :class:`MemoryEstimate`.
    """
    out: dict[str, MemoryEstimate] = {}
    workers = list(gt.workers())
    every = _replayed_times({nt.info.name for nt in workers}, replay_result) if replay_result is not None else None
    for nt in workers:
        if every is not None:
            times = every[nt.info.name]
        else:
            mem = nt.meta.get(META_KEY) if isinstance(nt.meta, dict) else None
            steps = [s for s in (mem or {}).get("steps", []) if s in nt.steps] or sorted(nt.steps)
            times = _measured_times(nt, steps)
        out[nt.info.name] = estimate_node(nt, times)
    return out
