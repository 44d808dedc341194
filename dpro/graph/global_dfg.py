"""Join local DFGs through the communication topology into one global DFG.

Local ops become ``<node>/<op>`` on device ``<node>/<device>``.  A coarse collective
(one op per rank, as gloo and NCCL kernels record it) whose whole group is present is
replaced, on every rank, by a virtual IN op (the rank joins; it carries the host gap
before the collective), the 2(N-1) SEND steps of a ring AllReduce on the directed links
``link:r->r+1`` (cost from :mod:`dpro.graph.comm_model`), and a virtual OUT op that the
local consumers wait for.  NCCL collectives of the other kinds on accelerator streams are
expanded as well: AllGather, ReduceScatter and Broadcast as N-1 ring steps, AllToAll as N-1
rounds of pairwise transfers (``comm_model.PATTERNS``), with alpha/beta fitted per process
group.  Point-to-point transfers of a Kineto import (a SEND and the RECV with its transaction
id ``p2p/<src>-><dst>/...``, :data:`P2P_TXN`) are expanded alike: one transfer of the message
on ``link:src->dst`` once both ranks have joined, which both wait for (gloo's send returns
when the receiver has the data), with alpha/beta fitted per pair of ranks.
Collectives whose peers are absent keep their measured time.
Fine-grained SEND/RECV and PUSH/PULL ops already in the trace are joined producer ->
consumer by transaction id.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

from dpro.graph.builder import GraphBuilder
from dpro.graph.comm_model import (
    P2P, PATTERNS, LinkCost, chunk_bytes, collective_steps, fit_collective_cost, fit_link_cost,
)
from dpro.graph.compiled import CAT_CODE, CompiledGraph
from dpro.graph.intervals import busy_periods
from dpro.graph.overhead import ACCELERATORS, stats_without_overhead
from dpro.graph.stats import OpStats, node_stats
from dpro.gtrace.schema import COARSE_SUB_OPS, GTrace
from dpro.gtrace.validate import PAIRS

log = logging.getLogger(__name__)


@dataclass
class BuildOptions:
    """How to build the global DFG."""

    #: expand coarse AllReduce collectives into ring steps when all ranks are present
    expand_collectives: bool = True
    #: override the fitted link cost
    link_cost: LinkCost | None = None
    #: with ``link_cost``: the cost per process group (its sorted ranks), e.g. fitted on other
    #: steps (:attr:`BuildInfo.group_costs`; the leave-one-out check of docs/fidelity.md)
    group_costs: dict[tuple[int, ...], LinkCost] | None = None
    #: restrict to these steps (default: the manifest's)
    steps: list[int] | None = None
    #: scale each worker's CPU ops by its measured profiling overhead (dpro.graph.overhead):
    #: predict the job as it runs unprofiled
    remove_overhead: bool = False


@dataclass
class BuildInfo:
    """What the builder decided, for the report."""

    link_cost: LinkCost | None = None
    #: the cost fitted per process group (its sorted ranks), where it was fitted per group
    group_costs: dict[tuple[int, ...], LinkCost] = field(default_factory=dict)
    expanded: int = 0
    kept_coarse: int = 0
    notes: list[str] = field(default_factory=list)


def _collective_busy_periods(gt: GTrace, stats: dict[str, dict[str, OpStats]],
                             groups: dict[str, list[tuple[str, str]]]) -> list[tuple[int, int, int, float]]:
    """(collectives, total bytes, ranks, duration µs) per busy period of complete AllReduces.

    A collective instance starts when its last rank started it and ends when its last rank
    finished; overlapping instances of one step over as many ranks form one period (see
    comm_model).
    """
    inst: dict[int, list[tuple[float, float, int, int]]] = defaultdict(list)
    for txn, members in groups.items():
        nbytes = max(gt.nodes[n].ops[o].bytes for n, o in members)
        per_step: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for node, op_id in members:
            for s, (ts, end, _) in stats[node][op_id].samples.items():
                per_step[s].append((ts, end))
        for s, v in per_step.items():
            if len(v) == len(members):
                inst[s].append((max(t for t, _ in v), max(e for _, e in v), nbytes, len(members)))
    return [(p.pieces, p.bytes, p.group, p.duration_us) for v in inst.values() for p in busy_periods(v)]


#: transaction id prefix of the point-to-point transfers a Kineto import joins across ranks
P2P_TXN = "p2p/"


def _is_p2p(op) -> bool:
    return op.sub_op in P2P and op.txn is not None and op.txn.startswith(P2P_TXN) and op.group is not None


def _fit_per_group(gt: GTrace, stats: dict[str, dict[str, OpStats]], complete: dict[str, list[tuple[str, str]]],
                   info: BuildInfo) -> tuple[LinkCost | None, dict[tuple[int, ...], LinkCost]]:
    """alpha + beta * bytes per process group (its ranks) from the run's own collectives of
    every kind (:func:`dpro.graph.comm_model.fit_collective_cost`), and over all groups
    (the fallback for a group whose own fit fails)."""
    per_group: dict[tuple[int, ...], list[tuple[float, float, int, float, int]]] = defaultdict(list)
    for txn, members in complete.items():
        op0 = gt.nodes[members[0][0]].ops[members[0][1]]
        ranks = tuple(sorted(gt.nodes[nn].info.rank for nn, _ in members))
        n = len(ranks)
        nbytes = max(gt.nodes[nn].ops[o].bytes for nn, o in members)
        per_step: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for node, op_id in members:
            for st, (ts, end, _) in stats[node][op_id].samples.items():
                per_step[st].append((ts, end))
        for st, v in per_step.items():
            if len(v) == n:
                per_group[ranks].append((max(t for t, _ in v), max(e for _, e in v),
                                         collective_steps(op0.sub_op, n), chunk_bytes(op0.sub_op, nbytes, n), n))
    fits = {g: c for g, v in per_group.items() if (c := fit_collective_cost(v)) is not None}
    overall = fit_collective_cost([i for v in per_group.values() for i in v])
    for g, c in sorted(fits.items()):
        bw = f"{1e-3 / c.beta:.2f} GB/s per link" if c.beta > 0 else "no bandwidth term (sizes do not explain the times)"
        info.notes.append(f"link cost of group {list(g)}: alpha {c.alpha:.2f} us, {bw} ({c.samples} busy periods, "
                          f"fit error {100 * c.fit_error:.0f}%)")
    return overall, fits


def _expand_pairwise(b: GraphBuilder, txn: str, ranks: list[int], by_rank: dict[int, tuple[str, str]], step_dur: float,
                     prio: float, idx: dict[tuple[str, str], int], ends: dict[tuple[str, str], int]) -> None:
    """AllToAll as N-1 rounds of pairwise transfers: in round s rank r sends its chunk for
    r+s on the link ``link:r->r+s``, after its previous round; a transfer needs both ranks
    to have joined (IN); a rank's OUT waits for every transfer from and to it."""
    n = len(ranks)
    into: dict[int, list[int]] = defaultdict(list)
    last: dict[int, int] = {}
    for s in range(1, n):
        for j, r in enumerate(ranks):
            p = ranks[(j + s) % n]
            node = by_rank[r][0]
            d = b.add_device(f"link:{r}->{p}", owner=node, is_comm=True)
            i = b.add_op(f"{txn}/a2a{s}/{r}->{p}", dur=step_dur, cat="COMM", device=d, prio=prio)
            b.add_edge(last.get(r, idx[by_rank[r]]), i)
            b.add_edge(idx[by_rank[p]], i)
            last[r] = i
            into[p].append(i)
    for r in ranks:
        for i in into[r] + [last[r]]:
            b.add_edge(i, ends[by_rank[r]])


