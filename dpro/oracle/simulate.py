"""``dpro oracle --simulate``: a strategy's global DFG from the profiled layers, replayed.

The analytical model sums computation and communication. Here each strategy becomes a
data-flow graph run by dpro's replayer (dpro/replayer/engine.py ``simulate``), so that
ordering and overlap are simulated:

* one compute chain per model-parallel group (its ranks run the same ops): every layer's
  forward, then every layer's backward in reverse, then the weight update, each with the
  strategy's share of the profiled time (the same shares as the formulas);
* each collective (layer-wise all-gather / all-reduce, halo exchange, gradient exchange)
  is one op, after the ops that produce its input in every group taking part and before
  those that consume its output; all collectives of a job queue on one ``net`` device,
  so the concurrent groups of a hybrid wait for each other there (the contention that the
  formulas express with φ) — with contention off, or on a platform whose ranks have
  links of their own (the calibration's topology "per-rank"), one link per group;
* pipeline: one device per stage, GPipe order (all micro-batches forward, then all
  backward); each transfer is a **rendezvous** of the two stages (gloo's ``dist.send``
  returns only once the receiver has posted its ``dist.recv``, whatever the size:
  measured, docs/oracle.md): one op on the pair's link after the sender's previous op
  and the receiver's, before the next op of both, in each stage's program order (before
  #29's fourth session: a send blocked its sender only, as if buffered by the receiver;
  before its third: on a link of its own, overlapping the sender's next compute).

Collective durations are the formulas' ring costs without φ (on a link with a token
bucket, each message's wire time in the bucket's steady state over the step, as the
analytical prediction's ``wires`` has it). Device counts above
:data:`MAX_GROUPS` groups are not simulated (the formulas scale; the graph would not).
"""

from __future__ import annotations

import math

from dpro.graph.builder import GraphBuilder
from dpro.oracle.calibration import HostCosts
from dpro.oracle.formulas import (
    Link,
    Options,
    Prediction,
    Wires,
    _blocks,
    channel_host,
    gather_host,
    grads_host,
    halo_host,
    link_of,
    stages,
)
from dpro.oracle.layers import CHANNELWISE, WEIGHTED, Layer, ModelProfile
from dpro.oracle.platform import Platform
from dpro.replayer.engine import simulate

MAX_GROUPS = 256


class _Graph:
    """GraphBuilder with one compute chain per group and joint collectives."""

    def __init__(self, chains: int, shared_net: bool, slowdown: float = 1.0) -> None:
        self.b = GraphBuilder()
        self.slowdown = slowdown
        self.cpu = [self.b.add_device(f"group{i}:cpu", owner=f"group{i}", is_comm=False) for i in range(chains)]
        self.last: list[int | None] = [None] * chains
        self.shared = shared_net
        self.k = 0

    def _prio(self) -> float:
        self.k += 1
        return float(self.k)

    def compute(self, chain: int, name: str, dur: float, cat: str = "FW") -> None:
        i = self.b.add_op(name, dur=max(0.0, dur) * self.slowdown, cat=cat, device=self.cpu[chain], prio=self._prio())
        if self.last[chain] is not None:
            self.b.add_edge(self.last[chain], i)
        self.last[chain] = i

    def collective(self, chains: list[int], name: str, dur: float, link: str) -> None:
        if dur <= 0:
            return
        dev = self.b.add_device("net" if self.shared else f"net:{link}", owner="net", is_comm=True)
        i = self.b.add_op(name, dur=dur, cat="COMM", device=dev, prio=self._prio())
        for c in chains:
            if self.last[c] is not None:
                self.b.add_edge(self.last[c], i)
            self.last[c] = i

    def makespan(self) -> float:
        return simulate(self.b.compile()).makespan


def _share(m: ModelProfile, strategy: str) -> set[str]:
    """The layers whose compute the model-parallel group splits."""
    if strategy in ("filter", "data+filter"):
        return {x.name for x in m.layers if x.kind in (WEIGHTED, CHANNELWISE)}
    if strategy == "channel":
        return {x.name for x in m.layers if x.kind == WEIGHTED}
    if strategy in ("spatial", "data+spatial"):
        return {x.name for x in m.layers if x.spatial}
    return {x.name for x in m.layers}  # data: every layer on its own samples


