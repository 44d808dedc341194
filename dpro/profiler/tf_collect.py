"""A TensorFlow recording (dpro's TF recorder, one ``rank<r>.json.gz`` per rank) -> gTrace.

**Local DFG from the graph itself.** Each rank recorded the partition graphs TF executed
(after Grappler: the node names the profiler reports) and the executor's op events. Every
graph node with an event becomes one op (``<node>@<device>``), so trace ops and graph ops
map one to one; nodes that leave no event (``Const``, ``_Arg``, ``_Retval``, ops run
inline) are contracted: an edge ``u -> v`` for every path from traced ``u`` to traced ``v``
through untraced nodes. Data and control edges both count. A virtual ``STEP_END`` on
``cpu:main`` closes each step (its gap is the Python return path).

**Devices.** TF's executor runs ready ops on a pool of inter-op threads, so an op has no
fixed thread; each op gets the lane (``cpu:tf<k>``, the k-th thread to run an op in a step)
it ran on in most profiled steps. A device runs one op at a time, so its ops are also
chained in their typical order (median start offset in the step): an op's gap is then
host time, not the time it waited for its lane behind other ready ops. Asynchronous kernels are traced as a *Start* on the
executor thread and a *Done* on the thread that completed them: ``IteratorGetNext`` (IO)
spans Start..Done on device ``io``; a Horovod op's event is its Start (the enqueue), its
collective is a COMM op from Horovod's timeline (below).

**Categories.** IO: dataset ops; BW: ``gradient_tape/`` or ``gradients/`` name scopes;
UPDATE: ops downstream of the gradients (of a BW op or a collective), and ops whose every
consumer is an UPDATE op (the optimizer's variable reads); OTHER: the Horovod enqueue
ops and STEP_END; COMM: the collectives (Horovod's from its timeline, below; TF's own
``Collective*`` ops of MultiWorkerMirroredStrategy as one coarse op each, Start..Done on
device ``comm``, txn = node name, size unknown so the replayer keeps their measured
time); FW: the rest.

**Horovod.** Horovod names a TF tensor by its graph op (``HorovodAllreduce_<gradient>``),
so rank 0's timeline joins the graph by name. The fusion-atom model, the event placement
and the uncontended/excess split are those of the PyTorch path (:mod:`dpro.profiler.horovod`,
used as a library): one ALLREDUCE op per atom on device ``comm``, ``enqueue -> atom ->`` the
allreduce node's consumers in the graph, consecutive atoms chained. Gradient tensors are
the allreduce inputs: name (the trainable variable, matched by creation order and size,
else the Horovod name), bytes and shape from the timeline, producer (the graph op that
computes it), txn (its atom). A ``HorovodGroupedAllreduce`` (``hvd.grouped_allreduce``,
Horovod's ``groups=``) is one node for k tensors, named ``<node>_<i>of<k>`` by Horovod:
each has its own input and its own output's readers, and as groups are created group by
group, not in the variables' order, each is named after the variable of its size and shape
whose layer path shares the longest run of scope with the graph node feeding it.

**Unknown ops.** A trace event whose node is not in the recorded graph (another TF
version's naming, a function whose graph was not collected) becomes a generic op on its
lane, classified by time (FW before the step's first BW op, else OTHER); one note counts
them. A rank without any graph gets a trace-only DFG (ops chained per lane) with a note.
"""

from __future__ import annotations

import bisect
import logging
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpro.errors import DproInputError
from dpro.gtrace.schema import Event, GTrace, Manifest, NodeInfo, NodeTrace, Op, Tensor
from dpro.gtrace.validate import find_cycle
from dpro.importers.kineto.read import META_SUFFIX
from dpro.jsonio import read_json
from dpro.profiler import horovod as hvdlib
from dpro.profiler.horovod_timeline import HorovodTimeline, load_horovod_timeline
from dpro.progress import progress_bar

log = logging.getLogger(__name__)

