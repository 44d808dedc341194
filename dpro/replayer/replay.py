"""Replay a gTrace end to end: build the global DFG, simulate, analyse."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from dpro.graph.compiled import CompiledGraph
from dpro.graph.global_dfg import BuildInfo, BuildOptions, build_global_dfg
from dpro.graph.stats import STALL, OpStats, measured_iteration_us, stalled_steps, typical_steps
from dpro.gtrace.schema import GTrace
from dpro.replayer.breakdown import breakdown
from dpro.replayer.critical_path import PathOp, critical_path
from dpro.replayer.engine import Schedule, simulate

if TYPE_CHECKING:
    from dpro.alignment import AlignResult
    from dpro.replayer.memory import MemoryEstimate
    from dpro.graph.overhead import Overhead


@dataclass
class ReplayResult:
    predicted_iteration_us: float
    measured_iteration_us: float | None
    breakdown_us: dict[str, float]
    critical_path: list[PathOp]
    graph: CompiledGraph
    schedule: Schedule
    build: BuildInfo
    notes: list[str] = field(default_factory=list)
    #: the profiled steps the prediction and the measurement are averaged over
    steps: list[int] = field(default_factory=list)
    #: the clock alignment done before replaying (None: not asked for)
    alignment: AlignResult | None = None
    #: predicted peak memory per worker (filled in by :meth:`dpro.job.Job.replay`)
    memory: dict[str, MemoryEstimate] = field(default_factory=dict)
    #: the profiling overhead dpro's recorder measured, median over the workers (None: not measured)
    profiling_overhead: Overhead | None = None
    #: the prediction with each worker's measured profiling overhead taken out of its CPU ops
    predicted_unprofiled_iteration_us: float | None = None

    def critical_path_rows(self) -> list[dict]:
        """The critical path as plain rows (name, cat, device, start_us, dur_us, ...), e.g. for pandas."""
        return [p.to_json() for p in self.critical_path]

    def breakdown_rows(self) -> list[dict]:
        """The breakdown as plain rows: part, time (µs), share of the predicted iteration (%)."""
        it = self.predicted_iteration_us or 1.0
        return [{"part": k, "us": v, "pct": 100.0 * v / it} for k, v in self.breakdown_us.items()]

    @property
    def error_pct(self) -> float | None:
        m = self.measured_iteration_us
        return None if not m else 100.0 * (self.predicted_iteration_us - m) / m

    def to_json(self) -> dict:
        """Exactly ``dpro replay --json``."""
        lc = self.build.link_cost
        return {
            "predicted_iteration_us": self.predicted_iteration_us,
            "measured_iteration_us": self.measured_iteration_us,
            "error_pct": self.error_pct,
            "breakdown_us": self.breakdown_us,
            "critical_path": [p.to_json() for p in self.critical_path],
            "ops": self.graph.n,
            "devices": len(self.graph.devices),
            "collectives_expanded": self.build.expanded,
            "collectives_measured": self.build.kept_coarse,
            "link_cost": None if lc is None else {"alpha_us": lc.alpha, "beta_us_per_byte": lc.beta, "samples": lc.samples, "fit_error": lc.fit_error,
                                                "shapes": lc.shapes},
            "steps": self.steps,
            "clock_offsets_us": None if self.alignment is None else self.alignment.offsets_us,
            "clock_alignment": None if self.alignment is None else {
                k: self.alignment.to_json()[k] for k in ("reference", "status", "solver", "iterations", "time_s")},
            "notes": self.notes,
            "memory": {w: m.to_json() for w, m in self.memory.items()},
            "profiling_overhead": None if self.profiling_overhead is None else self.profiling_overhead.to_json(),
            "predicted_unprofiled_iteration_us": self.predicted_unprofiled_iteration_us,
        }


def replay(gt: GTrace, options: BuildOptions | None = None, *, align_clocks: bool = True) -> ReplayResult:
    """Predict one iteration of ``gt``: build its global DFG, simulate it, analyse.

    With ``align_clocks`` (the default) the nodes' clocks are first put on one clock
    (:func:`dpro.alignment.on_one_clock`); nothing changes when every node runs on one
    host. :func:`dpro.open` does this once for every analysis of a job.
    """
    alignment = None
    if align_clocks:
        from dpro.alignment import on_one_clock

        gt, alignment = on_one_clock(gt)
    return replay_on_one_clock(gt, options, alignment=alignment)


def replay_on_one_clock(gt: GTrace, options: BuildOptions | None = None, *, alignment: AlignResult | None = None,
                        stats: dict[str, dict[str, OpStats]] | None = None) -> ReplayResult:
    """:func:`replay` of a ``gt`` whose nodes already share one clock; ``alignment``: the
    alignment that put them there (its notes join the replay's), if any; ``stats``: the
    nodes' op statistics over the steps ``options`` select, where the caller has them."""
    options = options or BuildOptions()
    step_notes = []
    if not options.steps:
        options = replace(options, steps=typical_steps(list(gt.nodes.values()), gt.manifest.steps))
        stalls = stalled_steps(list(gt.nodes.values()), gt.manifest.steps)
        if stalls:  # named: the measured iteration leaves them out too
            step_notes.append(f"steps {stalls} left out as stalls (a rank's step above {STALL:g}x the median "
                              f"of the slowest rank's step); replayed and measured over steps {list(options.steps)}")
    g, info = build_global_dfg(gt, options, stats=stats)
    sched = simulate(g)
    workers = [i for i, o in enumerate(g.owners) if gt.nodes[o].info.role == "worker"]
    steps = options.steps
    return ReplayResult(
        predicted_iteration_us=sched.makespan,
        measured_iteration_us=measured_iteration_us(list(gt.nodes.values()), steps),
        breakdown_us=breakdown(g, sched, workers),
        critical_path=critical_path(g, sched),
        graph=g,
        schedule=sched,
        build=info,
        notes=list(gt.notes) + step_notes + info.notes + alignment_notes(alignment),
        steps=list(steps),
        alignment=alignment,
    )


def alignment_notes(alignment: AlignResult | None) -> list[str]:
    """What an alignment says worth repeating in a replay: its notes where it moved clocks,
    and inconsistent events in any case."""
    if alignment is None:
        return []
    return [n for n in alignment.notes if alignment.status != "trivial" or n.startswith("inconsistent events")]
