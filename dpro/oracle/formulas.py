"""ParaDL's analytical model (Kahira et al., HPDC'21, Table 3) per iteration, as implemented
by examples/parallel/ (docs/oracle.md gives the derivation and where we depart from it).

Notation: B the global batch, p the devices, a layer's per-sample forward/backward time
``fw``/``bw`` (+ a per-call part), ``wu`` its weight update per iteration, ``|x|``/``|y|``
its input/output bytes per sample, ``|w|`` its weight bytes. Collectives on the ring
model with the link cost (α per step, β per byte) and the contention penalty φ (flows
sharing a link divide its bandwidth):

    AR(n, m) = 2(n-1)(α + φβ m/n)     AG(n, m) = (n-1)(α + φβ m/n)     P2P(m) = α + φβ m

where m is the whole buffer (the all-gather's result). Times µs, sizes bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from dpro.oracle.bucket import Message, key, steady_wires
from dpro.oracle.calibration import Cost, HostCosts, with_per_call
from dpro.oracle.layers import CHANNELWISE, WEIGHTED, Layer, ModelProfile
from dpro.oracle.platform import Platform

STRATEGIES = ("data", "spatial", "filter", "channel", "pipeline", "data+filter", "data+spatial")
#: communication phases (ParaDL's GE-Allreduce, FB-Allgather/Allreduce, FB-Halo, FB-layer)
GE, LAYERWISE, HALO, P2P = "gradient_exchange", "layerwise_collectives", "halo_exchange", "pipeline_p2p"


@dataclass(eq=False)
class Wires:
    """A link's token bucket over a step (dpro/oracle/bucket.py): ``record`` collects the
    messages a prediction charges, in the step's order (each costed from a full bucket);
    ``table`` then gives each message its wire time in the step's steady state."""

    record: list[Message] | None = None
    table: dict[tuple[Cost, int], float] | None = None


@dataclass(frozen=True, slots=True)
class Link:
    """Collective costs over a platform with a contention penalty ``phi``: per call α and
    the wire time of the bytes one rank sends (:class:`Cost`; on a link with a token
    bucket, its burst as refilled in the ``refill_us`` between two collectives at the
    capped rate); ``gather`` and ``exch``: the all-gather's and the halo exchange's costs
    when calibrated apart (dpro/oracle/calibration.py), else the all-reduce's; ``send``:
    a pipeline P2P's (the per-call α of back-to-back send/recv pairs), else the all-reduce's;
    ``wires``: the token bucket followed over the step's messages (:class:`Wires`), which
    overrides ``refill_us`` for the messages it holds."""

    ar: Cost
    phi: float = 1.0
    gather: Cost | None = None
    exch: Cost | None = None
    refill_us: float = math.inf
    send: Cost | None = None
    wires: Wires | None = None

    def _t(self, c: Cost, calls: float, sent: float, times: int = 1, through: int | None = None) -> float:
        """``times`` calls of ``calls`` per-call α and ``sent`` bytes on the wire (with
        ``wires``: recorded, or costed as the step's steady state has it; ``through``: how
        many of them pass one rank's link per step, default ``times``)."""
        w = self.wires
        if w is not None and w.record is not None:
            w.record.append(Message(c, calls, sent, times, times if through is None else through))
            wire = c.wire(sent)
        elif w is not None and w.table is not None and c.burst > 0:
            # a message the step's record does not hold (a pipeline's smaller transfers, on
            # links of their own): alone on its link, once per gap
            got = w.table.get(key(c, sent))
            wire = got if got is not None else steady_wires([Message(c, calls, sent)], self.refill_us)[key(c, sent)]
        else:
            wire = c.wire(sent, self.refill_us)
        return times * (calls * c.alpha + self.phi * wire)

    def allreduce(self, n: int, m: float) -> float:
        return self._t(self.ar, 2 * (n - 1), 2 * (n - 1) * m / n) if n > 1 else 0.0

    def allgather(self, n: int, m: float) -> float:
        return self._t(self.gather or self.ar, n - 1, (n - 1) * m / n) if n > 1 else 0.0

    def p2p(self, m: float, times: int = 1, through: int | None = None) -> float:
        """``times`` blocking sends to one peer (ParaDL's P2P): the calibrated back-to-back
        send's cost when there is one, else a ring step's (``through``: as :meth:`_t`)."""
        return self._t(self.send or self.ar, 1, m, times, through)

    def exchange(self, nb: int, m: float) -> float:
        """One halo exchange of m bytes with each of ``nb`` neighbours: measured as one
        (sends and receives posted together, nb·m bytes through the rank's link) when
        calibrated, else ``nb`` P2P in turn."""
        if nb <= 0:
            return 0.0
        if self.exch:
            return self._t(self.exch, 1, nb * m)
        return nb * self.p2p(m)

    @property
    def bursty(self) -> bool:
        """A token bucket on any of the costs (its refill depends on the gaps between collectives)."""
        return any(c is not None and c.burst > 0 for c in (self.ar, self.gather, self.exch, self.send))

    def shared(self, phi: float) -> Link:
        return replace(self, phi=max(1.0, phi))

    def refilled(self, gap_us: float) -> Link:
        return replace(self, refill_us=gap_us)

    def with_wires(self, wires: Wires | None) -> Link:
        return replace(self, wires=wires)