RANK_FORMAT = "dpro-tf-rank"
STEP_END_ID = "STEP_END@cpu:main"
IO_TYPES = frozenset({
    "IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional", "OptionalGetValue",
    "MultiDeviceIteratorGetNextFromShard", "ReaderReadV2", "ReadFile", "DecodeJpeg", "DecodePng",
})
BW_SCOPES = ("gradient_tape/", "gradients/")
#: TF's own collectives (MultiWorkerMirroredStrategy, CollectiveAllReduceStrategy): asynchronous
#: kernels, one coarse COMM op each (Start..Done), txn = the node name (the same graph on every worker)
TF_COLLECTIVES = {
    "CollectiveReduce": "ALLREDUCE", "CollectiveReduceV2": "ALLREDUCE", "CollectiveReduceV3": "ALLREDUCE",
    "CollectiveGather": "ALLGATHER", "CollectiveGatherV2": "ALLGATHER", "CollectiveBcastSend": "BROADCAST",
    "CollectiveBcastSendV2": "BROADCAST", "CollectiveBcastRecv": "BROADCAST", "CollectiveBcastRecvV2": "BROADCAST",
    "CollectiveAllToAllV2": "ALLTOALL", "CollectiveAllToAllV3": "ALLTOALL", "NcclAllReduce": "ALLREDUCE",
}
HOROVOD_PREFIX = "Horovod"
HOROVOD_ALLREDUCE = "HorovodAllreduce"
#: one op for a group of tensors (hvd.grouped_allreduce, DistributedOptimizer(groups=...)); Horovod
#: names its i-th tensor ``<node>_<i>of<n>`` (i from 1)
HOROVOD_GROUPED = "HorovodGroupedAllreduce"
ALLREDUCES = (HOROVOD_ALLREDUCE, HOROVOD_GROUPED)


# ----------------------------------------------------------------------------- reading


@dataclass
class _Node:
    name: str
    op: str
    inputs: list[str]  # node names (data and control)
    data: list[str] = field(default_factory=list)  # data inputs as recorded (``node:k``)


@dataclass
class _Inst:
    """One op's execution in one step."""

    ts: float
    end: float
    thread: str
    op_type: str
    done: float | None = None  # async kernels: end of the Done callback


@dataclass
class _Rank:
    rank: int
    path: Path
    steps: dict[int, tuple[float, float]]
    #: step -> node -> instance
    inst: dict[int, dict[str, _Inst]]
    graph: dict[str, _Node]
    hvd_order: list[str]
    meta: dict
    notes: list[str] = field(default_factory=list)
    repeated: int = 0


def _fail(path: Path, problem: str) -> DproInputError:
    return DproInputError(path, problem)


def _parse_graphs(path: Path, graphs: object, hits: Counter) -> dict[str, _Node]:
    """The recorded graph that holds most of the traced nodes, merged with any other that holds some."""
    if not isinstance(graphs, list):
        raise _fail(path, "'graphs' must be a list of node lists")
    parsed: list[dict[str, _Node]] = []
    seen: set[tuple[str, ...]] = set()
    for g in graphs:
        if not isinstance(g, list):
            raise _fail(path, "each graph must be a list of nodes")
        nodes: dict[str, _Node] = {}
        for n in g:
            if not isinstance(n, dict) or not isinstance(n.get("name"), str) or not isinstance(n.get("op"), str):
                raise _fail(path, f"graph node must have string 'name' and 'op' (got {str(n)[:80]})")
            ins = [str(i).split(":")[0] for i in (n.get("inputs") or [])]
            ins += [str(i) for i in (n.get("control") or [])]
            nodes[n["name"]] = _Node(n["name"], n["op"], ins, [str(i) for i in (n.get("inputs") or [])])
        key = tuple(sorted(nodes))
        if key in seen:
            continue
        seen.add(key)
        parsed.append(nodes)
    scored = sorted(((sum(hits[n] for n in g), i) for i, g in enumerate(parsed)), reverse=True)
    out: dict[str, _Node] = {}
    for score, i in scored:
        if score == 0:
            break
        for name, node in parsed[i].items():
            out.setdefault(name, node)
    return out


def _read_rank(path: Path, meta: dict) -> _Rank:
    d = read_json(path)
    if not isinstance(d, dict) or d.get("format") != RANK_FORMAT:
        raise _fail(path, f"not a dpro TensorFlow rank recording (format {RANK_FORMAT!r} expected)")
    if not isinstance(d.get("rank"), int):
        raise _fail(path, "'rank' must be an integer")
    steps: dict[int, tuple[float, float]] = {}
    raw_steps = d.get("steps")
    if not isinstance(raw_steps, dict):
        raise _fail(path, "'steps' must map step numbers to [ts, dur]")
    for k, v in raw_steps.items():
        try:
            steps[int(k)] = (float(v[0]), float(v[1]))
        except (TypeError, ValueError, IndexError):
            raise _fail(path, f"step {k!r}: expected [ts, dur] in µs, got {v!r}") from None
    if not steps:
        raise _fail(path, "no profiled step was recorded (no dpro_step annotation in the trace)")
    events = d.get("events")
    if not isinstance(events, list):
        raise _fail(path, "'events' must be a list")
    order = sorted(steps)
    starts = [steps[s][0] for s in order]
    inst: dict[int, dict[str, _Inst]] = {s: {} for s in order}
    pending: dict[tuple[int, str], _Inst] = {}
    hits: Counter = Counter()
    repeated = 0
    for e in events:
        try:
            name, op_type, thread, ts, dur = str(e[0]), str(e[1]), str(e[2]), float(e[3]), float(e[4])
            kind = str(e[5]) if len(e) > 5 else "op"
        except (TypeError, ValueError, IndexError, KeyError):
            raise _fail(path, f"malformed event {str(e)[:80]} (expected [node, type, thread, ts, dur, kind])") from None
        if dur < 0:
            raise _fail(path, f"event {name!r} has a negative duration")
        i = bisect.bisect_right(starts, ts) - 1
        if i < 0:
            continue
        s = order[i]
        if kind == "done":
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
        x = _Inst(ts, ts + dur, thread, op_type)
        inst[s][name] = x
        if kind == "start":
            pending[(s, name)] = x
    graph = _parse_graphs(path, d.get("graphs") or [], hits)
    hvd_order = [str(n) for n in d.get("horovod_ops") or []]
    return _Rank(int(d["rank"]), path, steps, inst, graph, hvd_order, meta, repeated=repeated)


