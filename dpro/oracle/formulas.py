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
from dataclasses import dataclass

from dpro.oracle.layers import CHANNELWISE, WEIGHTED, Layer, ModelProfile
from dpro.oracle.platform import Platform

STRATEGIES = ("data", "spatial", "filter", "channel", "pipeline", "data+filter", "data+spatial")
#: communication phases (ParaDL's GE-Allreduce, FB-Allgather/Allreduce, FB-Halo, FB-layer)
GE, LAYERWISE, HALO, P2P = "gradient_exchange", "layerwise_collectives", "halo_exchange", "pipeline_p2p"


@dataclass(frozen=True, slots=True)
class Link:
    """Collective costs over a platform with a contention penalty ``phi``."""

    alpha: float
    beta: float
    phi: float = 1.0

    def allreduce(self, n: int, m: float) -> float:
        return 2 * (n - 1) * (self.alpha + self.phi * self.beta * m / n) if n > 1 else 0.0

    def allgather(self, n: int, m: float) -> float:
        return (n - 1) * (self.alpha + self.phi * self.beta * m / n) if n > 1 else 0.0

    def p2p(self, m: float) -> float:
        return self.alpha + self.phi * self.beta * m

    def shared(self, phi: float) -> Link:
        return Link(self.alpha, self.beta, max(1.0, phi))


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

    @property
    def comm_us(self) -> float:
        return sum(self.communication_us.values())

    @property
    def iteration_us(self) -> float:
        """ParaDL's sum: communication is not overlapped (``--simulate`` overlaps it)."""
        return self.compute_us + self.comm_us


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
    return Prediction("data", p, comp, comm, _memory(m.layers, B / p, 1.0, gamma), {"data": p})


def _filter_like(m: ModelProfile, p: int, b: float, link: Link, channel: bool) -> tuple[float, float]:
    """Compute and layer-wise communication of filter (or channel) parallelism over p
    devices on b samples."""
    split = [lay for lay in m.layers if lay.kind == WEIGHTED or (lay.kind == CHANNELWISE and not channel)]
    rest = [lay for lay in m.layers if lay not in split]
    comp = _time(split, b / p) + _time(rest, b) + sum(lay.wu_us for lay in m.layers) / p + m.overhead_us
    comm = 0.0
    for i, (w, last) in enumerate(_blocks(m)):
        if channel:  # forward: all-reduce of the partial outputs; backward: all-gather of dL/dx
            comm += link.allreduce(p, b * w.y_bytes) + (link.allgather(p, b * w.x_bytes) if i else 0.0)
        else:  # forward: all-gather of the block's output; backward: all-reduce of dL/dx
            comm += link.allgather(p, b * last.y_bytes) + (link.allreduce(p, b * w.x_bytes) if i else 0.0)
    return comp, comm


def filter_(m: ModelProfile, p: int, B: int, link: Link, gamma: float = 1.0) -> Prediction:
    comp, comm = _filter_like(m, p, B, link, channel=False)
    return Prediction("filter", p, comp, {LAYERWISE: comm}, _memory(m.layers, B, 1 / p, gamma), {"filter": p})


def channel(m: ModelProfile, p: int, B: int, link: Link, gamma: float = 1.0) -> Prediction:
    comp, comm = _filter_like(m, p, B, link, channel=True)
    return Prediction("channel", p, comp, {LAYERWISE: comm}, _memory(m.layers, B, 1 / p, gamma), {"channel": p})


def _spatial_like(m: ModelProfile, p: int, b: float, link: Link) -> tuple[float, float, float, int, int]:
    """Compute, halo exchange and the row gather before the first non-spatial layer, the
    spatial and the replicated weight bytes; height split over p devices, b samples."""
    sp = [lay for lay in m.layers if lay.spatial]
    rest = [lay for lay in m.layers if not lay.spatial]
    comp = _time(sp, b / p) + _time(rest, b) + sum(lay.wu_us for lay in m.layers) + m.overhead_us
    nb = min(2, p - 1)  # neighbours of an inner device
    halo = sum(2 * nb * link.p2p(b * lay.halo_bytes()) for lay in sp if lay.halo_bytes())
    gather = link.allgather(p, b * sp[-1].y_bytes) if sp and rest and p > 1 else 0.0
    return comp, halo, gather, sum(lay.w_bytes for lay in sp), sum(lay.w_bytes for lay in rest)


