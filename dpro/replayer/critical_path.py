"""The critical path of a replayed iteration: follow, from the op that ends last, the
predecessor (data dependency or device queue) that fixed each op's start."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpro.graph.compiled import CompiledGraph
from dpro.gtrace.schema import CATEGORIES
from dpro.replayer.engine import Schedule


@dataclass(frozen=True, slots=True)
class PathOp:
    name: str
    cat: str
    device: str
    start_us: float
    dur_us: float

    def to_json(self) -> dict:
        return {"name": self.name, "cat": self.cat, "device": self.device, "start_us": self.start_us, "dur_us": self.dur_us}


def critical_path_indices(sched: Schedule) -> list[int]:
    """Op indices on the critical path, in execution order."""
    if not len(sched.end):
        return []
    i = int(np.argmax(sched.end))
    path = []
    seen = set()
    while i >= 0 and i not in seen:
        seen.add(i)
        path.append(i)
        i = int(sched.binder[i])
    return path[::-1]


def critical_path(g: CompiledGraph, sched: Schedule) -> list[PathOp]:
    return [
        PathOp(g.names[i], CATEGORIES[g.cat[i]], g.devices[g.device[i]], float(sched.start[i]), float(sched.end[i] - sched.start[i]))
        for i in critical_path_indices(sched)
    ]