def link_of(platform: Platform, devices: int) -> Link:
    """The link of a job of ``devices`` processes: the calibration measured at that
    process count (dpro/oracle/calibration.py) when the platform has one, else α, β; the
    halo exchange and the pipeline send with the per-call α of back-to-back calls where
    the calibration measured them (:func:`calibration.with_per_call`)."""
    flat = Cost(platform.alpha_us, platform.beta_us_per_byte)
    got = platform.calibration.link(devices)
    if not got:
        return Link(flat)
    got = with_per_call(got, platform.calibration.per_call(devices))
    return Link(got.get("allreduce") or flat, 1.0, got.get("allgather"), got.get("exchange"), send=got.get("send"))


# ---------------------------------------------------------------- host work around collectives
# What examples/parallel/strategies.py does on the host besides the layers and the wire:
# (forward µs, backward µs) per site, from the calibrated host costs (all zero without).
def gather_host(h: HostCosts, y: float, p: int) -> tuple[float, float]:
    """An all-gather along channels/rows (_GatherChannels, _GatherRows): a Function,
    torch.cat of the whole y bytes; backward: this rank's slice made contiguous."""
    return h.function_us + h.cat.us(y), h.slice.us(y / p)


def channel_host(h: HostCosts, x: float, y: float, p: int, first: bool) -> tuple[float, float]:
    """A channel-parallel layer: _SliceChannels (a Function, a slice of x/p bytes; backward,
    but for the first layer: torch.cat of the gathered x) and _AllReduce (a Function, a
    clone of y)."""
    return 2 * h.function_us + h.slice.us(x / p) + h.clone.us(y), (0.0 if first else h.cat.us(x))


def halo_host(h: HostCosts, xl: float, hb: float) -> tuple[float, float]:
    """_Halo before a conv: a Function, two zero halos, torch.cat of the local xl bytes and
    halos; backward: a clone of the local gradient, two zero halos and two halo additions."""
    return (h.function_us + 2 * h.zeros.us(hb) + h.cat.us(xl + 2 * hb),
            h.clone.us(xl) + 2 * h.zeros.us(hb) + 2 * h.clone.us(hb))


def grads_host(h: HostCosts, w: float, scaled: bool) -> float:
    """allreduce_grads: the gradients concatenated, copied back (and scaled)."""
    return h.cat.us(w) + h.clone.us(w) * (2 if scaled else 1) if w else 0.0


@dataclass
class Prediction:
    """One strategy at one device count."""

    strategy: str
    devices: int
    compute_us: float
    communication_us: dict[str, float]
    memory_bytes: int
    #: the device grid (data x model groups, stages) and, for pipeline, micro-batches and cuts
    grid: dict
    feasible: bool = True
    #: why not ("memory", "batch", "filters", "channels", "height", "layers"), with a sentence
    limit: str | None = None
    limit_reason: str | None = None
    contention: float = 1.0
    rank: int | None = None
    bottleneck: str = ""
    #: host work around each communication phase (copies, autograd Functions), by phase
    host_us: dict[str, float] = field(default_factory=dict)
    #: collective calls a rank takes part in per iteration (the gaps between them refill a token bucket)
    calls: int = 0
    #: the compute between two of them (µs) that refilled the link's token bucket (inf: none, or full)
    refill_us: float = math.inf
    #: the wire time (µs) of each message in the token bucket's steady state over the step (None: no bucket)
    wires: dict[tuple[Cost, int], float] | None = None

    @property
    def comm_us(self) -> float:
        return sum(self.communication_us.values())

    @property
    def busy_us(self) -> float:
        """Compute and the host work around the collectives."""
        return self.compute_us + sum(self.host_us.values())

    @property
    def iteration_us(self) -> float:
        """ParaDL's sum: communication is not overlapped (``--simulate`` overlaps it)."""
        return self.busy_us + self.comm_us


