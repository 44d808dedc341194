"""An MXNet parameter-server recording as read: each worker's ``rank<r>.json.gz`` +
``rank<r>.meta.json`` (:class:`WorkerRaw`) and each server's ``server<i>.kv.json``
(:class:`ServerRaw`), written by :mod:`dpro.profiler.mxnet`; every field checked."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpro.contracts.recording import MetaKey, ServerKey, rank_trace_name
from dpro.errors import DproInputError
from dpro.importers.mxnet.memory import COUNTER_CAT
from dpro.jsonio import read_json

IGNORED = {"DeleteVariable"}  # engine bookkeeping (a variable freed), ~1 µs, no dependency


@dataclass
class Interval:
    name: str
    ts: float
    end: float
    tid: int


@dataclass
class WorkerRaw:
    rank: int
    meta: dict
    path: Path
    steps: dict[int, tuple[float, float]]
    keys: dict[int, dict]
    ops: list[Interval] = field(default_factory=list)
    #: the storage counter's events (``profile_memory=True``), for :mod:`dpro.importers.mxnet.memory`
    counters: list[dict] = field(default_factory=list)


@dataclass
class ServerRaw:
    rank: int
    path: Path
    host: str
    #: (key, call) -> (ts_call, ts_merged, ts_end, bytes)
    updates: dict[tuple[int, int], tuple[float, float, float, int]]


def _req(d: Any, key: str, typ: type | tuple[type, ...], path: Path) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise DproInputError(path, f"missing field '{key}'")
    v = d[key]
    if not isinstance(v, typ) or isinstance(v, bool):
        raise DproInputError(path, f"field '{key}' has the wrong type ({type(v).__name__})")
    return v


def read_worker(meta_path: Path) -> WorkerRaw:
    """One MXNet worker's recording (its ``rank<r>.meta.json`` and the profile beside it),
    checked field by field: a :class:`DproInputError` names the file and the field."""
    meta = read_json(meta_path)
    rank = _req(meta, MetaKey.RANK, int, meta_path)
    steps: dict[int, tuple[float, float]] = {}
    for i, s in enumerate(_req(meta, MetaKey.STEPS, list, meta_path)):
        try:
            steps[int(s["step"])] = (float(s["ts"]), float(s["dur"]))
        except (KeyError, TypeError, ValueError):
            raise DproInputError(meta_path, f"steps[{i}]: expected {{step, ts, dur}}") from None
        if steps[int(s["step"])][1] < 0:
            raise DproInputError(meta_path, f"steps[{i}]: negative duration")
    if not steps:
        raise DproInputError(meta_path, "no profiled steps")
    keys: dict[int, dict] = {}
    for i, k in enumerate(_req(meta, MetaKey.KEYS, list, meta_path)):
        if not isinstance(k, dict) or not isinstance(k.get("key"), int) or not isinstance(k.get("bytes"), int) \
                or not isinstance(k.get("name"), str) or k["bytes"] < 0:
            raise DproInputError(meta_path, f"keys[{i}]: expected {{key: int, name: str, bytes: int >= 0, ...}}")
        keys[k["key"]] = k
    trace_path = meta_path.with_name(rank_trace_name(rank))
    doc = read_json(trace_path)
    evs = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(evs, list):
        raise DproInputError(trace_path, "not an mx.profiler Chrome trace (no traceEvents list)")
    mem = meta.get(MetaKey.MEMORY)
    if mem is not None and not (isinstance(mem, dict) and isinstance(mem.get("static"), dict)
                                and all(isinstance(v, int) and v >= 0 for v in mem["static"].values())):
        raise DproInputError(meta_path, "memory: expected {static: {kind: bytes >= 0}, ...}")
    w = WorkerRaw(rank, meta, trace_path, steps, keys)
    open_: dict[tuple[Any, Any], list[dict]] = defaultdict(list)
    for i, e in enumerate(evs):
        if isinstance(e, dict) and e.get("ph") == "C" and e.get("cat") == COUNTER_CAT:
            w.counters.append(e)
            continue
        if not isinstance(e, dict) or e.get("cat") != "operator" or e.get("ph") not in ("B", "E"):
            continue
        ts = e.get("ts")
        if not isinstance(ts, (int, float)) or not isinstance(e.get("name"), str):
            raise DproInputError(trace_path, f"traceEvents[{i}]: operator event without a name or numeric ts")
        where = (e.get("pid"), e.get("tid"))
        if e["ph"] == "B":
            open_[where].append(e)
            continue
        stack = open_[where]
        j = next((j for j in range(len(stack) - 1, -1, -1) if stack[j]["name"] == e["name"]), None)
        if j is None:
            raise DproInputError(trace_path, f"traceEvents[{i}]: end of '{e['name']}' without its begin")
        b = stack.pop(j)
        if ts < b["ts"]:
            raise DproInputError(trace_path, f"traceEvents[{i}]: '{e['name']}' ends before it begins")
        if e["name"] not in IGNORED:
            w.ops.append(Interval(e["name"], float(b["ts"]), float(ts), hash(where)))
    if not w.ops:
        raise DproInputError(trace_path, "no operator events (was mx.profiler running?)")
    return w


def read_server(path: Path) -> ServerRaw:
    """One PS server's recording (``server<i>.kv.json``: every update it ran, timed), checked."""
    d = read_json(path)
    rank = _req(d, ServerKey.RANK, int, path)
    rows = _req(d, ServerKey.UPDATES, list, path)
    ups: dict[tuple[int, int], tuple[float, float, float, int]] = {}
    for i, r in enumerate(rows):
        if (not isinstance(r, list) or len(r) != 6 or not all(isinstance(x, (int, float)) for x in r)
                or not (r[2] <= r[3] <= r[4]) or r[5] < 0):
            raise DproInputError(path, f"updates[{i}]: expected [key, call, ts_call <= ts_merged <= ts_end, bytes]")
        ups[(int(r[0]), int(r[1]))] = (float(r[2]), float(r[3]), float(r[4]), int(r[5]))
    return ServerRaw(rank, path, str(d.get(ServerKey.HOST) or "host0"), ups)