# ----------------------------------------------------------------------------- one rank


def _kept_steps(r: _Rank) -> tuple[list[int], set[str]]:
    """Steps whose set of traced ops is the most common one (the DFG is the same in every step)."""
    sigs = Counter(frozenset(r.inst[s]) for s in r.inst if r.inst[s])
    if not sigs:
        raise _fail(r.path, "empty trace: no op events inside the profiled steps")
    ref = sigs.most_common(1)[0][0]
    kept = sorted(s for s in r.inst if frozenset(r.inst[s]) == ref)
    dropped = sorted(set(r.inst) - set(kept))
    if dropped:
        r.notes.append(f"{r.path.name}: steps {dropped} ran a different set of ops than steps {kept}; replaying {kept}")
    return kept, set(ref)


def _lanes(r: _Rank, kept: list[int], names: set[str]) -> dict[str, str]:
    """Op -> the executor lane it ran on in most steps (k-th thread to start an op in the step)."""
    votes: dict[str, Counter] = defaultdict(Counter)
    for s in kept:
        order: dict[str, int] = {}
        for n, x in sorted(r.inst[s].items(), key=lambda kv: kv[1].ts):
            k = order.setdefault(x.thread, len(order))
            votes[n][k] += 1
    return {n: f"cpu:tf{votes[n].most_common(1)[0][0]}" for n in names}


def _contracted_preds(graph: dict[str, _Node], traced: set[str]) -> dict[str, set[str]]:
    """Traced node -> its nearest traced ancestors (paths through untraced nodes contracted)."""
    memo: dict[str, set[str]] = {}

    def through(n: str, stack: set[str]) -> set[str]:
        # traced ancestors reachable from untraced node n
        if n in memo:
            return memo[n]
        if n in stack or n not in graph:
            return set()
        stack.add(n)
        out: set[str] = set()
        for u in graph[n].inputs:
            out |= {u} if u in traced else through(u, stack)
        stack.discard(n)
        memo[n] = out
        return out

    preds: dict[str, set[str]] = {}
    for v in traced:
        node = graph.get(v)
        if node is None:
            continue
        ps: set[str] = set()
        for u in node.inputs:
            ps |= {u} if u in traced else through(u, set())
        ps.discard(v)
        preds[v] = ps
    return preds


def _classify(r: _Rank, names: set[str], preds: dict[str, set[str]], kept: list[int]) -> dict[str, str]:
    succ: dict[str, set[str]] = defaultdict(set)
    for v, ps in preds.items():
        for u in ps:
            succ[u].add(v)
    typ = {n: (r.graph[n].op if n in r.graph else r.inst[kept[0]][n].op_type) for n in names}
    cat: dict[str, str] = {}
    for n in names:
        t = typ[n]
        if n not in r.graph:
            continue
        if t.startswith(HOROVOD_PREFIX):
            cat[n] = "OTHER"
        elif t in TF_COLLECTIVES:
            cat[n] = "COMM"
        elif t in IO_TYPES:
            cat[n] = "IO"
        elif n.startswith(BW_SCOPES) or any(f"/{sc}" in n for sc in BW_SCOPES):
            cat[n] = "BW"
    # UPDATE: downstream of the gradients
    seeds = [n for n in names if cat.get(n) in ("BW", "COMM") or typ[n] in ALLREDUCES]
    stack = list(seeds)
    seen = set(seeds)
    while stack:
        u = stack.pop()
        for v in succ.get(u, ()):
            if v not in seen:
                seen.add(v)
                stack.append(v)
                if v not in cat and v in r.graph:
                    cat[v] = "UPDATE"
    changed = True
    while changed:  # ops that only feed UPDATE ops (optimizer variable reads)
        changed = False
        for n in names:
            if n not in cat and n in r.graph and succ.get(n) and all(cat.get(v) == "UPDATE" for v in succ[n]):
                cat[n] = "UPDATE"
                changed = True
    # FW for graph ops; unknown (generic) ops by time: FW before the step's first BW op, else OTHER
    first_bw = min((r.inst[kept[0]][n].ts for n in names if cat.get(n) == "BW"), default=float("inf"))
    for n in names:
        if n not in cat:
            cat[n] = "FW" if n in r.graph or r.inst[kept[0]][n].ts < first_bw else "OTHER"
    return cat