def _time(layers: list[Layer], samples: float, calls: int = 1) -> float:
    return sum((lay.fw_us + lay.bw_us) * samples + (lay.fw_call_us + lay.bw_call_us) * calls for lay in layers)


def _memory(layers: list[Layer], act_samples: float, w_share: float, gamma: float) -> int:
    """ParaDL's per-device memory: activations and their gradients, weights and gradients."""
    return int(gamma * sum(2 * act_samples * (lay.x_bytes + lay.y_bytes) + 2 * lay.w_bytes * w_share for lay in layers))


def _blocks(m: ModelProfile) -> list[tuple[Layer, Layer]]:
    """(weighted layer, last layer of its block): filter parallelism gathers a block's
    output after the per-channel layers that follow the weighted one."""
    out: list[tuple[Layer, Layer]] = []
    open_ = False
    for lay in m.layers:
        if lay.kind == WEIGHTED:
            out.append((lay, lay))
            open_ = True
        elif lay.kind == CHANNELWISE and open_:
            out[-1] = (out[-1][0], lay)
        else:
            open_ = False
    return out


def data(m: ModelProfile, p: int, B: int, link: Link, gamma: float = 1.0) -> Prediction:
    comp = _time(m.layers, B / p) + sum(lay.wu_us for lay in m.layers) + m.overhead_us
    comm = {GE: link.allreduce(p, m.weight_bytes())}
    return Prediction("data", p, comp, comm, _memory(m.layers, B / p, 1.0, gamma), {"data": p}, calls=int(p > 1))


def _filter_like(m: ModelProfile, p: int, b: float, link: Link, channel: bool,
                 host: HostCosts = HostCosts()) -> tuple[float, float, float, int]:
    """Compute, layer-wise communication, the host work around it and the collective
    calls of filter (or channel) parallelism over p devices on b samples."""
    split = [lay for lay in m.layers if lay.kind == WEIGHTED or (lay.kind == CHANNELWISE and not channel)]
    rest = [lay for lay in m.layers if lay not in split]
    comp = _time(split, b / p) + _time(rest, b) + sum(lay.wu_us for lay in m.layers) / p + m.overhead_us
    comm = hw = 0.0
    blocks = list(enumerate(_blocks(m)))
    for i, (w, last) in blocks:  # forward, in the step's order (the token bucket follows it)
        if channel:  # forward: all-reduce of the partial outputs; backward: all-gather of dL/dx
            comm += link.allreduce(p, b * w.y_bytes)
            hw += sum(channel_host(host, b * w.x_bytes, b * w.y_bytes, p, i == 0)) if p > 1 else 0.0
        else:  # forward: all-gather of the block's output; backward: all-reduce of dL/dx
            comm += link.allgather(p, b * last.y_bytes)
            hw += sum(gather_host(host, b * last.y_bytes, p)) if p > 1 else 0.0
    for i, (w, _) in reversed(blocks[1:]):  # backward, last block first
        comm += link.allgather(p, b * w.x_bytes) if channel else link.allreduce(p, b * w.x_bytes)
    nblocks = len(_blocks(m))
    return comp, comm, hw, (2 * nblocks - 1 if nblocks and p > 1 else 0)


def filter_(m: ModelProfile, p: int, B: int, link: Link, gamma: float = 1.0, host: HostCosts = HostCosts()) -> Prediction:
    comp, comm, hw, calls = _filter_like(m, p, B, link, False, host)
    return Prediction("filter", p, comp, {LAYERWISE: comm}, _memory(m.layers, B, 1 / p, gamma), {"filter": p},
                      host_us=_nonzero({LAYERWISE: hw}), calls=calls)


def channel(m: ModelProfile, p: int, B: int, link: Link, gamma: float = 1.0, host: HostCosts = HostCosts()) -> Prediction:
    comp, comm, hw, calls = _filter_like(m, p, B, link, True, host)
    return Prediction("channel", p, comp, {LAYERWISE: comm}, _memory(m.layers, B, 1 / p, gamma), {"channel": p},
                      host_us=_nonzero({LAYERWISE: hw}), calls=calls)


