"""Linking plugin collectives to a gTrace's coarse NCCL ops, step by step, and replacing each
by ``IN`` -> chunk ops -> ``OUT`` with the measured chunk times (package docstring)."""

from __future__ import annotations

import bisect
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path

from dpro.errors import DproInputError
from dpro.gtrace.schema import Event, GTrace, NodeTrace, Op
from dpro.importers.nccl.chunks import PairedCollective, collective_chunks, data_dependencies
from dpro.importers.nccl.read import Coll, PluginFile, RankView, read_plugin_dir, select_comm
from dpro.jsonio import read_bytes

#: gTrace coarse sub-op -> NCCL function name (what the plugin records)
NCCL_FUNC = {
    "ALLREDUCE": "AllReduce",
    "ALLGATHER": "AllGather",
    "REDUCESCATTER": "ReduceScatter",
    "BROADCAST": "Broadcast",
}


def kineto_time_offsets(path: str | Path) -> dict[int, float]:
    """rank -> what to add to plugin µs to get the rank's Kineto ``ts``: the trace's
    ``-baseTimeNanoseconds / 1000`` (both clocks are CLOCK_REALTIME)."""
    from dpro.importers.kineto.read import DEFAULT_RANK_PATTERN, trace_files

    out: dict[int, float] = {}
    for i, p in enumerate(trace_files(Path(path))):
        raw = read_bytes(p)
        m = re.search(rb'"baseTimeNanoseconds"\s*:\s*(\d+)', raw)
        if not m:
            continue
        r = re.search(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)', raw)
        if r:
            rank = int(r.group(1))
        else:
            mm = re.search(DEFAULT_RANK_PATTERN, p.name)
            rank = int(mm.group(1)) if mm else i
        out[rank] = -int(m.group(1)) / 1000.0
    return out


@dataclass
class _Instance:
    """One execution of a coarse collective op on a node in one step."""

    step: int
    op: Op
    ts: float
    dur: float


def _txn_index(txn: str) -> int:
    try:
        return int(txn.rsplit(".", 1)[1])
    except (IndexError, ValueError):
        return 0


def _node_instances(nt: NodeTrace, steps: list[int]) -> dict[int, list[_Instance]]:
    """step -> the node's coarse NCCL collectives in that step, in gTrace order (txn index)."""
    want = set(steps)
    out: dict[int, list[_Instance]] = defaultdict(list)
    for e in nt.events:
        op = nt.ops.get(e.op)
        if op is None or e.step not in want or op.cat != "COMM" or op.sub_op not in NCCL_FUNC or op.txn is None:
            continue
        out[e.step].append(_Instance(e.step, op, e.ts, e.dur))
    for v in out.values():
        v.sort(key=lambda x: (_txn_index(x.op.txn or ""), x.ts))
    return out


def _assign_steps(
    view: RankView, steps: list[int], windows: dict[int, tuple[float, float]], offset_us: float | None,
    seq_base: dict[str, int] | None, per_step: dict[str, int],
) -> tuple[dict[tuple[int, str], list[Coll]], str]:
    """(step, NCCL func) -> the rank's plugin collectives of that step in seq order; and how."""
    colls = view.comm.collectives()
    out: dict[tuple[int, str], list[Coll]] = defaultdict(list)
    marks = sorted(view.file.marks, key=lambda m: m[1])
    if marks:
        times = [t for _, t in marks]
        for c in colls:
            i = bisect.bisect_right(times, c.t0 or 0) - 1
            if i >= 0 and marks[i][0] in windows:
                out[(marks[i][0], c.func)].append(c)
        how = "step marks"
    elif offset_us is not None:
        off = _us_to_ns(offset_us)
        for c in colls:
            t = ((c.t0 or 0) + off) / 1000.0
            for s, (t0, dur) in windows.items():
                if t0 <= t < t0 + dur:
                    out[(s, c.func)].append(c)
                    break
        how = "step windows (time offset)"
    elif seq_base is not None:
        by_seq = {(c.func, c.seq): c for c in colls}
        s0 = min(steps)
        for s in steps:
            for func, m in per_step.items():
                base = seq_base.get(func)
                if base is None:
                    continue
                for j in range(m):
                    c = by_seq.get((func, base + (s - s0) * m + j))
                    if c is not None:
                        out[(s, func)].append(c)
        how = "sequence base"
    else:
        raise DproInputError(
            view.file.path,
            "cannot link NCCL collectives to training steps: the trace has no step marks "
            "(call dpro_nccl_trace_mark_step() in the training loop), and no time_offset_us or seq_base was given",
        )
    for v in out.values():
        v.sort(key=lambda c: c.seq)
    return out, how