def _layer(name: str) -> str | None:
    for sc in BW_SCOPES:
        if name.startswith(sc):
            name = name[len(sc):]
    parts = name.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else None


def _build_rank(r: _Rank, world: int) -> tuple[NodeTrace, dict[str, str], dict[str, set[str]]]:
    """The rank's NodeTrace (no Horovod collectives yet); node -> op id; contracted preds."""
    kept, names = _kept_steps(r)
    lane = _lanes(r, kept, names)
    unknown = sorted(n for n in names if n not in r.graph)
    if not r.graph:
        r.notes.append(f"{r.path.name}: no TF graph was recorded (create dpro.Recorder before the step function "
                       f"first runs): {len(names)} ops imported from the trace alone, chained per thread")
    elif unknown:
        types = Counter(r.inst[kept[0]][n].op_type or "?" for n in unknown)
        r.notes.append(f"{r.path.name}: {len(unknown)} traced op(s) not in the recorded graph imported as generic "
                       f"ops (types: {dict(types.most_common(5))})")
        log.warning("dpro: %s: %d unknown op(s) imported as generic nodes", r.path.name, len(unknown))
    if r.repeated:
        r.notes.append(f"{r.path.name}: {r.repeated} op execution(s) repeated within a step (loops) were merged "
                       "into one op spanning them")
    traced = {n for n in names if n in r.graph}
    preds = _contracted_preds(r.graph, traced)
    cat = _classify(r, names, preds, kept)
    nt = NodeTrace(info=NodeInfo(name=f"worker{r.rank}", role="worker", rank=r.rank,
                                 host=str(r.meta.get("host") or "host0")))
    ids: dict[str, str] = {}
    first = r.inst[kept[0]]
    for n in sorted(names, key=lambda n: (first[n].ts, n)):
        x = first[n]
        typ = r.graph[n].op if n in r.graph else (x.op_type or "?")
        async_span = x.done is not None and not typ.startswith(HOROVOD_PREFIX)
        dev = {"IO": "io", "COMM": "comm"}.get(cat[n]) or ("cpu:async" if async_span else lane[n])
        oid = f"{n}@{dev}" if n in r.graph else f"{n}@{dev}#generic"
        ids[n] = oid
        nt.ops[oid] = Op(id=oid, name=typ, cat=cat[n], device=dev, layer=_layer(n) if cat[n] in ("FW", "BW") else None)
        if cat[n] == "COMM":  # a TF collective: size unknown (0), so the replayer keeps its measured time
            op = nt.ops[oid]
            op.sub_op, op.tensor, op.txn, op.bytes = TF_COLLECTIVES[typ], n, f"tf:{n}", 0
            op.group = tuple(range(world))
        for s in kept:
            y = r.inst[s][n]
            end = y.done if (async_span and y.done is not None) else y.end
            nt.events.append(Event(op=oid, step=s, ts=y.ts, dur=max(0.0, end - y.ts)))
    edges: set[tuple[str, str]] = set()
    for v, ps in preds.items():
        for u in ps:
            edges.add((ids[u], ids[v]))
    # Each device runs one op at a time: chain its ops in their typical order (median start
    # offset over the steps), so that an op's gap is host time, not the wait for its lane.
    med = {ids[n]: float(np.median([r.inst[s][n].ts - r.steps[s][0] for s in kept])) for n in names}
    by_dev: dict[str, list[str]] = defaultdict(list)
    for oid in sorted(nt.ops, key=lambda o: (med[o], o)):
        by_dev[nt.ops[oid].device].append(oid)
    for ops in by_dev.values():
        edges.update(zip(ops, ops[1:]))
    order = {oid: i for i, oid in enumerate(sorted(nt.ops, key=lambda o: (med[o], o)))}
    if find_cycle(sorted(edges)) is not None:
        back = {(u, v) for u, v in edges if order[u] > order[v]}
        r.notes.append(f"{r.path.name}: the DFG had cycles (graph loops, or ops whose order changed between "
                       f"steps): {len(back)} edge(s) against the typical order dropped")
        edges -= back
    nt.ops[STEP_END_ID] = Op(id=STEP_END_ID, name="STEP_END", cat="OTHER", device="cpu:main")
    has_succ = {u for u, _ in edges}
    edges.update((oid, STEP_END_ID) for oid in list(nt.ops) if oid != STEP_END_ID and oid not in has_succ)
    for s in kept:
        t0, dur = r.steps[s]
        nt.steps[s] = (t0, dur)
        nt.events.append(Event(op=STEP_END_ID, step=s, ts=t0 + dur, dur=0.0))
    nt.edges = sorted(edges)
    nt.meta = {"framework_version": r.meta.get("framework_version"), "steps": r.meta.get("steps"),
               "graph_nodes": len(r.graph), "traced_ops": len(names), "generic_ops": len(unknown),
               **{k: r.meta[k] for k in ("step_wall_us", "step_wall_after_us", "horovod_writer_thread",
                                         "horovod_settings", "compile") if k in r.meta}}
    return nt, ids, preds