def _nonzero(d: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in d.items() if v}


def _spatial_like(m: ModelProfile, p: int, b: float, link: Link,
                  host: HostCosts = HostCosts()) -> tuple[float, float, float, int, int, dict[str, float], int]:
    """Compute, halo exchange and the row gather before the first non-spatial layer, the
    spatial and the replicated weight bytes, the host work around the halo exchange and
    the gather, their collective calls; height split over p devices, b samples."""
    sp = [lay for lay in m.layers if lay.spatial]
    rest = [lay for lay in m.layers if not lay.spatial]
    comp = _time(sp, b / p) + _time(rest, b) + sum(lay.wu_us for lay in m.layers) + m.overhead_us
    nb = min(2, p - 1)  # neighbours of an inner device
    convs = [lay for lay in sp if lay.halo_bytes()] if p > 1 else []
    # in a step's order (the token bucket follows it): forward halos, the row gather, backward halos
    halo = sum(link.exchange(nb, b * lay.halo_bytes()) for lay in convs)
    gathered = bool(sp and rest and p > 1)
    gather = link.allgather(p, b * sp[-1].y_bytes) if gathered else 0.0
    halo += sum(link.exchange(nb, b * lay.halo_bytes()) for lay in reversed(convs))
    hw = {HALO: sum(sum(halo_host(host, b * lay.x_bytes / p, b * lay.halo_bytes())) for lay in convs),
          LAYERWISE: sum(gather_host(host, b * sp[-1].y_bytes, p)) if gathered else 0.0}
    calls = 2 * len(convs) + int(gathered)
    return comp, halo, gather, sum(lay.w_bytes for lay in sp), sum(lay.w_bytes for lay in rest), hw, calls


def spatial(m: ModelProfile, p: int, B: int, link: Link, gamma: float = 1.0, host: HostCosts = HostCosts()) -> Prediction:
    comp, halo, gather, w_sp, _, hw, calls = _spatial_like(m, p, B, link, host)
    sp = [lay for lay in m.layers if lay.spatial]
    mem = _memory(sp, B / p, 1.0, gamma) + _memory([x for x in m.layers if not x.spatial], B, 1.0, gamma)
    comm = {GE: link.allreduce(p, w_sp), HALO: halo, LAYERWISE: gather}
    hw[GE] = grads_host(host, w_sp, scaled=False)
    return Prediction("spatial", p, comp, comm, mem, {"spatial": p, "split": "height"}, host_us=_nonzero(hw),
                      calls=calls + int(bool(w_sp) and p > 1))


def stages(m: ModelProfile, p: int) -> list[list[Layer]]:
    """Contiguous stages, each starting at a weighted layer, minimising the slowest stage
    (forward + backward per sample); layers before the first weighted one join stage 0."""
    from itertools import combinations

    layers = m.layers
    starts = [i for i, lay in enumerate(layers) if lay.kind == WEIGHTED][1:]
    if p - 1 > len(starts):
        return []
    cost = [lay.fw_us + lay.bw_us for lay in layers]
    best: tuple[float, tuple[int, ...]] = (math.inf, ())
    for cuts in combinations(starts, p - 1):
        b = [0, *cuts, len(layers)]
        worst = max(sum(cost[b[i]:b[i + 1]]) for i in range(p))
        best = min(best, (worst, cuts))
    b = [0, *best[1], len(layers)]
    return [layers[b[i]:b[i + 1]] for i in range(p)]