def _layered(m: ModelProfile, pr: Prediction, link: Link, B: int, contention: bool, slowdown: float,
             h: HostCosts = HostCosts()) -> float:
    s, p = pr.strategy, pr.devices
    p1 = pr.grid.get("data", 1) if "+" in s or s == "data" else 1
    p2 = p // p1
    if s == "data":
        p1, p2 = p, 1
    b = B / p1
    chains = p1  # one chain per model-parallel group (its p2 ranks run alike)
    if chains > MAX_GROUPS:
        return math.nan
    g = _Graph(chains, shared_net=contention, slowdown=slowdown)
    split = _share(m, s)
    blocks = _blocks(m)
    first_of = {w.name: i for i, (w, _) in enumerate(blocks)}
    last_of = {last.name: i for i, (_, last) in enumerate(blocks)}
    sp = [x for x in m.layers if x.spatial]
    nb = min(2, p2 - 1)

    def t(x: Layer, bw: bool) -> float:
        n = b / p2 if x.name in split and p2 > 1 else b
        return (x.bw_us * n + x.bw_call_us) if bw else (x.fw_us * n + x.fw_call_us)

    def host(c: int, name: str, us: float) -> None:  # host work around a collective (copies, Functions)
        if us > 0:
            g.compute(c, name, us, "OTHER")

    gathered = s in ("spatial", "data+spatial") and sp and len(sp) < len(m.layers)
    for x in m.layers:  # forward
        for c in range(chains):
            if s in ("spatial", "data+spatial") and x.halo_bytes() and nb > 0:
                host(c, f"halo host fw {x.name}", halo_host(h, b * x.x_bytes / p2, b * x.halo_bytes())[0])
                g.collective([c], f"halo fw {x.name}", link.exchange(nb, b * x.halo_bytes()), f"g{c}")
            if s == "channel" and x.kind == WEIGHTED:
                host(c, f"slice {x.name}", channel_host(h, b * x.x_bytes, b * x.y_bytes, p2, True)[0])
            g.compute(c, f"FW {x.name}", t(x, False))
            if s in ("filter", "data+filter") and x.name in last_of:
                g.collective([c], f"allgather {x.name}", link.allgather(p2, b * x.y_bytes), f"g{c}")
                host(c, f"cat {x.name}", gather_host(h, b * x.y_bytes, p2)[0])
            if s == "channel" and x.kind == WEIGHTED:
                g.collective([c], f"allreduce {x.name}", link.allreduce(p2, b * x.y_bytes), f"g{c}")
            if gathered and x is sp[-1]:
                g.collective([c], f"gather rows {x.name}", link.allgather(p2, b * x.y_bytes), f"g{c}")
                host(c, f"cat rows {x.name}", gather_host(h, b * x.y_bytes, p2)[0])
    for x in reversed(m.layers):  # backward
        for c in range(chains):
            if gathered and x is sp[-1]:
                host(c, f"slice rows {x.name}", gather_host(h, b * x.y_bytes, p2)[1])
            if s in ("filter", "data+filter") and x.name in last_of:
                host(c, f"slice {x.name}", gather_host(h, b * x.y_bytes, p2)[1])
            g.compute(c, f"BW {x.name}", t(x, True), "BW")
            if s in ("filter", "data+filter") and first_of.get(x.name, 0) > 0:
                g.collective([c], f"allreduce dx {x.name}", link.allreduce(p2, b * x.x_bytes), f"g{c}")
            if s == "channel" and first_of.get(x.name, 0) > 0:
                g.collective([c], f"allgather dx {x.name}", link.allgather(p2, b * x.x_bytes), f"g{c}")
                host(c, f"cat dx {x.name}", channel_host(h, b * x.x_bytes, b * x.y_bytes, p2, False)[1])
            if s in ("spatial", "data+spatial") and x.halo_bytes() and nb > 0:
                g.collective([c], f"halo bw {x.name}", link.exchange(nb, b * x.halo_bytes()), f"g{c}")
                host(c, f"halo host bw {x.name}", halo_host(h, b * x.x_bytes / p2, b * x.halo_bytes())[1])
    every = list(range(chains))
    W, w_sp = m.weight_bytes(), sum(x.w_bytes for x in sp)
    ge_host = {"spatial": grads_host(h, w_sp, False), "data+filter": grads_host(h, W / p2, True),
               "data+spatial": grads_host(h, w_sp, True) + grads_host(h, W - w_sp, True)}.get(s, 0.0)
    for c in range(chains):
        host(c, "gradient copies", ge_host)
    if s == "data":
        g.collective(every, "gradient allreduce", link.allreduce(p, W), "ge")
    elif s == "spatial":
        g.collective(every, "gradient allreduce", link.allreduce(p, w_sp), "ge")
    elif s == "data+filter":
        for f in range(p2):  # p2 disjoint all-reduces of 1/p2 of the weights
            g.collective(every, f"gradient allreduce {f}", link.allreduce(p1, W / p2), f"ge{f}")
    elif s == "data+spatial":
        g.collective(every, "gradient allreduce (spatial layers)", link.allreduce(p, w_sp), "ge")
        for f in range(p2):
            g.collective(every, f"gradient allreduce {f}", link.allreduce(p1, W - w_sp), f"ge{f}")
    wu = sum(x.wu_us for x in m.layers) / (p2 if s in ("filter", "channel", "data+filter") else 1)
    for c in range(chains):
        g.compute(c, "UPDATE", wu + m.overhead_us, "UPDATE")
    return g.makespan()