# ----------------------------------------------------------------------------- Horovod


@dataclass
class _Grad:
    hvd_name: str  # Horovod's tensor name: the allreduce node, or ``<node>_<i>of<n>`` in a grouped one
    name: str  # the gradient's name (trainable variable, else hvd_name)
    producer: str | None  # node computing it
    consumers: list[str]  # traced consumers of the allreduce's output
    node: str  # the allreduce node (its enqueue op)
    source: str = ""  # the graph node feeding it (traced or not): its name scope names the layer


def _hvd_tensors(r: _Rank, n: str) -> list[str]:
    """Horovod's tensor names for allreduce node ``n``, in input order."""
    if r.graph[n].op != HOROVOD_GROUPED:
        return [n]
    k = len(r.graph[n].data)
    return [f"{n}_{i}of{k}" for i in range(1, k + 1)]


def _readers(r: _Rank) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """("node:k" -> the nodes reading that output, node -> the nodes reading any of its outputs)."""
    by_output: dict[str, list[str]] = defaultdict(list)
    by_node: dict[str, list[str]] = defaultdict(list)
    for m in r.graph.values():
        for d in m.data:
            by_output[d if ":" in d else f"{d}:0"].append(m.name)
            by_node[d.split(":")[0]].append(m.name)
    return by_output, by_node


def _output_consumers(readers: tuple[dict[str, list[str]], dict[str, list[str]]], n: str, i: int,
                      traced: set[str]) -> list[str]:
    """Traced nodes fed by output ``i`` of node ``n`` (through untraced nodes)."""
    by_output, by_node = readers
    out: set[str] = set()
    seen: set[str] = set()
    stack = list(by_output.get(f"{n}:{i}", []))
    while stack:
        c = stack.pop()
        if c not in seen:
            seen.add(c)
            if c in traced:
                out.add(c)
            else:
                stack.extend(by_node.get(c, []))
    return sorted(out)


def _gradients(r: _Rank, ids: dict[str, str], preds: dict[str, set[str]], tl: HorovodTimeline | None) -> list[_Grad]:
    allreduces = [n for n in ids if n in r.graph and r.graph[n].op in ALLREDUCES]
    order = [n for n in r.hvd_order if n in set(allreduces)]
    order += sorted(set(allreduces) - set(order))
    tensors = [(n, i, h) for n in order for i, h in enumerate(_hvd_tensors(r, n))]
    params = [p for p in r.meta.get("params", []) if p.get("requires_grad", True)]
    known = {h: tl.tensors[h][0] for _, _, h in tensors if tl is not None and tl.tensors.get(h)}
    sizes = {h: (known[h].size_bytes if h in known else None) for _, _, h in tensors}
    succ: dict[str, list[str]] = defaultdict(list)
    for v, ps in preds.items():
        for u in ps:
            succ[u].append(v)
    grouped = any(r.graph[n].op == HOROVOD_GROUPED for n in order)
    readers = _readers(r) if grouped else ({}, {})
    out = []
    for n, i, h in tensors:
        data = r.graph[n].data
        src = data[i if r.graph[n].op == HOROVOD_GROUPED else 0].split(":")[0] if data else ""
        if r.graph[n].op == HOROVOD_GROUPED:  # per tensor: its own input and its own output's readers
            producer = src if src in ids else None
            consumers = _output_consumers(readers, n, i, set(ids))
        else:
            ps = sorted(preds.get(n, ()))
            producer, consumers = (ps[0] if ps else None), sorted(succ.get(n, []))
        out.append(_Grad(h, h, producer, consumers, n, src or producer or ""))
    # creation order is the variables' unless tensors were grouped (then it is the groups')
    names = _variable_names(r, [h for _, _, h in tensors], params, sizes)
    if len(known) == len(out) and (grouped or all(names[g.hvd_name] == g.hvd_name for g in out)):
        by_shape = _names_by_shape(out, params, {h: (t.size_bytes, t.shape) for h, t in known.items()})
        if any(by_shape[g.hvd_name] != g.hvd_name for g in out):
            names = by_shape
    for g in out:
        g.name = names[g.hvd_name]
    return out