def pipeline(m: ModelProfile, p: int, B: int, link: Link, gamma: float = 1.0, micro: int | None = None) -> Prediction:
    """GPipe: S micro-batches of B/S samples; (p + S - 1) stages of the slowest group."""
    groups = stages(m, p)
    S = micro or max(1, min(B, 4 * p))
    grid = {"stages": p, "micro_batches": S, "cuts": [g[0].name for g in groups[1:]]}
    if not groups:  # more stages than layers with weights: Limits marks it
        return Prediction("pipeline", p, math.inf, {P2P: math.inf}, 0, grid)
    b = B / S
    fw = max(sum(lay.fw_us * b + lay.fw_call_us for lay in g) for g in groups)
    bw = max(sum(lay.bw_us * b + lay.bw_call_us for lay in g) for g in groups)
    wu = max(sum(lay.wu_us for lay in g) for g in groups)
    comp = (p + S - 1) * (fw + bw) + wu + m.overhead_us
    # the largest activation crosses one link S times forward and S times backward; an inner
    # stage's link carries its sends both ways (2S per step), an end stage's S
    top = max((b * g[-1].y_bytes for g in groups[:-1]), default=0.0)
    comm = link.p2p(top, 2 * (p + S - 2), 2 * S if p > 2 else S) if p > 1 else 0.0
    mem = max(_memory(g, B, 1.0, gamma) for g in groups)
    # a stage sends after each micro-batch's forward or backward: one call per pass
    return Prediction("pipeline", p, comp, {P2P: comm}, mem, grid, calls=2 * (p + S - 1) if p > 1 else 0)


def data_filter(m: ModelProfile, p1: int, p2: int, B: int, link: Link, gamma: float = 1.0,
                contention: bool = True, host: HostCosts = HostCosts()) -> Prediction:
    """p1 data groups of p2 filter-parallel devices; with ``contention`` the p1 groups'
    collectives (and the p2 gradient all-reduces) run at once and share the link (φ)."""
    f1, f2 = (p1, p2) if contention else (1, 1)
    comp, lw, hw, calls = _filter_like(m, p2, B / p1, link.shared(f1), False, host)
    ge = link.shared(f2).allreduce(p1, m.weight_bytes() / p2)
    pr = Prediction("data+filter", p1 * p2, comp, {GE: ge, LAYERWISE: lw},
                    _memory(m.layers, B / p1, 1 / p2, gamma), {"data": p1, "filter": p2},
                    host_us=_nonzero({LAYERWISE: hw, GE: grads_host(host, m.weight_bytes() / p2, scaled=True)}),
                    calls=calls + 1)
    pr.contention = float(max(f1, f2))
    return pr


def data_spatial(m: ModelProfile, p1: int, p2: int, B: int, link: Link, gamma: float = 1.0,
                 contention: bool = True, host: HostCosts = HostCosts()) -> Prediction:
    """p1 data groups of p2 spatial devices: the spatial layers' gradients are summed over
    all p devices, the replicated ones' over the p1 groups (p2 at once: contention)."""
    f1, f2 = (p1, p2) if contention else (1, 1)
    comp, halo, gather, w_sp, w_rest, hw, calls = _spatial_like(m, p2, B / p1, link.shared(f1), host)
    ge = link.allreduce(p1 * p2, w_sp) + link.shared(f2).allreduce(p1, w_rest)
    hw[GE] = grads_host(host, w_sp, scaled=True) + grads_host(host, w_rest, scaled=True)
    sp = [lay for lay in m.layers if lay.spatial]
    mem = _memory(sp, B / (p1 * p2), 1.0, gamma) + _memory([x for x in m.layers if not x.spatial], B / p1, 1.0, gamma)
    pr = Prediction("data+spatial", p1 * p2, comp, {GE: ge, HALO: halo, LAYERWISE: gather}, mem,
                    {"data": p1, "spatial": p2, "split": "height"}, host_us=_nonzero(hw),
                    calls=calls + int(bool(w_sp)) + int(bool(w_rest)))
    pr.contention = float(max(f1, f2))
    return pr


@dataclass(frozen=True)
class Limits:
    """The largest device count of each basic strategy (Table 3's last column)."""

    batch: int
    filters: int
    channels: int
    height: int
    layers: int

    @classmethod
    def of(cls, m: ModelProfile, B: int) -> Limits:
        w = m.weighted
        sp = [lay for lay in m.layers if lay.spatial]
        return cls(batch=B, filters=min((lay.filters for lay in w), default=1),
                   channels=min((lay.channels for lay in w), default=1),
                   height=min((lay.height for lay in sp), default=1), layers=len(w))

    def check(self, strategy: str, grid: dict) -> tuple[str, str] | None:
        """(limit, reason) when the grid exceeds a limit, else None."""
        rules = {"data": ("batch", self.batch, "samples in the batch"),
                 "filter": ("filters", self.filters, "filters of the narrowest layer"),
                 "channel": ("channels", self.channels, "input channels of the narrowest layer"),
                 "spatial": ("height", self.height, "rows of the smallest feature map"),
                 "stages": ("layers", self.layers, "layers with weights")}
        for k, n in grid.items():
            if k in rules and isinstance(n, int):
                name, cap, what = rules[k]
                if n > cap:
                    return name, f"{n} devices ({k}) > {cap} {what}"
        return None


