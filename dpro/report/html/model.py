"""What the HTML report shows, as plain data (µs and bytes): built from a prepared
:class:`~dpro.job.Job`, its replay and, when asked for, its optimisation.

Sections that other analyses add (a what-if, an oracle) come in as objects with a
``to_json()``; any of their lists of ``{"devices" | "workers": N, "iteration_us": t}``
points is drawn as a scaling curve (:func:`scaling_points`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dpro.replayer.breakdown import worker_breakdown
from dpro.report.html.exposed import exposed_by_collective
from dpro.report.html.gantt import MAX_OPS, GanttData, gantt_data

if TYPE_CHECKING:
    from dpro.gtrace.schema import GTrace
    from dpro.job import Job
    from dpro.optimizer.optimize import OptimizeResult
    from dpro.replayer.replay import ReplayResult


class HasJson(Protocol):
    def to_json(self) -> dict: ...


@dataclass
class JsonResult:
    """A result already in JSON form (read from a file: ``dpro report --result``)."""

    data: dict

    def to_json(self) -> dict:
        return self.data


@dataclass
class ReportData:
    """Everything the page draws; :meth:`to_json` is embedded in it as one JSON object."""

    title: str
    summary: dict
    breakdown: list[dict]
    exposed: list[dict]
    memory: list[dict]
    gantt: GanttData
    optimize: dict | None = None
    bucket_sweep: list[dict] | None = None
    extra: dict[str, dict] = field(default_factory=dict)
    scaling: list[dict] = field(default_factory=list)
    timeline_file: str | None = None

    def to_json(self) -> dict:
        return {
            "title": self.title, "summary": self.summary, "breakdown": self.breakdown, "exposed": self.exposed,
            "memory": self.memory, "gantt": self.gantt.to_json(), "optimize": self.optimize,
            "bucket_sweep": self.bucket_sweep, "extra": self.extra, "scaling": self.scaling,
            "timeline_file": self.timeline_file, "units": {"time": "us", "size": "bytes"},
        }


def job_info(job: Job) -> dict:
    """What the summary says about the job itself (from its manifest)."""
    m = job.trace.manifest
    return {"framework": m.framework, "library": m.library, "scheme": m.scheme, "world_size": m.world_size,
            "workers": len(job.trace.workers())}


def _summary(r: ReplayResult, info: dict) -> dict:
    ov = r.profiling_overhead
    return {
        "predicted_iteration_us": r.predicted_iteration_us, "measured_iteration_us": r.measured_iteration_us,
        "error_pct": r.error_pct, "predicted_unprofiled_iteration_us": r.predicted_unprofiled_iteration_us,
        "profiling_overhead": None if ov is None else ov.to_json(), "steps": r.steps, "notes": r.notes,
        "ops": r.graph.n, "devices": len(r.graph.devices), **info,
        "collectives_expanded": r.build.expanded, "collectives_measured": r.build.kept_coarse,
    }


def _breakdown(r: ReplayResult, owners: list[int]) -> list[dict]:
    g, s = r.graph, r.schedule
    rows = []
    for o in owners:
        for part, us in worker_breakdown(g, s, o, s.makespan).items():
            rows.append({"worker": g.owners[o], "part": part, "us": us})
    return rows


def _memory(r: ReplayResult) -> list[dict]:
    out = []
    for w, m in r.memory.items():
        out.append({"worker": w, "source": m.source, "peak_bytes": m.peak_bytes, "peak_us": m.peak_us,
                    "peak_op": m.peak_op, "static_bytes": m.static_bytes,
                    "timeline": [{"t_us": float(t), "bytes": int(b)} for t, b in m.timeline], "notes": m.notes})
    return out


def _optimize(o: OptimizeResult) -> dict:
    j = o.to_json()
    return {"baselines_us": j["baselines_us"], "best_us": j["best_us"], "baseline_us": j["baseline_us"],
            "speedup": j["speedup"], "best": j["best"], "realized": j["realized"], "notes": j["notes"],
            "time_s": j["time_s"]}


def bucket_sweep(o: OptimizeResult, points: int = 24) -> list[dict] | None:
    """For a PyTorch DDP job: the predicted iteration time for each ``bucket_cap_mb`` of a
    geometric sweep (the optimizer's job model and DDP's bucketing), the default 25 MiB
    included; None for other jobs."""
    from dpro.optimizer import libraries as lib
    from dpro.optimizer.evaluate import iteration_us
    from dpro.optimizer.optimize import ddp_strategy

    m = o.model
    if not (m.framework == "pytorch" and m.library in ("gloo", "nccl") and m.units and all(u.params for u in m.units)):
        return None
    sizes = [u.bytes for u in m.units]
    lo, hi = max(min(sizes), 1024) / lib.MiB, max(sum(sizes), 2048) / lib.MiB * 2
    caps = sorted(set(np.round(np.geomspace(lo, hi, points), 4).tolist()) | {lib.DDP_DEFAULT_CAP_BYTES / lib.MiB})
    out = []
    for cap in caps:
        st = ddp_strategy(m, cap)
        out.append({"bucket_cap_mb": cap, "iteration_us": iteration_us(m, st), "buckets": len(st.groups),
                    "default": cap == lib.DDP_DEFAULT_CAP_BYTES / lib.MiB})
    return out


def scaling_points(obj: Any) -> list[dict]:
    """Every list of ``{"devices" | "workers": N, "iteration_us": t}`` points in a result's
    JSON (searched recursively), as ``{"series", "devices", "iteration_us"}`` rows; points
    that name a ``strategy`` (the oracle's) make one series per strategy, infeasible ones
    are left out."""
    rows: list[dict] = []

    def walk(x: Any, path: str) -> None:
        if isinstance(x, list) and x and all(isinstance(p, dict) and "iteration_us" in p
                                             and ("devices" in p or "workers" in p) for p in x):
            for p in x:
                if p.get("feasible") is False or p["iteration_us"] is None:
                    continue  # an oracle strategy beyond its limit has no time to draw
                series = path or "scaling"
                if "strategy" in p:  # the oracle: one curve per strategy
                    series = f"{series}: {p['strategy']}"
                rows.append({"series": series, "devices": p.get("devices", p.get("workers")),
                             "iteration_us": p["iteration_us"]})
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]")

    walk(obj, "")
    return rows


def build_report(job: Job, *, optimized: OptimizeResult | None = None, extra: dict[str, HasJson] | None = None,
                 timeline_file: str | None = None, max_ops: int = MAX_OPS, sweep: bool = True) -> ReportData:
    """The report of ``job``: its replay, and ``optimized`` (``job.optimize()``) and the
    ``extra`` results (``{section title: result with to_json()}``) where given."""
    r = job.replay()
    workers = [i for i, o in enumerate(r.graph.owners)
               if o in job.trace.nodes and job.trace.nodes[o].info.role == "worker"]
    title = str(job.path) if job.path is not None else (job.trace.source or "job")
    return report_of_replay(r, title=title, info=job_info(job), workers=workers, trace=job.trace, optimized=optimized,
                            extra=extra, timeline_file=timeline_file, max_ops=max_ops, sweep=sweep)


def report_of_replay(r: ReplayResult, *, title: str, info: dict, workers: list[int] | None = None,
                     trace: GTrace | None = None, optimized: OptimizeResult | None = None,
                     extra: dict[str, HasJson] | None = None, timeline_file: str | None = None,
                     max_ops: int = MAX_OPS, sweep: bool = True) -> ReportData:
    """:func:`build_report` from a replay alone (``workers``: the owners that are workers,
    default all; ``trace``: where the ops' layers come from; ``info``: :func:`job_info`)."""
    owners = list(range(len(r.graph.owners))) if workers is None else workers
    extra_json = {k: v.to_json() for k, v in (extra or {}).items()}
    scaling = []
    for k, v in extra_json.items():
        scaling += [{**p, "series": f"{k}: {p['series']}"} for p in scaling_points(v)]
    return ReportData(
        title=title, summary=_summary(r, info), breakdown=_breakdown(r, owners),
        exposed=exposed_by_collective(r.graph, r.schedule, owners), memory=_memory(r),
        gantt=gantt_data(r, trace, max_ops=max_ops),
        optimize=None if optimized is None else _optimize(optimized),
        bucket_sweep=None if (optimized is None or not sweep) else bucket_sweep(optimized),
        extra=extra_json, scaling=scaling, timeline_file=timeline_file,
    )
