"""One rank's TensorFlow recording (``rank<r>.json.gz``, written by dpro's TF recorder) as read:
the partition graphs TF executed and each op's execution per profiled step; and the names
the DFG and the Horovod part both use. Turned into a gTrace by :mod:`dpro.importers.tensorflow.convert`."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from dpro.contracts.recording import TF_EVENT_DONE, TF_EVENT_OP, TF_EVENT_START, TF_RANK_FORMAT, TFRankKey
from dpro.errors import DproInputError
from dpro.jsonio import read_json

#: names shared by the DFG (convert.py) and the Horovod part (horovod.py)
STEP_END_ID = "STEP_END@cpu:main"
BW_SCOPES = ("gradient_tape/", "gradients/")
HOROVOD_ALLREDUCE = "HorovodAllreduce"
#: one op for a group of tensors (hvd.grouped_allreduce, DistributedOptimizer(groups=...)); Horovod
#: names its i-th tensor ``<node>_<i>of<n>`` (i from 1)
HOROVOD_GROUPED = "HorovodGroupedAllreduce"
ALLREDUCES = (HOROVOD_ALLREDUCE, HOROVOD_GROUPED)


@dataclass
class GraphNode:
    """One node of a graph TF executed (after Grappler)."""

    name: str
    op: str
    inputs: list[str]  # node names (data and control)
    data: list[str] = field(default_factory=list)  # data inputs as recorded (``node:k``)


@dataclass
class OpInstance:
    """One op's execution in one step."""

    ts: float
    end: float
    thread: str
    op_type: str
    done: float | None = None  # async kernels: end of the Done callback


@dataclass
class RankRecording:
    """One rank's recording: its profiled steps' windows, each traced node's execution per step,
    the merged graph, and the order Horovod's ops were created in."""

    rank: int
    path: Path
    steps: dict[int, tuple[float, float]]
    #: step -> node -> instance
    inst: dict[int, dict[str, OpInstance]]
    graph: dict[str, GraphNode]
    hvd_order: list[str]
    meta: dict
    notes: list[str] = field(default_factory=list)
    repeated: int = 0


def _parse_graphs(path: Path, graphs: object, hits: Counter) -> dict[str, GraphNode]:
    """The recorded graph that holds most of the traced nodes, merged with any other that holds some."""
    if not isinstance(graphs, list):
        raise DproInputError(path, "'graphs' must be a list of node lists")
    parsed: list[dict[str, GraphNode]] = []
    seen: set[tuple[str, ...]] = set()
    for g in graphs:
        if not isinstance(g, list):
            raise DproInputError(path, "each graph must be a list of nodes")
        nodes: dict[str, GraphNode] = {}
        for n in g:
            if not isinstance(n, dict) or not isinstance(n.get("name"), str) or not isinstance(n.get("op"), str):
                raise DproInputError(path, f"graph node must have string 'name' and 'op' (got {str(n)[:80]})")
            ins = [str(i).split(":")[0] for i in (n.get("inputs") or [])]
            ins += [str(i) for i in (n.get("control") or [])]
            nodes[n["name"]] = GraphNode(n["name"], n["op"], ins, [str(i) for i in (n.get("inputs") or [])])
        key = tuple(sorted(nodes))
        if key in seen:
            continue
        seen.add(key)
        parsed.append(nodes)
    scored = sorted(((sum(hits[n] for n in g), i) for i, g in enumerate(parsed)), reverse=True)
    out: dict[str, GraphNode] = {}
    for score, i in scored:
        if score == 0:
            break
        for name, node in parsed[i].items():
            out.setdefault(name, node)
    return out


def read_rank(path: Path, meta: dict) -> RankRecording:
    """Read ``rank<r>.json.gz`` (``meta``: its ``.meta.json``, or {}); a one-line error on anything malformed."""
    d = read_json(path)
    if not isinstance(d, dict) or d.get(TFRankKey.FORMAT) != TF_RANK_FORMAT:
        raise DproInputError(path, f"not a dpro TensorFlow rank recording (format {TF_RANK_FORMAT!r} expected)")
    if not isinstance(d.get(TFRankKey.RANK), int):
        raise DproInputError(path, "'rank' must be an integer")
    steps: dict[int, tuple[float, float]] = {}
    raw_steps = d.get(TFRankKey.STEPS)
    if not isinstance(raw_steps, dict):
        raise DproInputError(path, "'steps' must map step numbers to [ts, dur]")
    for k, v in raw_steps.items():
        try:
            steps[int(k)] = (float(v[0]), float(v[1]))
        except (TypeError, ValueError, IndexError):
            raise DproInputError(path, f"step {k!r}: expected [ts, dur] in µs, got {v!r}") from None
    if not steps:
        raise DproInputError(path, "no profiled step was recorded (no dpro_step annotation in the trace)")
    events = d.get(TFRankKey.EVENTS)
    if not isinstance(events, list):
        raise DproInputError(path, "'events' must be a list")
    order = sorted(steps)
    starts = [steps[s][0] for s in order]
    inst: dict[int, dict[str, OpInstance]] = {s: {} for s in order}
    pending: dict[tuple[int, str], OpInstance] = {}
    hits: Counter = Counter()
    repeated = 0
    for e in events:
        try:
            name, op_type, thread, ts, dur = str(e[0]), str(e[1]), str(e[2]), float(e[3]), float(e[4])
            kind = str(e[5]) if len(e) > 5 else TF_EVENT_OP
        except (TypeError, ValueError, IndexError, KeyError):
            raise DproInputError(path, f"malformed event {str(e)[:80]} "
                                       "(expected [node, type, thread, ts, dur, kind])") from None
        if dur < 0:
            raise DproInputError(path, f"event {name!r} has a negative duration")
        i = bisect.bisect_right(starts, ts) - 1
        if i < 0:
            continue
        s = order[i]
        if kind == TF_EVENT_DONE:
            x = pending.pop((s, name), None)
            if x is not None:
                x.done = ts + dur
            continue
        if ts > steps[s][0] + steps[s][1]:
            continue  # between steps
        hits[name] += 1
        cur = inst[s].get(name)
        if cur is not None:  # an op run more than once in a step (loops): span all runs
            repeated += 1
            cur.end = max(cur.end, ts + dur)
            continue
        x = OpInstance(ts, ts + dur, thread, op_type)
        inst[s][name] = x
        if kind == TF_EVENT_START:
            pending[(s, name)] = x
    graph = _parse_graphs(path, d.get(TFRankKey.GRAPHS) or [], hits)
    hvd_order = [str(n) for n in d.get(TFRankKey.HOROVOD_OPS) or []]
    return RankRecording(int(d[TFRankKey.RANK]), path, steps, inst, graph, hvd_order, meta, repeated=repeated)


