"""Write a replayed iteration as a Chrome trace (opens in Perfetto / chrome://tracing).

One process per node (plus one for the network links), one thread per device, and a
first process "critical path" that repeats the critical-path ops on one track.
"""

from __future__ import annotations

from pathlib import Path

from dpro.graph.compiled import CompiledGraph
from dpro.gtrace.schema import CATEGORIES
from dpro.jsonio import write_json
from dpro.replayer.critical_path import critical_path_indices
from dpro.replayer.engine import Schedule


def timeline_json(g: CompiledGraph, sched: Schedule) -> dict:
    """The replayed iteration as a Chrome trace (opens in Perfetto): the critical path as
    its own process, then one process per node (the network for links), one thread per device."""
    crit = critical_path_indices(sched)
    on_path = set(crit)
    ev: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "critical path"}},
        {"ph": "M", "name": "process_sort_index", "pid": 0, "tid": 0, "args": {"sort_index": 0}},
    ]
    pid_of: dict[str, int] = {}
    for d, name in enumerate(g.devices):
        proc = "network" if name.startswith("link:") else name.split("/", 1)[0]
        if proc not in pid_of:
            pid_of[proc] = len(pid_of) + 1
            ev.append({"ph": "M", "name": "process_name", "pid": pid_of[proc], "tid": 0, "args": {"name": proc}})
        ev.append({"ph": "M", "name": "thread_name", "pid": pid_of[proc], "tid": d + 1, "args": {"name": name}})
    dev_pid = [pid_of["network" if n.startswith("link:") else n.split("/", 1)[0]] for n in g.devices]
    for i in range(g.n):
        d = int(g.device[i])
        ev.append({
            "ph": "X", "name": g.names[i].split("/", 1)[-1], "cat": CATEGORIES[g.cat[i]],
            "pid": dev_pid[d], "tid": d + 1, "ts": float(sched.start[i]), "dur": float(sched.end[i] - sched.start[i]),
            "args": {"op": g.names[i], "gap_us": float(g.gap[i]), "critical": i in on_path},
        })
    for i in crit:
        ev.append({
            "ph": "X", "name": g.names[i], "cat": CATEGORIES[g.cat[i]], "pid": 0, "tid": 0,
            "ts": float(sched.start[i]), "dur": float(sched.end[i] - sched.start[i]), "args": {"device": g.devices[g.device[i]]},
        })
    return {"traceEvents": ev, "displayTimeUnit": "ms", "otherData": {"producer": "dpro replay", "time_unit": "us"}}


def write_timeline(path: str | Path, g: CompiledGraph, sched: Schedule) -> None:
    write_json(Path(path), timeline_json(g, sched))