def _pipeline(m: ModelProfile, pr: Prediction, link: Link, B: int, slowdown: float) -> float:
    """GPipe as examples/parallel/strategies.gpipe_step runs it: per stage, every
    micro-batch forward (receive, compute, send), then every micro-batch backward
    (receive the gradient, compute, send it back). A transfer between stages i and i+1 is
    a rendezvous (gloo: ``dist.send`` waits for the matching ``dist.recv``): one op on the
    pair's link that starts when the sender has finished its previous op and the receiver
    reaches its receive (its previous op done), and that both stages' next ops wait for."""
    p, S = pr.devices, pr.grid["micro_batches"]
    groups = stages(m, p)
    if not groups:
        return math.nan
    b = B / S
    gb = GraphBuilder()
    dev = [gb.add_device(f"stage{i}", owner=f"stage{i}", is_comm=False) for i in range(p)]
    wire = [gb.add_device(f"link{i}-{i + 1}", owner="net", is_comm=True) for i in range(p - 1)]
    fw_t = [slowdown * sum(x.fw_us * b + x.fw_call_us for x in st) for st in groups]
    bw_t = [slowdown * sum(x.bw_us * b + x.bw_call_us for x in st) for st in groups]
    last: list[int | None] = [None] * p  # each stage's previous op: program order

    def op(i: int, name: str, dur: float, cat: str, prio: float) -> None:
        k = gb.add_op(name, dur=dur, cat=cat, device=dev[i], prio=prio)
        if last[i] is not None:
            gb.add_edge(last[i], k)
        last[i] = k

    def transfer(a: int, c: int, name: str, nbytes: float, prio: float) -> None:
        """Stage a sends to stage c (neighbours): both take part, in their program order."""
        k = gb.add_op(name, dur=link.p2p(nbytes), cat="COMM", device=wire[min(a, c)], prio=prio)
        for i in (a, c):
            if last[i] is not None:
                gb.add_edge(last[i], k)
            last[i] = k

    for j in range(S):  # stage i's forward of micro-batch j: receive (the previous stage's send), compute
        for i in range(p):
            op(i, f"FW s{i} m{j}", fw_t[i], "FW", float(j))
            if i < p - 1:
                transfer(i, i + 1, f"send s{i} m{j}", b * groups[i][-1].y_bytes, float(j))
    for j in range(S):
        for i in reversed(range(p)):
            op(i, f"BW s{i} m{j}", bw_t[i], "BW", float(S + j))
            if i:
                transfer(i, i - 1, f"send grad s{i} m{j}", b * groups[i - 1][-1].y_bytes, float(S + j))
    for i in range(p):
        op(i, f"UPDATE s{i}", slowdown * (sum(x.wu_us for x in groups[i]) + m.overhead_us), "UPDATE", float(2 * S))
    return simulate(gb.compile()).makespan


def simulate_prediction(m: ModelProfile, pr: Prediction, plat: Platform, opts: Options) -> float:
    """The replayed iteration time (µs) of prediction ``pr``'s strategy and grid (NaN: too large to simulate)."""
    link = link_of(plat, pr.devices).refilled(pr.refill_us)
    if pr.wires is not None:
        link = link.with_wires(Wires(table=pr.wires))
    f = plat.slowdown(pr.devices)
    if pr.strategy == "pipeline":
        return _pipeline(m, pr, link, opts.batch, f)
    return _layered(m, pr, link, opts.batch, opts.contention and plat.shares_links, f, plat.calibration.host)
