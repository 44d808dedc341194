"""Model + strategy -> the replayable graph of one worker (replayed by :mod:`dpro.optimizer.evaluate`).

Symmetry: every worker is the representative one, so one is enough. The graph:

* computation ops on their device queues, with own time + host gap; a fused chain is one
  op of its estimated duration;
* per synchronisation group, in launch order: an ``IN`` op on the ``comm`` queue (the
  launch: the host time of one collective launch; it waits for the group's ``ready``
  ops and for the previous group's launch, as DDP and Horovod launch in order), then the
  transfer, then an ``OUT`` op the units' consumers wait for;
* AllReduce transfer: each of the group's k pieces is a chain of 2(N-1) ring steps of
  ``alpha + beta * bytes/(k N)`` on the ``link`` device (by symmetry the link out of this
  worker behaves like every other link);
* parameter server (``scheme == "ps"``, :mod:`dpro.optimizer.ps.layout`): piece p of a group whose
  unsplit home is server h goes to server ``(h + p) mod S``; a push on this worker's
  connection to that server, the server's update (``update_alpha + update_beta *
  bytes/k`` on its CPU), then a pull. The messages are replayed at flow level
  (:mod:`dpro.replayer.port_sharing`): one at a time per connection, ``alpha`` each, their bytes
  sharing the worker's port and at most 1/N of the server's.

Recomputation adds a node that reruns a block's forward before its backward; gradient
accumulation copies the micro-batch's nodes (:func:`micro_ops`). ``coarsen=True`` contracts
chains of computation ops into one node each (the paper's coarsened view).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpro.graph.builder import GraphBuilder
from dpro.graph.comm_model import ring_steps
from dpro.graph.compiled import CompiledGraph, compile_graph
from dpro.optimizer.blocks import block
from dpro.optimizer.job_model import JobModel
from dpro.optimizer.ps.layout import piece_server
from dpro.optimizer.strategy import Strategy
from dpro.replayer.port_sharing import PULL, PUSH, Flow

KIND_COMP, KIND_IN, KIND_XFER, KIND_OUT = 0, 1, 2, 3

#: categories of the ops a micro-batch runs (gradient accumulation repeats them)
MICRO = ("FW", "BW")
#: name of a recomputed block's node, and of a copy of an op in an earlier micro-batch
RECOMPUTE_PREFIX = "recompute:"
MB_SEP = "@mb"


@dataclass
class BuiltGraph:
    """A compiled graph and, per node, what it stands for."""

    graph: CompiledGraph
    kind: np.ndarray  #: KIND_* per node
    group: np.ndarray  #: group index (sync nodes) or -1
    ops: list[tuple[str, ...]]  #: computation op ids per node (empty for sync nodes)
    node_of_op: dict[str, int]
    #: PS messages (:mod:`dpro.replayer.port_sharing`) by node; None: every node on its FIFO device
    flows: dict[int, Flow] | None = None


#: (device, duration, label, the message it sends or None) of one step of a piece
XferStep = tuple[str, float, str, Flow | None]


def _piece_chains(model: JobModel, nbytes: float, k: int, home: int = 0) -> list[list[XferStep]]:
    """The transfer of a group split in ``k``: per piece, the chain of its steps (device,
    duration, label, the message's flow or None), run one after the other.

    Ring AllReduce: 2(N-1) steps on the ``link``. Parameter server (``home``: the group's
    server): push -> the server's update -> pull, the push and pull messages on this
    worker's connection to the piece's server (:mod:`dpro.replayer.port_sharing` shares the ports
    among them; their duration is what one takes alone)."""
    n, lc = max(1, model.world_size), model.link
    if model.scheme != "ps":
        if n <= 1:
            return [[] for _ in range(k)]
        step = lc.step_us(nbytes / (k * n))
        return [[("link", step, f"piece{p}:step{i}", None) for i in range(ring_steps(n))] for p in range(k)]
    lay, alone, out = model.ps, lc.alpha + lc.beta * n * nbytes / k, []
    for p in range(k):
        s = piece_server(home, p, model.servers)
        chain: list[XferStep] = [(f"link:server{s}:push", alone, f"piece{p}:push@server{s}", Flow(nbytes / k, PUSH))]
        if lay is not None:
            chain.append((f"server{s}", lay.update_alpha + lay.update_beta * nbytes / k,
                          f"piece{p}:update@server{s}", None))
        chain.append((f"link:server{s}:pull", alone, f"piece{p}:pull@server{s}", Flow(nbytes / k, PULL)))
        out.append(chain)
    return out


class WorkerGraphBuilder(GraphBuilder):
    """The builder of one worker's graph: every device is the worker's, and each node also
    records what it stands for (kind, group, computation ops)."""

    def __init__(self) -> None:
        super().__init__()
        self.kind: list[int] = []
        self.group: list[int] = []
        self.ops: list[tuple[str, ...]] = []

    def add_node(self, name: str, *, dur: float, cat: str, device: str, prio: float, kind: int, group: int,
                 ops: tuple[str, ...] = ()) -> int:
        """Add a node of ``dur`` µs (no separate host gap) on the worker's device ``device``."""
        d = self.add_device(device, owner="worker", is_comm=device == "comm" or device.startswith(("link", "server")))
        self.kind.append(kind)
        self.group.append(group)
        self.ops.append(ops)
        return self.add_op(name, dur=dur, cat=cat, device=d, prio=prio)

    def copy_node(self, i: int, j: int, shift: float) -> int:
        """A copy of node ``i`` for micro-batch ``j``, ``shift`` earlier."""
        self.kind.append(self.kind[i])
        self.group.append(self.group[i])
        self.ops.append(tuple(f"{o}{MB_SEP}{j}" for o in self.ops[i]))
        return self.copy_op(i, name=f"{self.names[i]}{MB_SEP}{j}", prio=self.prio[i] - shift)


def build(model: JobModel, strategy: Strategy, *, coarsen: bool = False) -> BuiltGraph:
    """The replayable graph of ``strategy`` applied to ``model``."""
    b = WorkerGraphBuilder()
    node_of_op: dict[str, int] = {}
    flows: dict[int, Flow] = {}
    mb = max(1, strategy.accum)

    in_mb = micro_ops(model) if mb > 1 else frozenset()

    def comp_dur(ops: tuple[str, ...], d: float) -> float:
        # a micro-batch of 1/k of the batch: the ops' own time scales (or is interpolated
        # from a trace at a smaller batch), the host gaps do not
        o = model.ops[ops[0]]
        if mb == 1 or ops[0] not in in_mb or o.cat not in MICRO:
            return d
        own = sum(model.ops[x].dur for x in ops)
        return max(0.0, d - own) + micro_own_us(model, ops, mb)

    for f in strategy.fusions:
        first = model.ops[f.ops[0]]
        i = b.add_node("+".join(f.ops), dur=comp_dur(f.ops, f.dur), cat=first.cat, device=first.device,
                       prio=first.prio, kind=KIND_COMP, group=-1, ops=f.ops)
        for o in f.ops:
            node_of_op[o] = i
    scale = {sc.op: sc.time for sc in strategy.scales}
    for op in model.ops.values():
        if op.id not in node_of_op:
            own = op.dur * scale.get(op.id, 1.0)
            node_of_op[op.id] = b.add_node(op.id, dur=comp_dur((op.id,), own + op.gap), cat=op.cat, device=op.device,
                                           prio=op.prio, kind=KIND_COMP, group=-1, ops=(op.id,))
    comp_edges = {(node_of_op[x], node_of_op[y]) for x, y in model.edges if node_of_op[x] != node_of_op[y]}
    for name in strategy.recompute:
        comp_edges |= _recompute_node(model, name, node_of_op, comp_edges, mb, b)
    if mb > 1:
        prio = b.prio
        micro = [i for i, ops in enumerate(b.ops) if ops[0].startswith(RECOMPUTE_PREFIX) or ops[0] in in_mb]
        lo, hi = min(prio[i] for i in micro), max(prio[i] for i in micro)
        skip = {i for i in range(b.n) if lo <= prio[i] <= hi} - set(micro)
        comp_edges |= _micro_batch_copies(micro, skip, mb, comp_edges, max(prio) - min(prio) + 1.0, b.copy_node)
    for x, y in sorted(comp_edges):
        b.add_edge(x, y)

    anc = _ancestors(model)
    reach = 0  # ops that must end before some group launched so far can launch
    prev_in = -1
    for g, members in enumerate(strategy.groups):
        for u in members:
            for r in model.units[u].ready:
                reach |= anc[r]
        k = strategy.partitions[g]
        nbytes = float(sum(model.units[u].bytes for u in members))
        i_in = b.add_node(f"group{g}:IN", dur=model.launch_us, cat="COMM", device="comm", prio=g, kind=KIND_IN, group=g)
        i_out = b.add_node(f"group{g}:OUT", dur=0.0, cat="COMM", device="comm", prio=g + 0.5, kind=KIND_OUT, group=g)
        for u in members:
            for r in model.units[u].ready:
                b.add_edge(node_of_op[r], i_in)
            for c in model.units[u].consumers:
                # A wait recorded inside the backward pass (e.g. CPU contention with the
                # collective) cannot survive a grouping that launches after that op.
                if not (reach >> model.op_index[c]) & 1:
                    b.add_edge(i_out, node_of_op[c])
        if prev_in >= 0:
            b.add_edge(prev_in, i_in)
        prev_in = i_in
        home = model.ps.home[members[0]] if model.ps is not None else 0
        for p, chain in enumerate(_piece_chains(model, nbytes, k, home)):
            last = i_in
            for dv, t, label, flow in chain:
                i = b.add_node(f"group{g}:{label}", dur=t, cat="COMM", device=dv, prio=g + p / (k + 1),
                               kind=KIND_XFER, group=g)
                b.add_edge(last, i)
                last = i
                if flow is not None:
                    flows[i] = flow
            b.add_edge(last, i_out)
    if coarsen and not flows:
        return _coarsen(b)
    return BuiltGraph(b.compile(), np.array(b.kind), np.array(b.group), b.ops, node_of_op, flows or None)


def micro_ops(model: JobModel) -> frozenset[str]:
    """The ops each micro-batch runs: every computation op from the step's first forward
    op to its last backward op, except updates and the ops that wait for a
    synchronisation (e.g. DDP copying reduced buckets back: not under ``no_sync()``)."""
    fb = [o.prio for o in model.ops.values() if o.cat in MICRO]
    if not fb:
        return frozenset()
    lo, hi = min(fb), max(fb)
    waits = {c for u in model.units for c in u.consumers}
    return frozenset(o.id for o in model.ops.values() if lo <= o.prio <= hi and o.cat != "UPDATE" and o.id not in waits)


def micro_own_us(model: JobModel, ops: tuple[str, ...], k: int) -> float:
    """Own time of ``ops`` on 1/k of the batch: interpolated per op between the two
    measured batch sizes when the model has a trace at a smaller batch
    (:func:`dpro.optimizer.memory.micro_batch.attach_micro_trace`), else 1/k of the full-batch time."""
    if model.micro is None:
        return sum(model.ops[o].dur for o in ops) / k
    r, small = model.micro
    x = 1.0 / k
    out = 0.0
    for o in ops:
        tb = model.ops[o].dur
        tr = small.get(o)
        out += tb * x if tr is None else max(0.0, tr + (tb - tr) * (x - r) / (1.0 - r))
    return out


def _recompute_node(model: JobModel, name: str, node_of_op: dict[str, int], edges: set[tuple[int, int]], k: int,
                    b: WorkerGraphBuilder) -> set[tuple[int, int]]:
    """Add the node that reruns block ``name``'s forward before its backward; its edges.

    It waits for what the block's first backward op waits for and every backward op of
    the block waits for it (acyclic: that op is the earliest of the block's backward)."""
    blk = block(model, name)
    if not blk.fw or not blk.bw:
        return set()
    fw = model.ops[blk.fw[0]]
    d = sum(model.ops[o].gap for o in blk.fw) + (micro_own_us(model, blk.fw, k) if k > 1 else
                                                 sum(model.ops[o].dur for o in blk.fw))
    first_bw = model.ops[blk.bw[0]]
    r = b.add_node(RECOMPUTE_PREFIX + name, dur=d, cat="BW", device=fw.device, prio=first_bw.prio - 1e-3, kind=KIND_COMP,
                   group=-1, ops=(RECOMPUTE_PREFIX + name,))
    bw_nodes = {node_of_op[o] for o in blk.bw}
    head = node_of_op[blk.bw[0]]
    out = {(a, r) for a, c in edges if c == head and a not in bw_nodes}
    out |= {(r, c) for c in bw_nodes}
    return out


def _micro_batch_copies(micro: list[int], skip: set[int], k: int, edges: set[tuple[int, int]], span: float,
                        clone) -> set[tuple[int, int]]:
    """Gradient accumulation: copies of the forward/backward nodes ``micro`` for micro-batches 1..k-1.

    The existing nodes are the last micro-batch (its backward launches the
    synchronisation); copy j runs before copy j+1: its last nodes feed the next copy's
    first ones. What precedes the forward (the batch, zero_grad) precedes copy 1; what
    follows the backward (the update) follows the last micro-batch only; ``skip`` (nodes
    amid the micro-batch that it does not run, e.g. waits for a synchronisation) are
    bypassed in the copies. ``clone(i, j, shift)`` adds a copy of node i for micro-batch
    j, ``shift`` earlier."""
    mset = set(micro)
    succ: dict[int, list[int]] = {}
    for a, b in edges:
        succ.setdefault(a, []).append(b)
    inner: set[tuple[int, int]] = set()
    for a in micro:
        stack, seen = list(succ.get(a, ())), set()
        while stack:
            b = stack.pop()
            if b in mset:
                inner.add((a, b))
            elif b in skip and b not in seen:
                seen.add(b)
                stack.extend(succ.get(b, ()))
    has_in = {b for _, b in inner}
    has_out = {a for a, _ in inner}
    sources = [i for i in micro if i not in has_in]
    sinks = [i for i in micro if i not in has_out]
    out: set[tuple[int, int]] = set()
    prev: dict[int, int] | None = None
    for j in range(1, k):
        cp = {i: clone(i, j, (k - j) * span) for i in micro}
        out |= {(cp[a], cp[b]) for a, b in inner}
        if prev is None:
            out |= {(a, cp[b]) for a, b in edges if b in mset and a not in mset and a not in skip}
        else:
            out |= {(prev[a], cp[b]) for a in sinks for b in sources}
        prev = cp
    if prev is not None:
        out |= {(prev[a], b) for a in sinks for b in sources}
    return out


def _ancestors(model: JobModel) -> dict[str, int]:
    """Per op, a bit set (over ``model.op_index``) of the op and its ancestors."""
    if model.ancestors is None:
        preds: dict[str, list[str]] = {o: [] for o in model.ops}
        for a, b in model.edges:
            preds[b].append(a)
        anc: dict[str, int] = {}
        for o in model.topo_order():
            bits = 1 << model.op_index[o]
            for p in preds[o]:
                bits |= anc[p]
            anc[o] = bits
        model.ancestors = anc
    return model.ancestors


def _coarsen(wg: WorkerGraphBuilder) -> BuiltGraph:
    """Contract chains u -> v of computation ops on one device where u's only successor is v
    and v's only predecessor is u: the chain replays exactly as one op (the paper's
    coarsened view). Sync nodes are never contracted."""
    names, dur, cat, device, prio, kind, group, opsof = (
        wg.names, wg.dur, wg.cat, wg.device, wg.prio, wg.kind, wg.group, wg.ops)
    src, dst = wg.src, wg.dst
    n = len(names)
    outs = [[] for _ in range(n)]
    ins = [[] for _ in range(n)]
    for a, b in set(zip(src, dst)):
        outs[a].append(b)
        ins[b].append(a)
    head = list(range(n))
    for v in sorted(range(n), key=lambda i: prio[i]):
        if kind[v] != KIND_COMP or len(ins[v]) != 1:
            continue
        u = ins[v][0]
        if kind[u] == KIND_COMP and len(outs[u]) == 1 and device[u] == device[v]:
            head[v] = head[u]
    # resolve heads along chains (heads form forests pointing backwards)
    for v in range(n):
        h = head[v]
        while head[h] != h:
            h = head[h]
        head[v] = h
    keep = sorted({head[v] for v in range(n)})
    new = {h: i for i, h in enumerate(keep)}
    ndur = np.zeros(len(keep))
    nops: list[tuple[str, ...]] = [() for _ in keep]
    for v in range(n):
        ndur[new[head[v]]] += dur[v]
        nops[new[head[v]]] += opsof[v]
    es = {(new[head[a]], new[head[b]]) for a, b in zip(src, dst) if head[a] != head[b]}
    s2 = [a for a, _ in es]
    d2 = [b for _, b in es]
    g = compile_graph(names=[names[h] for h in keep], dur=ndur, cat=[cat[h] for h in keep],
                      device=[device[h] for h in keep], prio=[prio[h] for h in keep], src=s2, dst=d2,
                      devices=wg.devices, device_owner=wg.device_owner, owners=wg.owners, device_is_comm=wg.device_is_comm)
    node_of_op = {o: i for i, ops in enumerate(nops) for o in ops}
    return BuiltGraph(g, np.array([kind[h] for h in keep]), np.array([group[h] for h in keep]), nops, node_of_op)
