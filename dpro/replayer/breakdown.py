"""Where a worker's iteration goes: FW, BW, UPDATE, IO, OTHER compute, host gaps,
communication (total and exposed, i.e. not overlapped by the worker's compute), idle."""

from __future__ import annotations

import numpy as np

from dpro.graph.compiled import CAT_CODE, CompiledGraph
from dpro.graph.intervals import intersection_length, merge, union_length
from dpro.replayer.engine import Schedule


def worker_breakdown(g: CompiledGraph, sched: Schedule, owner: int, iteration_us: float) -> dict[str, float]:
    """Breakdown (µs) for one owner (node) of the graph."""
    own = g.device_owner[g.device] == owner
    comm_dev = g.device_is_comm[g.device]
    dur = sched.end - sched.start
    own_time = dur - g.gap
    out: dict[str, float] = {}
    compute = own & ~comm_dev
    on_gpu = np.array([d.split("/", 1)[-1].startswith("gpu") for d in g.devices], dtype=bool)[g.device]
    if (compute & on_gpu).any():
        compute &= on_gpu  # on a GPU worker the host only launches: count the streams
    for name in ("FW", "BW", "UPDATE", "IO", "OTHER"):
        out[name] = float(own_time[compute & (g.cat == CAT_CODE[name])].sum())
    out["host_gap"] = float(g.gap[compute].sum())
    comm = own & (comm_dev | (g.cat == CAT_CODE["COMM"]))
    out["COMM"] = union_length(sched.start[comm], sched.end[comm])
    busy_c = merge(sched.start[compute], sched.end[compute])
    busy_m = merge(sched.start[comm], sched.end[comm])
    out["exposed_COMM"] = out["COMM"] - intersection_length(busy_c, busy_m)
    busy = float((busy_c[1] - busy_c[0]).sum()) + out["exposed_COMM"]
    out["idle"] = max(0.0, iteration_us - busy)
    return out


def breakdown(g: CompiledGraph, sched: Schedule, owners: list[int] | None = None) -> dict[str, float]:
    """Mean breakdown over the given owners (default: all)."""
    it = sched.makespan
    owners = owners if owners is not None else list(range(len(g.owners)))
    rows = [worker_breakdown(g, sched, o, it) for o in owners]
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]} if rows else {}
