"""TF + Horovod: which gradient each Horovod all-reduce carries (its trainable variable, producer
and consumers in the graph), and the fusion atoms of Horovod's timeline joined to the graph
(:mod:`dpro.importers.tensorflow.convert`'s docstring, "Horovod"; the atom model is :mod:`dpro.importers.horovod.atoms`'s)."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from dpro.contracts.recording import RAW_DIR, TIMELINE_NAME, MetaKey
from dpro.errors import DproInputError
from dpro.gtrace.schema import GTrace, Op, Tensor
from dpro.gtrace.validate import find_cycle
from dpro.importers.horovod import atoms as hvdlib
from dpro.importers.horovod.timeline import HorovodTimeline, load_horovod_timeline
from dpro.importers.tensorflow.read import ALLREDUCES, BW_SCOPES, HOROVOD_GROUPED, STEP_END_ID, RankRecording


@dataclass
class _Grad:
    hvd_name: str  # Horovod's tensor name: the allreduce node, or ``<node>_<i>of<n>`` in a grouped one
    name: str  # the gradient's name (trainable variable, else hvd_name)
    producer: str | None  # node computing it
    consumers: list[str]  # traced consumers of the allreduce's output
    node: str  # the allreduce node (its enqueue op)
    source: str = ""  # the graph node feeding it (traced or not): its name scope names the layer


def _hvd_tensors(r: RankRecording, n: str) -> list[str]:
    """Horovod's tensor names for allreduce node ``n``, in input order."""
    if r.graph[n].op != HOROVOD_GROUPED:
        return [n]
    k = len(r.graph[n].data)
    return [f"{n}_{i}of{k}" for i in range(1, k + 1)]


def _readers(r: RankRecording) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
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


def _gradients(r: RankRecording, ids: dict[str, str], preds: dict[str, set[str]],
               tl: HorovodTimeline | None) -> list[_Grad]:
    """Every gradient a Horovod all-reduce of rank ``r`` carries, in creation order, named after
    its trainable variable where the names can be matched (else Horovod's)."""
    allreduces = [n for n in ids if n in r.graph and r.graph[n].op in ALLREDUCES]
    order = [n for n in r.hvd_order if n in set(allreduces)]
    order += sorted(set(allreduces) - set(order))
    tensors = [(n, i, h) for n in order for i, h in enumerate(_hvd_tensors(r, n))]
    params = [p for p in r.meta.get(MetaKey.PARAMS, []) if p.get("requires_grad", True)]
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


def _variable_names(r: RankRecording, order: list[str], params: list[dict],
                    sizes: dict[str, int | None]) -> dict[str, str]:
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


def apply_horovod(gt: GTrace, ranks: dict[int, RankRecording], built: dict[int, tuple], timeline: Path) -> None:
    """Add Horovod's collectives (one ALLREDUCE op per fusion atom of rank 0's ``timeline``) and the
    gradient tensors to every worker of ``gt``; ``built``: rank -> (node, graph node -> op id,
    contracted predecessors). A timeline that cannot be used leaves a note and changes nothing."""
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
            "timeline": TIMELINE_NAME, "timeline_rank": 0, "timeline_offset_us": off[r],
            "granularity": "fusion atom: gradients never split across fusion groups in the profiled steps",
            "atoms": atoms, "groups": per_step,
            "tensors": [{"gradient": g.name, "horovod_name": g.hvd_name, "enqueue_op": built[r][1].get(g.node),
                         "producer": built[r][1].get(g.producer) if g.producer else None,
                         "consumers": [built[r][1][c] for c in g.consumers]} for g in grads[r]],
        }
    gt.manifest.library = "horovod"
    gt.manifest.world_size = world
    gt.manifest.meta["horovod"] = {
        "timeline": f"{RAW_DIR}/{TIMELINE_NAME}", "atoms": len(plan.atoms),
        "uncontended_ring_step": {"alpha_us": alpha, "beta_us_per_byte": beta},
        "groups_per_step": {str(s): len(v) for s, v in per_step.items()},
        "clock": "rank 0's timeline on the Unix-epoch clock of the TF profiler; ranks on other hosts rely on "
                 "synchronised host clocks",
    }
    gt.notes.extend(notes)


