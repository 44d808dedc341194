"""Where a worker's iteration goes: FW, BW, UPDATE, IO, OTHER compute, host gaps,
communication (total and exposed, i.e. not overlapped by the worker's compute), idle."""

from __future__ import annotations

import numpy as np

from dpro.graph.compiled import CAT_CODE, CompiledGraph
from dpro.replayer.engine import Schedule


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length of the union of intervals."""
    return float(np.sum(np.diff(_merge(starts, ends), axis=1))) if len(starts) else 0.0


def _merge(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    return np.stack([s[idx], np.maximum.reduceat(e, idx)], axis=1)


def _intersection_length(a: np.ndarray, b: np.ndarray) -> float:
    """Length of (union a) ∩ (union b) for merged, sorted interval arrays."""
    i = j = 0
    tot = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i, 0], b[j, 0]), min(a[i, 1], b[j, 1])
        if hi > lo:
            tot += hi - lo
        if a[i, 1] < b[j, 1]:
            i += 1
        else:
            j += 1
    return tot


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
    busy_c = _merge(sched.start[compute], sched.end[compute]) if compute.any() else np.zeros((0, 2))
    busy_m = _merge(sched.start[comm], sched.end[comm]) if comm.any() else np.zeros((0, 2))
    out["exposed_COMM"] = out["COMM"] - _intersection_length(busy_c, busy_m)
    busy = float(np.sum(np.diff(busy_c, axis=1))) + out["exposed_COMM"]
    out["idle"] = max(0.0, iteration_us - busy)
    return out


def breakdown(g: CompiledGraph, sched: Schedule, owners: list[int] | None = None) -> dict[str, float]:
    """Mean breakdown over the given owners (default: all)."""
    it = sched.makespan
    owners = owners if owners is not None else list(range(len(g.owners)))
    rows = [worker_breakdown(g, sched, o, it) for o in owners]
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]} if rows else {}