def _p2p_ends(gt: GTrace, members: list[tuple[str, str]]) -> tuple[int, int] | None:
    """(sender, receiver) ranks of a point-to-point transfer."""
    by_sub = {gt.nodes[n].ops[o].sub_op: gt.nodes[n].info.rank for n, o in members}
    return (by_sub["SEND"], by_sub["RECV"]) if set(by_sub) == {"SEND", "RECV"} else None


def build_global_dfg(gt: GTrace, options: BuildOptions | None = None, *,
                     stats: dict[str, dict[str, OpStats]] | None = None) -> tuple[CompiledGraph, BuildInfo]:
    """Build the global DFG of ``gt`` ready for replay.

    ``stats``: every node's op statistics over the steps the options select
    (``{node name: node_stats(nt, steps)}``), where the caller has them already; they are
    not changed (``remove_overhead`` scales copies)."""
    opts = options or BuildOptions()
    info = BuildInfo()
    steps = opts.steps or gt.manifest.steps or None
    if stats is None:
        stats = {name: node_stats(nt, steps) for name, nt in gt.nodes.items()}
    if opts.remove_overhead:
        stats, notes = stats_without_overhead(gt, stats)
        info.notes.extend(notes)
    present = {nt.info.rank: name for name, nt in gt.nodes.items() if nt.info.role == "worker"}

    # Coarse collectives whose whole group is present get expanded: AllReduce anywhere; the
    # other kinds of comm_model.PATTERNS where they run on an accelerator stream (NCCL).
    groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for name, nt in gt.nodes.items():
        for op in nt.ops.values():
            if op.cat == "COMM" and op.txn is not None and (
                    op.sub_op == "ALLREDUCE" or (op.sub_op in PATTERNS and op.device.startswith(ACCELERATORS))
                    or _is_p2p(op)):
                groups[op.txn].append((name, op.id))
    complete = {}
    for txn, members in groups.items():
        op0 = gt.nodes[members[0][0]].ops[members[0][1]]
        ranks = list(op0.group) if op0.group else list(range(gt.manifest.world_size))
        if len(ranks) > 1 and all(r in present for r in ranks) and len(members) == len(ranks):
            complete[txn] = members
    cost = opts.link_cost
    group_cost: dict[tuple[int, ...], LinkCost] = dict(opts.group_costs or {}) if cost is not None else {}
    kinds = {gt.nodes[m[0][0]].ops[m[0][1]].sub_op for m in complete.values()}
    rank_sets = {frozenset(gt.nodes[nn].info.rank for nn, _ in m) for m in complete.values()}
    if opts.expand_collectives and complete and cost is None:
        if kinds == {"ALLREDUCE"} and len(rank_sets) == 1:
            cost = fit_link_cost(_collective_busy_periods(gt, stats, complete))
        else:
            cost, group_cost = _fit_per_group(gt, stats, complete, info)
        if cost is None:
            info.notes.append("collective sizes unknown (record_shapes off?): collectives keep measured times")
    info.link_cost = cost
    info.group_costs = group_cost
    expand = set(complete) if (opts.expand_collectives and cost is not None) else set()

    # Fine-grained producer -> consumer pairs (SEND -> RECV, PUSH_REQ -> PUSH_RES, ...).
    by_txn: dict[tuple[str, str], tuple[str, str]] = {}
    for name, nt in gt.nodes.items():
        for op in nt.ops.values():
            if op.cat == "COMM" and op.sub_op not in COARSE_SUB_OPS and op.txn is not None and not _is_p2p(op):
                by_txn[(op.sub_op, op.txn)] = (name, op.id)
    pairs = [(by_txn[(prod, txn)], by_txn[(cons, txn)])
             for prod, cons in PAIRS.items() for (sub, txn) in by_txn if sub == prod and (cons, txn) in by_txn]
    paired_consumers = {consumer for _, consumer in pairs}
    b = GraphBuilder()
    idx: dict[tuple[str, str], int] = {}
    ends: dict[tuple[str, str], int] = {}  # op whose end stands for the local op's end (OUT for expanded)
    for name, nt in gt.nodes.items():
        st = stats[name]
        non_comm = {op.device for op in nt.ops.values() if op.cat != "COMM"}
        dev_of: dict[str, int] = {}  # op.device -> builder device, added on first use as before
        # the ops not expanded, added in one GraphBuilder.add_ops call per node (flushed before an
        # expanded op's IN/OUT so that indices stay in order)
        names: list[str] = []
        durs: list[float] = []
        gaps: list[float] = []
        cats: list[int] = []
        devs: list[int] = []
        prios: list[float] = []
        base = b.n
        for op in nt.ops.values():
            s = st[op.id]
            d = dev_of.get(op.device)
            if d is None:
                d = dev_of[op.device] = b.add_device(f"{name}/{op.device}", owner=name,
                                                     is_comm=op.device not in non_comm)
            key = (name, op.id)
            if op.txn in expand:
                b.add_ops(names, durs, gaps, cats, devs, prios)
                names, durs, gaps, cats, devs, prios = [], [], [], [], [], []
                i_in = b.add_op(f"{name}/{op.id}:IN", dur=0.0, gap=s.gap, cat="COMM", device=d, prio=s.offset)
                i_out = b.add_op(f"{name}/{op.id}:OUT", dur=0.0, cat="COMM", device=d, prio=s.offset)
                idx[key], ends[key] = i_in, i_out
                base = b.n
            else:
                # A consumer (RECV, PUSH_RES, PULL_RES) whose producer is in the trace waits for it
                # through a cross-node edge; its local gap would count that wait a second time.
                idx[key] = ends[key] = base + len(names)
                names.append(f"{name}/{op.id}")
                durs.append(s.dur)
                gaps.append(0.0 if key in paired_consumers else s.gap)
                cats.append(CAT_CODE[op.cat])
                devs.append(d)
                prios.append(s.offset)
        b.add_ops(names, durs, gaps, cats, devs, prios)
        b.src.extend([ends[(name, u)] for u, _ in nt.edges])
        b.dst.extend([idx[(name, v)] for _, v in nt.edges])

    # Expansion: rings (AllReduce; AllGather, ReduceScatter, Broadcast: one ring half), pairwise
    # exchanges (AllToAll).
    for txn in sorted(expand):
        members = complete[txn]
        by_rank = {gt.nodes[n].info.rank: (n, o) for n, o in members}
        ranks = sorted(by_rank)
        n = len(ranks)
        nbytes = max(gt.nodes[nn].ops[o].bytes for nn, o in members)
        sub = gt.nodes[members[0][0]].ops[members[0][1]].sub_op
        c = group_cost.get(tuple(ranks), cost)
        prio = max(stats[nn][o].offset for nn, o in members)
        if sub in P2P:  # one transfer from the sender to the receiver; both wait for it
            src, dst = _p2p_ends(gt, members) or (ranks[0], ranks[1])
            d = b.add_device(f"link:{src}->{dst}", owner=by_rank[src][0], is_comm=True)
            i = b.add_op(f"{txn}/p2p/{src}->{dst}", dur=c.step_us(nbytes), cat="COMM", device=d, prio=prio)
            for r in ranks:
                b.add_edge(idx[by_rank[r]], i)
                b.add_edge(i, ends[by_rank[r]])
            info.expanded += 1
            continue
        if PATTERNS[sub] == "pairwise":
            _expand_pairwise(b, txn, ranks, by_rank, c.step_us(chunk_bytes(sub, nbytes, n)), prio, idx, ends)
            info.expanded += 1
            continue
        step_dur = c.step_us(nbytes / n) if sub == "ALLREDUCE" else c.step_us(chunk_bytes(sub, nbytes, n))
        prev: list[int] = []
        for s in range(collective_steps(sub, n)):
            cur = []
            for j, r in enumerate(ranks):
                nxt = ranks[(j + 1) % n]
                node = by_rank[r][0]
                d = b.add_device(f"link:{r}->{nxt}", owner=node, is_comm=True)
                i = b.add_op(f"{txn}/ring{s}/{r}->{nxt}", dur=step_dur, cat="COMM", device=d, prio=prio)
                if s == 0:
                    b.add_edge(idx[by_rank[r]], i)
                    b.add_edge(idx[by_rank[nxt]], i)
                else:
                    b.add_edge(prev[j - 1], i)  # the chunk received from the previous rank
                    b.add_edge(prev[j], i)
                cur.append(i)
            prev = cur
        for j, r in enumerate(ranks):
            b.add_edge(prev[j - 1], ends[by_rank[r]])
            b.add_edge(prev[j], ends[by_rank[r]])
        info.expanded += 1
    info.kept_coarse = len(groups) - len(expand)

    for producer, consumer in pairs:
        b.add_edge(ends[producer], idx[consumer])

    g = b.compile({"link_cost": cost})
    return g, info
