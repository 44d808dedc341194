"""Replay a gTrace end to end: build the global DFG, simulate, analyse."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from dpro.graph.compiled import CompiledGraph
from dpro.graph.global_dfg import BuildInfo, BuildOptions, build_global_dfg
from dpro.graph.stats import measured_iteration_us, typical_steps
from dpro.gtrace.schema import GTrace
from dpro.replayer.breakdown import breakdown
from dpro.replayer.critical_path import PathOp, critical_path
from dpro.replayer.engine import Schedule, simulate


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
            "link_cost": None if lc is None else {"alpha_us": lc.alpha, "beta_us_per_byte": lc.beta, "samples": lc.samples, "fit_error": lc.fit_error},
            "steps": self.steps,
            "notes": self.notes,
        }


def replay(gt: GTrace, options: BuildOptions | None = None) -> ReplayResult:
    """Predict one iteration of ``gt``."""
    options = options or BuildOptions()
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
        notes=list(gt.notes) + info.notes,
        steps=list(steps),
    )