def _names_by_shape(grads: list[_Grad], params: list[dict],
                    known: dict[str, tuple[int | None, tuple[int, ...] | None]]) -> dict[str, str]:
    """Horovod tensor -> trainable variable where the creation order does not follow the
    variables' (grouped all-reduces are created group by group): each tensor, in creation
    order, takes a variable not yet taken of its size and shape, among those the one whose
    layer path (the variable's path less its last part) shares the longest run of scope
    with the graph node feeding it, traced or not (``gradient_tape/transformer_1/b1_attn_1/
    value_1/Reshape_1`` and ``b1_attn/value/kernel``: 2; ``b0_attn/value/kernel``: 1). All
    or nothing: else the Horovod names stay."""
    free = list(params)
    out: dict[str, str] = {}
    for g in grads:
        size, shape = known[g.hvd_name]
        fits = [p for p in free if int(p["bytes"]) == size and (shape is None or tuple(p.get("shape", ())) == shape)]
        if not fits:
            return {x.hvd_name: x.hvd_name for x in grads}
        scope = _scope(g.source)
        best = max(fits, key=lambda p: _common_run(scope, str(p["name"]).split("/")[:-1]))
        free.remove(best)
        out[g.hvd_name] = str(best["name"])
    return out


def _scope(node: str) -> list[str]:
    """A gradient node's name scope as layer path tokens: the tape's scope dropped, and the
    call count Keras appends to a layer's scope (``conv2_1`` for layer ``conv2``)."""
    for sc in BW_SCOPES:
        if node.startswith(sc):
            node = node[len(sc):]
    return [re.sub(r"_\d+$", "", t) for t in node.split("/")]


def _common_run(a: list[str], b: list[str]) -> int:
    """The length of the longest run of tokens that ``a`` and ``b`` share."""
    best = 0
    run = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for j, y in enumerate(b, 1):
            cur = run[j]
            run[j] = prev + 1 if x == y else 0
            best = max(best, run[j])
            prev = cur
    return best


def _variable_names(r: _Rank, order: list[str], params: list[dict], sizes: dict[str, int | None]) -> dict[str, str]:
    """Horovod tensor -> trainable variable, pairing creation order with the variables' order.

    A gradient that is an ``IndexedSlices`` (embeddings) is all-gathered instead (values and
    indices: two ``HorovodAllgather`` ops) and pairs with no allreduce. Sizes must agree
    where the timeline knows them; on any mismatch the Horovod names are kept.
    """
    keep = {n: n for n in order}
    created = [h for n in r.hvd_order if n in r.graph and r.graph[n].op in (*ALLREDUCES, "HorovodAllgather")
               for h in _hvd_tensors(r, n)]
    if set(order) - set(created):
        return keep
    out: dict[str, str] = {}
    i = 0
    for p in params:
        if i >= len(created):
            return keep
        n = created[i]
        if n in r.graph and r.graph[n].op == "HorovodAllgather":
            nxt = created[i + 1] if i + 1 < len(created) else None
            i += 2 if nxt in r.graph and r.graph[nxt].op == "HorovodAllgather" else 1
            continue
        if sizes.get(n) not in (None, int(p["bytes"])):
            return keep
        out[n] = str(p["name"])
        i += 1
    return out if i == len(created) and len(out) == len(order) else keep