def spatial(m: ModelProfile, p: int, B: int, link: Link, gamma: float = 1.0) -> Prediction:
    comp, halo, gather, w_sp, _ = _spatial_like(m, p, B, link)
    sp = [lay for lay in m.layers if lay.spatial]
    mem = _memory(sp, B / p, 1.0, gamma) + _memory([x for x in m.layers if not x.spatial], B, 1.0, gamma)
    comm = {GE: link.allreduce(p, w_sp), HALO: halo, LAYERWISE: gather}
    return Prediction("spatial", p, comp, comm, mem, {"spatial": p, "split": "height"})


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
    comm = 2 * (p + S - 2) * max((link.p2p(b * g[-1].y_bytes) for g in groups[:-1]), default=0.0)
    mem = max(_memory(g, B, 1.0, gamma) for g in groups)
    return Prediction("pipeline", p, comp, {P2P: comm}, mem, grid)


def data_filter(m: ModelProfile, p1: int, p2: int, B: int, link: Link, gamma: float = 1.0,
                contention: bool = True) -> Prediction:
    """p1 data groups of p2 filter-parallel devices; with ``contention`` the p1 groups'
    collectives (and the p2 gradient all-reduces) run at once and share the link (φ)."""
    f1, f2 = (p1, p2) if contention else (1, 1)
    comp, lw = _filter_like(m, p2, B / p1, link.shared(f1), channel=False)
    ge = link.shared(f2).allreduce(p1, m.weight_bytes() / p2)
    pr = Prediction("data+filter", p1 * p2, comp, {GE: ge, LAYERWISE: lw},
                    _memory(m.layers, B / p1, 1 / p2, gamma), {"data": p1, "filter": p2})
    pr.contention = float(max(f1, f2))
    return pr


def data_spatial(m: ModelProfile, p1: int, p2: int, B: int, link: Link, gamma: float = 1.0,
                 contention: bool = True) -> Prediction:
    """p1 data groups of p2 spatial devices: the spatial layers' gradients are summed over
    all p devices, the replicated ones' over the p1 groups (p2 at once: contention)."""
    f1, f2 = (p1, p2) if contention else (1, 1)
    comp, halo, gather, w_sp, w_rest = _spatial_like(m, p2, B / p1, link.shared(f1))
    ge = link.allreduce(p1 * p2, w_sp) + link.shared(f2).allreduce(p1, w_rest)
    sp = [lay for lay in m.layers if lay.spatial]
    mem = _memory(sp, B / (p1 * p2), 1.0, gamma) + _memory([x for x in m.layers if not x.spatial], B / p1, 1.0, gamma)
    pr = Prediction("data+spatial", p1 * p2, comp, {GE: ge, HALO: halo, LAYERWISE: gather}, mem,
                    {"data": p1, "spatial": p2, "split": "height"})
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
    compute is slowed by the platform's core sharing (:meth:`Platform.slowdown`)."""
    pr = _predict(m, strategy, p, platform, opts)
    pr.compute_us *= platform.slowdown(p)
    return pr


def _predict(m: ModelProfile, strategy: str, p: int, platform: Platform, opts: Options) -> Prediction:
    link = Link(platform.alpha_us, platform.beta_us_per_byte)
    B, g = opts.batch, opts.gamma
    lim = Limits.of(m, B)
    if strategy in ("data+filter", "data+spatial"):
        fn = data_filter if strategy == "data+filter" else data_spatial
        cands = [fn(m, p // k, k, B, link, g, opts.contention) for k in range(2, p) if p % k == 0]
        if not cands:
            pr = fn(m, p, 1, B, link, g, opts.contention)
            pr.grid = {"data": p, strategy.split("+")[1]: 1}
            _mark(pr, ("devices", f"{p} devices have no split into two groups of 2 or more"), opts)
            return pr
        for c in cands:
            _mark(c, lim.check(strategy, c.grid), opts)
        ok = [c for c in cands if c.feasible]
        return min(ok or cands, key=lambda c: c.iteration_us)
    fn = {"data": data, "spatial": spatial, "filter": filter_, "channel": channel}.get(strategy)
    pr = fn(m, p, B, link, g) if fn else pipeline(m, p, B, link, g, opts.micro)
    _mark(pr, lim.check(strategy, pr.grid), opts)
    return pr


def _mark(pr: Prediction, lim: tuple[str, str] | None, opts: Options) -> None:
    if lim is None and opts.memory_budget is not None and pr.memory_bytes > opts.memory_budget:
        lim = ("memory", f"{pr.memory_bytes} bytes per device > the budget of {opts.memory_budget}")
    if lim is not None:
        pr.feasible, (pr.limit, pr.limit_reason) = False, lim
    comm = pr.communication_us
    top = max(comm, key=lambda k: comm[k]) if comm else None
    pr.bottleneck = top if top is not None and comm[top] > pr.compute_us else "compute"
