"""The Gantt data of a replayed iteration: one lane per device, the ops as columns.

Small jobs keep every op. A job with more ops than ``max_ops`` keeps every critical-path
op and, per lane, merges the other ops into time bins (each bin drawn in the category
that covers most of it, its hover giving the number of ops merged), so that the page
stays small and opens fast; ``aggregated`` says so and the page repeats it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dpro.gtrace.schema import CATEGORIES, GTrace
from dpro.replayer.critical_path import critical_path_indices
from dpro.replayer.replay import ReplayResult

#: ops drawn one by one up to this many; beyond, per-lane time bins
MAX_OPS = 60_000


@dataclass
class GanttData:
    """Columnar ops of one replayed iteration (µs)."""

    lanes: list[str]
    lane_owner: list[str]
    makespan_us: float
    total_ops: int
    lane: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    cat: np.ndarray
    #: index into ``names``
    name: np.ndarray
    #: index into ``layers`` (-1: unknown)
    layer: np.ndarray
    #: ops merged into the row (1: one real op)
    count: np.ndarray
    crit: np.ndarray
    names: list[str]
    layers: list[str]
    #: the critical path in execution order, as ``dpro replay --json`` gives it
    critical: list[dict] = field(default_factory=list)
    aggregated: bool = False
    bins_per_lane: int = 0

    def to_json(self) -> dict:
        def r(a: np.ndarray) -> list[float]:
            return np.round(a, 3).tolist()  # ns precision: finer is noise

        return {
            "lanes": self.lanes, "lane_owner": self.lane_owner, "makespan_us": self.makespan_us,
            "total_ops": self.total_ops, "shown": int(len(self.start)), "aggregated": self.aggregated,
            "bins_per_lane": self.bins_per_lane, "categories": list(CATEGORIES), "names": self.names,
            "layers": self.layers, "critical": self.critical,
            "ops": {"lane": self.lane.tolist(), "start": r(self.start), "dur": r(self.dur), "cat": self.cat.tolist(),
                    "name": self.name.tolist(), "layer": self.layer.tolist(), "count": self.count.tolist(),
                    "crit": self.crit.astype(int).tolist()},
        }


def _layers_of(trace: GTrace | None, names: list[str]) -> list[str | None]:
    if trace is None:
        return [None] * len(names)
    out: list[str | None] = []
    for n in names:
        node, _, op = n.partition("/")
        nt = trace.nodes.get(node)
        o = nt.ops.get(op.rsplit(":", 1)[0] if op.endswith((":IN", ":OUT")) else op) if nt is not None else None
        out.append(getattr(o, "layer", None))
    return out


def gantt_data(res: ReplayResult, trace: GTrace | None = None, *, max_ops: int = MAX_OPS) -> GanttData:
    """The Gantt of ``res`` (the ops' layers from ``trace`` where it records them)."""
    g, s = res.graph, res.schedule
    crit_idx = critical_path_indices(s)
    on_path = np.zeros(g.n, dtype=bool)
    on_path[crit_idx] = True
    start = np.asarray(s.start, float)
    dur = np.asarray(s.end, float) - start
    lane_owner = [g.owners[int(o)] for o in g.device_owner]
    critical = [{"name": g.names[i], "cat": CATEGORIES[g.cat[i]], "device": g.devices[g.device[i]],
                 "start_us": float(start[i]), "dur_us": float(dur[i])} for i in crit_idx]
    base = dict(lanes=list(g.devices), lane_owner=lane_owner, makespan_us=float(s.makespan), total_ops=g.n,
                critical=critical)
    if g.n <= max_ops:
        keep = np.arange(g.n)
        names = [g.names[i] for i in keep]
        layer_of = _layers_of(trace, names)
        layers = sorted({x for x in layer_of if x})
        li = {x: k for k, x in enumerate(layers)}
        return GanttData(lane=np.asarray(g.device, np.int64), start=start, dur=dur, cat=np.asarray(g.cat, np.int64),
                         name=np.arange(g.n), layer=np.array([li.get(x, -1) for x in layer_of], np.int64),
                         count=np.ones(g.n, np.int64), crit=on_path, names=names, layers=layers, **base)
    return _aggregated(res, on_path, start, dur, max_ops, trace, base)


def _aggregated(res: ReplayResult, on_path: np.ndarray, start: np.ndarray, dur: np.ndarray, max_ops: int,
                trace: GTrace | None, base: dict) -> GanttData:
    """Per lane, the non-critical ops merged into equal time bins; critical ops kept."""
    g = res.graph
    crit_ops = np.flatnonzero(on_path)
    n_lanes = max(1, len(g.devices))
    bins = max(16, (max_ops - len(crit_ops)) // n_lanes)
    span = max(float(res.schedule.makespan), 1e-9)
    rest = ~on_path
    lane = np.asarray(g.device, np.int64)[rest]
    st, du, cat = start[rest], dur[rest], np.asarray(g.cat, np.int64)[rest]
    b = np.minimum((st / span * bins).astype(np.int64), bins - 1)
    key = lane * bins + b
    n_cat = len(CATEGORIES)
    # busy time per (lane, bin, category): the bin is drawn in the category that covers most of it
    per_cat = np.bincount(key * n_cat + cat, weights=du, minlength=n_lanes * bins * n_cat).reshape(-1, n_cat)
    count = np.bincount(key, minlength=n_lanes * bins)
    first = np.full(n_lanes * bins, np.inf)
    np.minimum.at(first, key, st)
    last = np.zeros(n_lanes * bins)
    np.maximum.at(last, key, st + du)
    used = np.flatnonzero(count)
    busy = per_cat[used].sum(axis=1)
    # a bin is drawn from its first op's start for the time its ops are busy (within the bin's span)
    a_start = first[used]
    a_dur = np.minimum(busy, last[used] - first[used])
    a_cat = per_cat[used].argmax(axis=1)
    names = [g.names[i] for i in crit_ops] + ["(merged ops)"]
    layer_of = _layers_of(trace, names[:-1])
    layers = sorted({x for x in layer_of if x})
    li = {x: k for k, x in enumerate(layers)}
    n_c = len(crit_ops)
    return GanttData(
        lane=np.concatenate([np.asarray(g.device, np.int64)[crit_ops], used // bins]),
        start=np.concatenate([start[crit_ops], a_start]),
        dur=np.concatenate([dur[crit_ops], a_dur]),
        cat=np.concatenate([np.asarray(g.cat, np.int64)[crit_ops], a_cat]),
        name=np.concatenate([np.arange(n_c), np.full(len(used), n_c)]),
        layer=np.concatenate([np.array([li.get(x, -1) for x in layer_of], np.int64), np.full(len(used), -1)]),
        count=np.concatenate([np.ones(n_c, np.int64), count[used]]),
        crit=np.concatenate([np.ones(n_c, bool), np.zeros(len(used), bool)]),
        names=names, layers=layers, aggregated=True, bins_per_lane=bins, **base)