def _apply_horovod(gt: GTrace, ranks: dict[int, _Rank], built: dict[int, tuple], timeline: Path) -> None:
    try:
        tl = load_horovod_timeline(timeline)
    except DproInputError as e:
        gt.notes.append(f"horovod timeline not used: {e}")
        return
    if tl.start_epoch_us is None:
        gt.notes.append(f"horovod timeline not used: {timeline.name}: no start_time_since_epoch_in_micros record")
        return
    grads = {r: _gradients(ranks[r], built[r][1], built[r][2], tl) for r in ranks}
    ref = min(ranks)
    by_hvd = {g.hvd_name: g for g in grads[ref]}
    if not by_hvd:
        gt.notes.append("horovod: the graph has no HorovodAllreduce or HorovodGroupedAllreduce op: no collectives "
                        "modelled")
        return
    # Horovod names the TF tensor by its graph op; the torch path's plan keys by allreduce.<gradient>.
    rename = {h: f"allreduce.{g.name}" for h, g in by_hvd.items()}
    for op in tl.ops():
        op.tensor = rename.get(op.tensor, op.tensor)
    tl.tensors = {rename.get(k, k): v for k, v in tl.tensors.items()}
    params: dict[str, dict] = {}
    for h, g in by_hvd.items():
        t = tl.tensors.get(rename[h])
        size = t[0].size_bytes if t else None
        shape = list(t[0].shape) if t and t[0].shape is not None else []
        params[g.name] = {"name": g.name, "bytes": int(size or 0), "shape": shape,
                          "dtype": (t[0].dtype if t else None) or "float32"}
    gathers = sum(1 for n in built[ref][1] if n in ranks[ref].graph and ranks[ref].graph[n].op == "HorovodAllgather")
    if gathers:
        gt.notes.append(f"horovod: {gathers} HorovodAllgather op(s) (IndexedSlices gradients, e.g. embeddings) are "
                        "not modelled as collectives: their time stays in their consumers' gaps (densify such "
                        "gradients, like sparse_as_dense=True, to model them)")
    nodes = gt.workers()
    off = {nt.info.rank: float(tl.start_epoch_us) for nt in nodes}
    try:
        plan = hvdlib.plan_atoms(gt, tl, nodes[0], off[nodes[0].info.rank], params)
    except hvdlib.TimelineUnusable as e:
        gt.notes.append(f"horovod timeline not used: {timeline.name}: {e}")
        return
    notes = list(plan.notes)
    hvdlib.keep_steps(gt, plan.steps)
    prod: dict[int, dict[str, str]] = {}
    for nt in nodes:
        r = nt.info.rank
        ids = built[r][1]
        prod[r] = {g.name: ids[g.node] for g in grads[r] if g.name in params and g.node in ids}
    world = max(gt.manifest.world_size, len(nodes))
    excess, (alpha, beta) = hvdlib.excess_times(plan, world)
    hvdlib.add_atom_events(gt, plan, off, prod, excess)
    for nt in nodes:
        r = nt.info.rank
        ids = built[r][1]
        g_of = {g.name: g for g in grads[r]}
        edges = set(nt.edges)
        for a in plan.atoms:
            nt.ops[a.op_id] = Op(id=a.op_id, name=hvdlib.OP_NAME, cat="COMM", device=hvdlib.COMM_DEVICE,
                                 sub_op="ALLREDUCE", tensor=f"fusion{a.index}", bytes=a.bytes, txn=a.txn,
                                 group=tuple(range(world)))
            for n in a.tensors:
                g = g_of.get(n)
                if g is None:
                    continue
                edges.add((ids[g.node], a.op_id))
                edges.update((a.op_id, ids[c]) for c in g.consumers)
        for prev, a in zip(plan.atoms, plan.atoms[1:]):
            edges.add((prev.op_id, a.op_id))
        if plan.atoms:
            edges.add((plan.atoms[-1].op_id, STEP_END_ID))
        if find_cycle(sorted(edges)) is not None:
            notes.append(f"worker{r}: Horovod consumer edges would form a cycle; kept producers and order only")
            atom_ids = {a.op_id for a in plan.atoms}
            edges = {(u, v) for u, v in edges if u not in atom_ids or v in atom_ids or v == STEP_END_ID}
        nt.edges = sorted(edges)
        atom_of = {n: a for a in plan.atoms for n in a.tensors}
        for g in grads[r]:
            p = params.get(g.name)
            if p is None:
                continue
            nt.tensors.append(Tensor(name=g.name, bytes=int(p["bytes"]), shape=tuple(p["shape"]), dtype=str(p["dtype"]),
                                     producer=ids.get(g.producer) if g.producer else None,
                                     txn=atom_of[g.name].txn if g.name in atom_of else None))
    hvdlib.check_windows(gt, plan, off, notes)
    per_step, atoms = hvdlib.groups_meta(plan, excess)
    for nt in nodes:
        r = nt.info.rank
        nt.meta["horovod"] = {
            "timeline": hvdlib.TIMELINE_NAME, "timeline_rank": 0, "timeline_offset_us": off[r],
            "granularity": "fusion atom: gradients never split across fusion groups in the profiled steps",
            "atoms": atoms, "groups": per_step,
            "tensors": [{"gradient": g.name, "horovod_name": g.hvd_name, "enqueue_op": built[r][1].get(g.node),
                         "producer": built[r][1].get(g.producer) if g.producer else None,
                         "consumers": [built[r][1][c] for c in g.consumers]} for g in grads[r]],
        }
    gt.manifest.library = "horovod"
    gt.manifest.world_size = world
    gt.manifest.meta["horovod"] = {
        "timeline": f"raw/{hvdlib.TIMELINE_NAME}", "atoms": len(plan.atoms),
        "uncontended_ring_step": {"alpha_us": alpha, "beta_us_per_byte": beta},
        "groups_per_step": {str(s): len(v) for s, v in per_step.items()},
        "clock": "rank 0's timeline on the Unix-epoch clock of the TF profiler; ranks on other hosts rely on "
                 "synchronised host clocks",
    }
    gt.notes.extend(notes)