# --------------------------------------------------------------------------- replacement


@dataclass
class ReplaceResult:
    """What :func:`replace_collectives` did."""

    gtrace: GTrace
    #: collective txns replaced by chunk ops on every rank
    replaced: list[str] = field(default_factory=list)
    #: txn -> why it kept its coarse op
    kept: dict[str, str] = field(default_factory=dict)
    #: rank -> the time offset used (plugin µs + offset = node µs) and how it was found
    offsets: dict[int, tuple[float, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def replace_collectives(
    gt: GTrace,
    plugin: str | Path | list[PluginFile],
    *,
    time_offset_us: float | dict[int, float] | None = None,
    seq_base: int | dict[str, int] | None = None,
    comm: str | None = None,
    steps: list[int] | None = None,
) -> ReplaceResult:
    """A copy of ``gt`` whose coarse NCCL collectives are replaced, on every rank, by
    IN -> measured SEND/RECV chunk ops -> OUT (see the module doc).

    ``plugin``: the plugin's output directory (or file, or parsed files).
    ``time_offset_us``: plugin µs + offset = node clock µs, one number or per rank (e.g.
    :func:`kineto_time_offsets`); default: estimated from the collectives' ends.
    ``seq_base``: sequence number of the first profiled step's first collective (per NCCL
    function name, or one for all) when the files have no step marks and no offset is given.
    ``comm``: the communicator (hash or name); default: the one spanning the job.
    ``steps``: steps to use (default: the manifest's). A collective is replaced only when
    every rank of it is in ``gt``, every step is linked, and every chunk of every step was
    recorded with the same structure; otherwise it keeps its coarse op (``kept`` says why).
    """
    from dpro.gtrace.validate import validate

    files = plugin if isinstance(plugin, list) else read_plugin_dir(plugin)
    res = ReplaceResult(gtrace=gt)
    for f in files:
        res.notes += f.notes
        drops = {k: v for k, v in f.dropped().items() if v and k != "paused"}
        if drops:
            res.notes.append(f"{f.path.name}: the plugin dropped events ({', '.join(f'{k}: {v}' for k, v in sorted(drops.items()))})")
    workers = {nt.info.rank: nt for nt in gt.workers()}
    views = select_comm(files, nranks=gt.manifest.world_size, comm=comm)
    use_steps = sorted(steps or gt.manifest.steps or sorted(set.intersection(*(set(nt.steps) for nt in workers.values()))))
    if isinstance(seq_base, int):
        seq_base = {f: seq_base for f in NCCL_FUNC.values()}

    # 1. per rank: instances per step, and the plugin collectives linked to them
    linked: dict[tuple[str, int], dict[int, tuple[_Instance, Coll]]] = defaultdict(dict)  # (txn, step) -> rank -> ...
    inst_by_rank: dict[int, dict[int, list[_Instance]]] = {}
    kept: dict[str, str] = {}
    for r, nt in workers.items():
        inst = _node_instances(nt, use_steps)
        inst_by_rank[r] = inst
        if r not in views:
            for v in inst.values():
                for x in v:
                    kept.setdefault(x.op.txn, f"no NCCL plugin trace for rank {r}")
            continue
        per_step: dict[str, int] = defaultdict(int)
        first = inst.get(use_steps[0], []) if use_steps else []
        for x in first:
            per_step[NCCL_FUNC[x.op.sub_op]] += 1
        off = time_offset_us.get(r) if isinstance(time_offset_us, dict) else time_offset_us
        windows = {s: nt.steps[s] for s in use_steps if s in nt.steps}
        assigned, how = _assign_steps(views[r], use_steps, windows, off, seq_base, per_step)
        for s in use_steps:
            by_func: dict[str, list[_Instance]] = defaultdict(list)
            for x in inst.get(s, []):
                by_func[NCCL_FUNC[x.op.sub_op]].append(x)
            for func, xs in by_func.items():
                cs = assigned.get((s, func), [])
                if len(cs) != len(xs):
                    for x in xs:
                        kept.setdefault(x.op.txn, f"rank {r} step {s}: {len(xs)} {func} in the gTrace, "
                                                  f"{len(cs)} in the NCCL trace (linked by {how})")
                    continue
                for x, c in zip(xs, cs):
                    # (AllGather / ReduceScatter count per-rank elements on one side only)
                    if func in ("AllReduce", "Broadcast") and c.bytes and x.op.bytes and c.bytes != x.op.bytes:
                        kept.setdefault(x.op.txn, f"rank {r} step {s}: {x.op.txn} has {x.op.bytes} bytes, "
                                                  f"NCCL seq {c.seq} {c.bytes} (linked by {how})")
                    linked[(x.op.txn, s)][r] = (x, c)

    # 2. per collective txn: all ranks, all steps, same structure
    txns = sorted({x.op.txn for inst in inst_by_rank.values() for v in inst.values() for x in v})
    plans: dict[str, dict[int, PairedCollective]] = {}
    for txn in txns:
        if txn in kept:
            continue
        ranks_with = sorted(r for r, inst in inst_by_rank.items() if any(x.op.txn == txn for v in inst.values() for x in v))
        op0 = next(x.op for x in (y for v in inst_by_rank[ranks_with[0]].values() for y in v) if x.op.txn == txn)
        group = list(op0.group) if op0.group else list(range(gt.manifest.world_size))
        if any(g not in workers for g in group):
            kept[txn] = f"ranks {[g for g in group if g not in workers]} of its group are not in the trace"
            continue
        per_step: dict[int, PairedCollective] = {}
        why = None
        for s in use_steps:
            got = linked.get((txn, s), {})
            if set(got) != set(group):
                why = f"step {s}: linked on ranks {sorted(got)} of {group}"
                break
            pc = collective_chunks({r: c for r, (_, c) in got.items()}, txn, nranks=len(group))
            if pc.problems:
                why = f"step {s}: {pc.problems[0]}"
                break
            if not any(pc.chunks.values()):
                why = f"step {s}: no network steps recorded (intra-node only, or proxy events off)"
                break
            per_step[s] = pc
        if why is None and per_step:
            shapes = {s: {r: sorted(c.key for c in v) for r, v in pc.chunks.items()} for s, pc in per_step.items()}
            ref = shapes[use_steps[0]]
            diff = [s for s, sh in shapes.items() if sh != ref]
            if diff:
                why = f"steps {diff} have other chunks (channels / steps) than step {use_steps[0]}"
        if why is not None or not per_step:
            kept[txn] = why or "no profiled steps"
            continue
        plans[txn] = per_step

    # 3. time offsets, in integer ns (plugin times are ~1.8e18 ns: as float µs they would
    #    keep only 0.25 µs)
    off_ns: dict[int, int] = {}
    for r in workers:
        given = time_offset_us.get(r) if isinstance(time_offset_us, dict) else time_offset_us
        if given is not None:
            off_ns[r] = _us_to_ns(given)
            res.offsets[r] = (float(given), "given")
            continue
        est = []
        for txn, per_step in plans.items():
            for s, pc in per_step.items():
                x = linked[(txn, s)][r][0]
                mine = [c for c in pc.chunks.get(r, []) if c.end is not None]
                ends = [c.end for c in mine if c.sub_op == "RECV"] or [c.end for c in mine]
                if ends:
                    est.append(_us_to_ns(x.ts + x.dur) - max(ends))
        if est:
            off_ns[r] = int(statistics.median_low(est))
            res.offsets[r] = (off_ns[r] / 1000.0, f"estimated from {len(est)} collective end(s)")

    # 4. rewrite the nodes
    if not plans:
        res.kept = kept
        res.notes.append("no NCCL collective could be replaced by measured chunks")
        return res
    new_nodes = dict(gt.nodes)
    for r, nt in workers.items():
        mine = {txn: p for txn, p in plans.items() if r in p[use_steps[0]].chunks}
        if not mine:
            continue
        new_nodes[nt.info.name] = _rewrite_node(nt, mine, linked, r, off_ns.get(r, 0), use_steps, res.notes)
    new_gt = replace(gt, nodes=new_nodes, notes=list(gt.notes))
    summary = f"NCCL plugin: {len(plans)} collective(s) replaced by measured chunks"
    if kept:
        summary += f", {len(kept)} kept coarse"
    new_gt.notes.append(summary)
    validate(new_gt)
    res.gtrace = new_gt
    res.replaced = sorted(plans)
    res.kept = kept
    return res


def _us_to_ns(us: float) -> int:
    """µs (a float, exactly as given) -> the nearest integer ns, without float rounding."""
    return round(Fraction(us) * 1000)


def _rewrite_node(
    nt: NodeTrace, plans: dict[str, dict[int, PairedCollective]],
    linked: dict[tuple[str, int], dict[int, tuple[_Instance, Coll]]], rank: int, offset_ns: int,
    steps: list[int], notes: list[str],
) -> NodeTrace:
    ops = dict(nt.ops)
    edges = list(nt.edges)
    events = [e for e in nt.events]
    replaced_ops: dict[str, str] = {}  # coarse op id -> txn
    for txn in plans:
        x0 = linked[(txn, steps[0])][rank][0]
        replaced_ops[x0.op.id] = txn
    preds: dict[str, list[str]] = defaultdict(list)
    succs: dict[str, list[str]] = defaultdict(list)
    for u, v in nt.edges:
        preds[v].append(u)
        succs[u].append(v)
    edges = [(u, v) for u, v in edges if u not in replaced_ops and v not in replaced_ops]
    events = [e for e in events if e.op not in replaced_ops]
    for op_id, txn in replaced_ops.items():
        x = nt.ops[op_id]
        per_step = plans[txn]
        pc0 = per_step[steps[0]]
        del ops[op_id]
        in_id, out_id = f"{op_id}/IN", f"{op_id}/OUT"
        common = dict(cat="COMM", tensor=x.tensor, layer=x.layer)
        ops[in_id] = Op(in_id, f"{x.name}:IN", device=x.device, sub_op="IN", bytes=x.bytes, txn=x.txn, group=None, **common)
        ops[out_id] = Op(out_id, f"{x.name}:OUT", device=x.device, sub_op="OUT", bytes=x.bytes, txn=x.txn, group=None, **common)
        edges += [(u, in_id) for u in preds[op_id] if u not in replaced_ops]
        edges += [(out_id, v) for v in succs[op_id] if v not in replaced_ops]
        # between two replaced collectives: OUT of the first -> IN of the second
        edges += [(f"{u}/OUT", in_id) for u in preds[op_id] if u in replaced_ops]
        edges.append((in_id, out_id))  # (a rank may have no network step at all)
        chunk_id = {}
        queues: dict[tuple, list] = defaultdict(list)
        for c in pc0.chunks[rank]:
            direction = f"send>{c.peer}" if c.sub_op == "SEND" else f"recv<{c.peer}"
            occ = f"#{c.occ}" if c.occ else ""
            cid = f"{op_id}/c{c.channel}/{direction}{occ}/s{c.step}"
            chunk_id[c.key] = cid
            ops[cid] = Op(cid, f"nccl:{c.sub_op.lower()}", device=f"nccl:c{c.channel}:{direction}", sub_op=c.sub_op,
                          bytes=c.bytes, txn=c.txn, peer=c.peer, **common)
            queues[c.queue].append(c)
        for q in queues.values():
            q.sort(key=lambda c: c.step)
            edges.append((in_id, chunk_id[q[0].key]))
            edges += [(chunk_id[a.key], chunk_id[b.key]) for a, b in zip(q, q[1:])]
            edges.append((chunk_id[q[-1].key], out_id))
        deps, note = data_dependencies(pc0, rank)
        if note and note not in notes:
            notes.append(note)
        edges += [(chunk_id[a.key], chunk_id[b.key]) for a, b in deps]
        for s in steps:
            inst = linked[(txn, s)][rank][0]
            events.append(Event(in_id, s, inst.ts, 0.0))
            events.append(Event(out_id, s, inst.ts + inst.dur, 0.0))
            for c in per_step[s].chunks[rank]:
                events.append(Event(chunk_id[c.key], s, (c.start + offset_ns) / 1000.0, (c.end - c.start) / 1000.0))
    return NodeTrace(
        info=nt.info, ops=ops, edges=sorted(set(edges)), events=events, steps=dict(nt.steps),
        tensors=list(nt.tensors), meta=dict(nt.meta),
    )
