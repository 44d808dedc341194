"""The profiler's own cost, measured by the recorder, and how to take it out.

dpro's recorder times every call of the decorated step function (``rank<r>.meta.json``:
``step_wall_us`` for the warm-up and the window, ``step_wall_after_us`` for up to
``DPRO_AFTER_STEPS`` calls after it), so each rank knows its pace without the profiler and
with it. Preferred: the calls after the window (first half skipped: the ranks write their
traces at different times, the job settles again), against the window (first call
skipped: the profiler starting), medians of each. Without them: the fastest warm-up call (first half skipped:
lazy initialisation) against the fastest window call, since warm-up calls are still
getting faster (measured: 190 ms down to 97 ms over 8 warm-up calls of a 2-rank mlp; 4 TF
workers on 2 cores had not settled after 5). Their ratio, applied to every op the
worker ran on its CPU (:func:`scale_overhead`), is how :func:`dpro.optimizer.job_model.job_model`
and ``dpro replay`` predict the job as it runs unprofiled.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dpro.gtrace.schema import GTrace, NodeTrace

if TYPE_CHECKING:
    from dpro.graph.stats import OpStats

#: device name prefixes of accelerator streams (Kineto imports: ``gpu0:s7``; tests: ``cuda:0``)
ACCELERATORS = ("gpu", "cuda")


@dataclass(frozen=True)
class Overhead:
    """Wall µs of a step without and with the profiler (the recorder's clock)."""

    unprofiled_us: float
    profiled_us: float
    #: the recorder ran the job differently in the window (``window_changes_job`` in the rank's
    #: meta; MXNet: operator bulking off), so a slower pace outside it is the job's, not noise
    both_ways: bool = False

    @property
    def pct(self) -> float:
        return 100.0 * (self.profiled_us / self.unprofiled_us - 1.0)

    @property
    def factor(self) -> float:
        """Unprofiled / profiled pace, the scale of the job's CPU ops without the profiler: 1.0
        when the window was not slower, unless the recorder changed the job in it."""
        if self.profiled_us <= 0 or self.unprofiled_us <= 0:
            return 1.0
        if self.profiled_us > self.unprofiled_us or self.both_ways:
            return self.unprofiled_us / self.profiled_us
        return 1.0

    def to_json(self) -> dict:
        return {"unprofiled_step_us": self.unprofiled_us, "profiled_step_us": self.profiled_us,
                "overhead_pct": self.pct, "window_changes_job": self.both_ways}


def measured_overhead(nt: NodeTrace) -> Overhead | None:
    """The node's profiling overhead, or None without enough unprofiled calls timed.

    With >= 6 calls after the window: the median of their second half against the
    window's median (first call skipped). The first half is left out: right after the
    window the ranks write their traces at different times and the job takes a few calls
    to find its pace again (measured: 5 calls of 75-111 ms, then 44, on a 2-worker TF
    convnet). Medians, because a synchronous job's ranks wait for each other, so one
    call of one rank is no pace (a rank that came late to a collective waits less and its
    next call is longer: 59 ms calls among 115 ms ones on 4 TF workers). Otherwise the
    warm-up's fastest call (second half; >= 4 warm-up calls) against the window's
    fastest: the warm-up is still speeding up, so its median would overstate the
    unprofiled pace."""
    meta = nt.meta if isinstance(nt.meta, dict) else {}
    walls, steps, after = meta.get("step_wall_us"), meta.get("steps"), meta.get("step_wall_after_us")
    both = bool(meta.get("window_changes_job"))
    if not isinstance(walls, list) or not isinstance(steps, list) or not steps:
        return None
    first = int(min(steps))
    warm = [float(w) for w in walls[:first]]
    window = [float(w) for w in walls[first:]]
    if not window:
        return None
    window = window[1:] or window
    after = [float(w) for w in after] if isinstance(after, list) else []
    if len(after) >= 6:
        import statistics  # here: only a recorder's trace has these (statistics costs ~5 ms to import)

        settled = after[len(after) // 2:]
        return Overhead(statistics.median(settled), statistics.median(window), both)
    if len(warm) < 4:
        return None
    return Overhead(min(warm[len(warm) // 2:]), min(window), both)


def scale_overhead(ov: Overhead, ops: list[Any]) -> float:
    """Take the overhead off ``ops`` (a worker's ops that ran on its CPU: objects with
    mutable ``dur`` and ``gap`` µs): each one's gap and own time times ``ov.unprofiled_us /
    ov.profiled_us`` (:attr:`Overhead.factor`). Returns that factor (1.0: nothing changed).

    A ratio, not an equal share of the difference per op: what the recorder measures is
    the step's wall time with and without the profiler, and on a machine where the ranks
    share cores the profiler's work slows every op of every rank, collectives waiting on
    a starved peer included, not a fixed cost per op (4 TF workers on 2 cores: +35.6 %
    against unprofiled runs with an equal share, +15.5 % with the ratio). Link time is
    not the CPU's and keeps its cost."""
    r = ov.factor
    if r == 1.0 or not ops:
        return 1.0
    for o in ops:
        o.gap *= r
        o.dur *= r
    return r


def job_overhead(nodes: list[NodeTrace]) -> Overhead | None:
    """Median over the nodes that measured one."""
    ovs = [o for o in (measured_overhead(nt) for nt in nodes) if o is not None]
    if not ovs:
        return None
    import statistics

    return Overhead(statistics.median(o.unprofiled_us for o in ovs), statistics.median(o.profiled_us for o in ovs),
                    any(o.both_ways for o in ovs))


def stats_without_overhead(gt: GTrace, stats: dict[str, dict[str, OpStats]]) -> tuple[dict[str, dict[str, OpStats]], list[str]]:
    """``stats`` (``{node: {op: OpStats}}``) with each worker's measured profiling overhead
    taken off the ops it ran on its CPU (:func:`scale_overhead` by the worker's own
    :func:`measured_overhead`): host-side ops and, in a job with no accelerator, its
    collectives' own parts (gloo, Horovod on CPU). The scaled ops are copies: ``stats`` is
    left as it is. Returns the stats and one note per worker scaled. ``dpro replay``'s
    prediction without the overhead and ``dpro oracle``'s layer times both use it."""
    out = dict(stats)
    notes: list[str] = []
    for name, nt in gt.nodes.items():
        ov = measured_overhead(nt) if nt.info.role == "worker" else None
        if ov is None or name not in stats:
            continue
        cpu_only = not any(op.device.startswith(ACCELERATORS) for op in nt.ops.values())
        ids = [op.id for op in nt.ops.values() if op.id in stats[name]
               and (op.device.startswith("cpu") or (cpu_only and op.cat == "COMM"))]
        scaled = [replace(stats[name][i]) for i in ids]
        r = scale_overhead(ov, scaled)
        if r != 1.0:
            out[name] = {**stats[name], **dict(zip(ids, scaled))}
            notes.append(f"{name}: profiling overhead {ov.pct:+.1f}% (recorder's clock) removed: {len(ids)} ops "
                         f"on its CPU{' (collectives included)' if cpu_only else ''} scaled by {r:.3f}")
    return out, notes
