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
and the uncontended/excess split are those of the PyTorch path (:mod:`dpro.importers.horovod.atoms`,
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

Reading a recording is :mod:`dpro.importers.tensorflow.read`; the Horovod part :mod:`dpro.importers.tensorflow.horovod`.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from dpro.contracts.recording import RANK_META_GLOB, RANK_TRACE_GLOB, TIMELINE_NAME, TRACE_SUFFIX, MetaKey, rank_stem
from dpro.errors import DproInputError
from dpro.gtrace.schema import Event, GTrace, Manifest, NodeInfo, NodeTrace, Op, Tensor
from dpro.gtrace.validate import find_cycle
from dpro.importers.tensorflow.horovod import apply_horovod
from dpro.importers.tensorflow.read import (
    ALLREDUCES,
    BW_SCOPES,
    STEP_END_ID,
    GraphNode,
    RankRecording,
    read_rank,
)
from dpro.jsonio import read_json
from dpro.progress import progress_bar

log = logging.getLogger(__name__)

IO_TYPES = frozenset({
    "IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional", "OptionalGetValue",
    "MultiDeviceIteratorGetNextFromShard", "ReaderReadV2", "ReadFile", "DecodeJpeg", "DecodePng",
})
#: TF's own collectives (MultiWorkerMirroredStrategy, CollectiveAllReduceStrategy): asynchronous
#: kernels, one coarse COMM op each (Start..Done), txn = the node name (the same graph on every worker)
TF_COLLECTIVES = {
    "CollectiveReduce": "ALLREDUCE", "CollectiveReduceV2": "ALLREDUCE", "CollectiveReduceV3": "ALLREDUCE",
    "CollectiveGather": "ALLGATHER", "CollectiveGatherV2": "ALLGATHER", "CollectiveBcastSend": "BROADCAST",
    "CollectiveBcastSendV2": "BROADCAST", "CollectiveBcastRecv": "BROADCAST", "CollectiveBcastRecvV2": "BROADCAST",
    "CollectiveAllToAllV2": "ALLTOALL", "CollectiveAllToAllV3": "ALLTOALL", "NcclAllReduce": "ALLREDUCE",
}
HOROVOD_PREFIX = "Horovod"


# ----------------------------------------------------------------------------- one rank


def _kept_steps(r: RankRecording) -> tuple[list[int], set[str]]:
    """Steps whose set of traced ops is the most common one (the DFG is the same in every step)."""
    sigs = Counter(frozenset(r.inst[s]) for s in r.inst if r.inst[s])
    if not sigs:
        raise DproInputError(r.path, "empty trace: no op events inside the profiled steps")
    ref = sigs.most_common(1)[0][0]
    kept = sorted(s for s in r.inst if frozenset(r.inst[s]) == ref)
    dropped = sorted(set(r.inst) - set(kept))
    if dropped:
        r.notes.append(f"{r.path.name}: steps {dropped} ran a different set of ops than steps {kept}; replaying {kept}")
    return kept, set(ref)


def _lanes(r: RankRecording, kept: list[int], names: set[str]) -> dict[str, str]:
    """Op -> the executor lane it ran on in most steps (k-th thread to start an op in the step)."""
    votes: dict[str, Counter] = defaultdict(Counter)
    for s in kept:
        order: dict[str, int] = {}
        for n, x in sorted(r.inst[s].items(), key=lambda kv: kv[1].ts):
            k = order.setdefault(x.thread, len(order))
            votes[n][k] += 1
    return {n: f"cpu:tf{votes[n].most_common(1)[0][0]}" for n in names}


def _contracted_preds(graph: dict[str, GraphNode], traced: set[str]) -> dict[str, set[str]]:
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


def _classify(r: RankRecording, names: set[str], preds: dict[str, set[str]], kept: list[int]) -> dict[str, str]:
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


def _build_rank(r: RankRecording, world: int) -> tuple[NodeTrace, dict[str, str], dict[str, set[str]]]:
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
                                 host=str(r.meta.get(MetaKey.HOST) or "host0")))
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
    nt.meta = {"framework_version": r.meta.get(MetaKey.FRAMEWORK_VERSION), "steps": r.meta.get(MetaKey.STEPS),
               "graph_nodes": len(r.graph), "traced_ops": len(names), "generic_ops": len(unknown),
               **{k: r.meta[k] for k in (MetaKey.STEP_WALL_US, MetaKey.STEP_WALL_AFTER_US,
                                         MetaKey.HOROVOD_WRITER_THREAD, MetaKey.HOROVOD_SETTINGS, MetaKey.COMPILE)
                  if k in r.meta}}
    return nt, ids, preds


# ----------------------------------------------------------------------------- entry point


def collect_tf(raw: Path, *, progress: bool | None = None) -> GTrace:
    """Import a TensorFlow recording directory (``rank<r>.json.gz`` + ``rank<r>.meta.json``)."""
    raw = Path(raw)
    metas: dict[int, dict] = {}
    for f in sorted(raw.glob(RANK_META_GLOB)):
        m = read_json(f)
        if isinstance(m, dict) and isinstance(m.get(MetaKey.RANK), int):
            metas[m[MetaKey.RANK]] = m
    files = sorted(p for p in raw.glob(RANK_TRACE_GLOB) if not p.name.startswith("."))
    if not files:
        raise DproInputError(raw, f"no rank traces were recorded ({RANK_TRACE_GLOB})")
    ranks: dict[int, RankRecording] = {}
    built: dict[int, tuple] = {}
    world_meta = max([int(m.get(MetaKey.WORLD_SIZE) or 0) for m in metas.values()] + [1])
    with progress_bar(len(files), "importing TF ranks", enabled=progress) as tick:
        for f in files:
            tick(f.name)
            stem = f.name[: -len(TRACE_SUFFIX)]
            meta = next((m for m in metas.values() if rank_stem(m[MetaKey.RANK]) == stem), {})
            r = read_rank(f, meta)
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
    world = max([int(m.get(MetaKey.WORLD_SIZE) or 0) for m in metas.values()] + [max(ranks) + 1])
    common = sorted(set.intersection(*(set(nt.steps) for nt in nodes.values())))
    library = next((str(m[MetaKey.LIBRARY]) for m in metas.values() if m.get(MetaKey.LIBRARY)), "none")
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
    timeline = raw / TIMELINE_NAME
    if timeline.is_file():
        apply_horovod(gt, ranks, built, timeline)
    elif any(op.name in ALLREDUCES for nt in nodes.values() for op in nt.ops.values()):
        gt.notes.append("horovod: no timeline (HOROVOD_TIMELINE) was recorded: the all-reduces are not modelled "
                        "(run the job under `dpro profile`)")
    if not any(t for nt in nodes.values() for t in nt.tensors):
        for nt in nodes.values():
            for p in ranks[nt.info.rank].meta.get(MetaKey.PARAMS, []):
                nt.tensors.append(Tensor(name=str(p["name"]), bytes=int(p["bytes"]),
                                         shape=tuple(int(x) for x in p.get("shape", [])), dtype=str(p.get("dtype"))))
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        gt.notes.append(f"ranks {missing} recorded nothing (crashed, or never reached the profiling window)")
    return gt