# ----------------------------------------------------------------------------- entry point


def collect_tf(raw: Path, *, progress: bool | None = None) -> GTrace:
    """Import a TensorFlow recording directory (``rank<r>.json.gz`` + ``rank<r>.meta.json``)."""
    raw = Path(raw)
    metas: dict[int, dict] = {}
    for f in sorted(raw.glob(f"rank*{META_SUFFIX}")):
        m = read_json(f)
        if isinstance(m, dict) and isinstance(m.get("rank"), int):
            metas[m["rank"]] = m
    files = sorted(p for p in raw.glob("rank*.json.gz") if not p.name.startswith("."))
    if not files:
        raise DproInputError(raw, "no rank traces were recorded (rank*.json.gz)")
    ranks: dict[int, _Rank] = {}
    built: dict[int, tuple] = {}
    world_meta = max([int(m.get("world_size") or 0) for m in metas.values()] + [1])
    with progress_bar(len(files), "importing TF ranks", enabled=progress) as tick:
        for f in files:
            tick(f.name)
            stem = f.name[: -len(".json.gz")]
            meta = next((m for m in metas.values() if f"rank{m['rank']}" == stem), {})
            r = _read_rank(f, meta)
            if r.rank in ranks:
                raise DproInputError(f, f"rank {r.rank} recorded twice")
            ranks[r.rank] = r
            try:
                built[r.rank] = _build_rank(r, max(world_meta, r.rank + 1))
            except DproInputError:
                raise
            except (KeyError, ValueError, TypeError, IndexError, AttributeError, RecursionError) as e:
                raise DproInputError(f, f"cannot interpret this TF recording ({type(e).__name__}: {e})") from None
    nodes = {built[r][0].info.name: built[r][0] for r in sorted(built)}
    world = max([int(m.get("world_size") or 0) for m in metas.values()] + [max(ranks) + 1])
    common = sorted(set.intersection(*(set(nt.steps) for nt in nodes.values())))
    library = next((str(m["library"]) for m in metas.values() if m.get("library")), "none")
    gt = GTrace(
        manifest=Manifest(framework="tensorflow", scheme="allreduce", library=library, world_size=world,
                          nodes=[nt.info for nt in nodes.values()], steps=common,
                          meta={"importer": "dpro-tf", "recorder": "dpro"}),
        nodes=nodes,
    )
    for r in sorted(ranks):
        gt.notes.extend(ranks[r].notes)
    for nt in nodes.values():
        nt.events = [e for e in nt.events if e.step in set(common)]
        nt.steps = {s: v for s, v in nt.steps.items() if s in set(common)}
    if len(ranks) < world:
        gt.notes.append(f"{len(ranks)} of {world} ranks present: collectives keep their measured durations")
    timeline = raw / hvdlib.TIMELINE_NAME
    if timeline.is_file():
        _apply_horovod(gt, ranks, built, timeline)
    elif any(op.name in ALLREDUCES for nt in nodes.values() for op in nt.ops.values()):
        gt.notes.append("horovod: no timeline (HOROVOD_TIMELINE) was recorded: the all-reduces are not modelled "
                        "(run the job under `dpro profile`)")
    if not any(t for nt in nodes.values() for t in nt.tensors):
        for nt in nodes.values():
            for p in ranks[nt.info.rank].meta.get("params", []):
                nt.tensors.append(Tensor(name=str(p["name"]), bytes=int(p["bytes"]),
                                         shape=tuple(int(x) for x in p.get("shape", [])), dtype=str(p.get("dtype"))))
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        gt.notes.append(f"ranks {missing} recorded nothing (crashed, or never reached the profiling window)")
    return gt