@dataclass
class Options:
    batch: int
    memory_budget: int | None = None
    gamma: float = 1.0
    micro: int | None = None
    contention: bool = True


def predict(m: ModelProfile, strategy: str, p: int, platform: Platform, opts: Options) -> Prediction:
    """The best grid of ``strategy`` on ``p`` devices (hybrids: every p1 x p2 = p with both > 1);
    compute is slowed by the platform's core sharing (:meth:`Platform.slowdown`). On a link
    with a token bucket, each grid is costed with the bucket followed over its step
    (:func:`_bucketed`)."""
    link, f = link_of(platform, p), platform.slowdown(p)
    pr = _predict(m, strategy, p, platform, opts, link, f)
    pr.compute_us *= f
    pr.host_us = {k: v * f for k, v in pr.host_us.items()}
    return pr


def _bucketed(run: Callable[[Link], Prediction], link: Link, slowdown: float) -> Prediction:
    """``run`` on ``link``; on a link with a token bucket, three passes: one from a full
    bucket (the busy time), one recording the step's messages in order, one costing each
    message as the bucket's steady state over the step has it (dpro/oracle/bucket.py): the
    busy time (× core sharing) spread evenly before the messages that pass one rank's link,
    each also refilling during its own per-call α. ``refill_us`` and ``wires`` of the
    prediction say so (``--simulate`` charges the same)."""
    pr = run(link)
    if not (link.bursty and pr.calls and math.isfinite(pr.busy_us)):
        return pr
    rec = Wires(record=[])
    run(link.with_wires(rec))
    n = sum(msg.through for msg in rec.record or [])
    if not n:
        return pr
    gap = pr.busy_us * slowdown / n
    table = steady_wires(rec.record or [], gap)
    pr = run(link.refilled(gap).with_wires(Wires(table=table)))
    pr.refill_us, pr.wires = gap, table
    return pr


def _predict(m: ModelProfile, strategy: str, p: int, platform: Platform, opts: Options, link: Link,
             slowdown: float = 1.0) -> Prediction:
    host = platform.calibration.host
    contention = opts.contention and platform.shares_links
    B, g = opts.batch, opts.gamma
    lim = Limits.of(m, B)
    if strategy in ("data+filter", "data+spatial"):
        fn = data_filter if strategy == "data+filter" else data_spatial
        cands = [_bucketed(lambda lk, k=k: fn(m, p // k, k, B, lk, g, contention, host), link, slowdown)
                 for k in range(2, p) if p % k == 0]
        if not cands:
            pr = fn(m, p, 1, B, link, g, contention, host)
            pr.grid = {"data": p, strategy.split("+")[1]: 1}
            _mark(pr, ("devices", f"{p} devices have no split into two groups of 2 or more"), opts)
            return pr
        for c in cands:
            _mark(c, lim.check(strategy, c.grid), opts)
        ok = [c for c in cands if c.feasible]
        return min(ok or cands, key=lambda c: c.iteration_us)
    if strategy == "data":
        pr = _bucketed(lambda lk: data(m, p, B, lk, g), link, slowdown)
    elif strategy in ("spatial", "filter", "channel"):
        fn1 = {"spatial": spatial, "filter": filter_, "channel": channel}[strategy]
        pr = _bucketed(lambda lk: fn1(m, p, B, lk, g, host), link, slowdown)
    else:
        pr = _bucketed(lambda lk: pipeline(m, p, B, lk, g, opts.micro), link, slowdown)
    _mark(pr, lim.check(strategy, pr.grid), opts)
    return pr


def _mark(pr: Prediction, lim: tuple[str, str] | None, opts: Options) -> None:
    if lim is None and opts.memory_budget is not None and pr.memory_bytes > opts.memory_budget:
        lim = ("memory", f"{pr.memory_bytes} bytes per device > the budget of {opts.memory_budget}")
    if lim is not None:
        pr.feasible, (pr.limit, pr.limit_reason) = False, lim
    comm = pr.communication_us
    top = max(comm, key=lambda k: comm[k]) if comm else None
    pr.bottleneck = top if top is not None and comm[top] > pr.busy_us else "compute"
