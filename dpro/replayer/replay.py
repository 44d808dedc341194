"""Replay a gTrace end to end: build the global DFG, simulate, analyse."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from dpro.graph.compiled import CompiledGraph
from dpro.graph.global_dfg import BuildInfo, BuildOptions, build_global_dfg
from dpro.graph.stats import measured_iteration_us, typical_steps
from dpro.gtrace.schema import GTrace
from dpro.replayer.breakdown import breakdown
from dpro.replayer.critical_path import PathOp, critical_path
from dpro.replayer.engine import Schedule, simulate

if TYPE_CHECKING:
    from dpro.alignment import AlignResult


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

    @property
    def error_pct(self) -> float | None:
        m = self.measured_iteration_us
        return None if not m else 100.0 * (self.predicted_iteration_us - m) / m

    def to_json(self) -> dict:
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
        }


def replay(gt: GTrace, options: BuildOptions | None = None, *, align_clocks: bool = True) -> ReplayResult:
    """Predict one iteration of ``gt``.

    With ``align_clocks`` (the default) the nodes' clocks are first put on one clock
    (:mod:`dpro.alignment`); nothing changes when every node runs on one host.
    """
    options = options or BuildOptions()
    alignment = None
    if align_clocks:
        from dpro.alignment import align, apply_offsets

        alignment = align(gt)
        if alignment.status != "trivial":
            gt = apply_offsets(gt, alignment.offsets_us)
    if not options.steps:
        options = replace(options, steps=typical_steps(list(gt.nodes.values()), gt.manifest.steps))
    g, info = build_global_dfg(gt, options)
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
        notes=list(gt.notes) + info.notes + ([] if alignment is None else [
            n for n in alignment.notes if alignment.status != "trivial" or n.startswith("inconsistent events")]),
        steps=list(steps),
        alignment=alignment,
    )
