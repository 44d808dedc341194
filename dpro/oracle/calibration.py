"""The oracle's calibration: collective and host-op costs fitted from microbenchmark samples.

A platform file may hold an ``"oracle"`` section (``dpro calibrate --oracle`` writes it from
dpro/oracle/measure.py's samples; never from the runs it is checked against)::

    "oracle": {"links": {"2": {"allreduce": {"alpha_us", "beta_us_per_byte"
                                             [, "burst_bytes", "burst_beta_us_per_byte"]},
                               "allgather": {...}, "exchange": {...}}, "4": {...}},
               "host": {"cat": {"alpha_us", "beta_us_per_byte"}, "slice": {...}, "clone": {...},
                        "zeros": {...}, "function_us": 41.0},
               "topology": {"links": "shared" | "per-rank", "concurrent_ratio": 1.9, "source": "measured"},
               "calls": {"2": {"p2p": {"alpha_us", "beta_us_per_byte", "alpha_rounds_us": [lo, median, hi],
                                       "rounds": 9}, "exchange": {...}, "allreduce": {...}}, "4": {...}}}

``links[n]``: measured in a job of n processes. A collective's time is its per-call α
times its calls (ring steps) plus the wire time of the bytes one rank sends, S:
``AR(k, m) = 2(k-1)α + W(2(k-1)m/k)``, ``AG(k, m) = (k-1)α + W((k-1)m/k)`` (m the whole
result), a halo exchange with nb neighbours ``α + W(nb·m)`` (isend/irecv to each, then
wait; one link carries them). ``W(S) = βS`` on a plain link; on a link with a token
bucket (a ``tc tbf`` cap, a cloud NIC's burst credit) the first ``burst_bytes`` go at
``burst_beta`` and the rest at β (:meth:`Cost.wire`, from a full bucket; over a step the
bucket refills at the capped rate 1/β while no byte moves and keeps what a message leaves:
dpro/oracle/bucket.py). ``host``: per call + per byte of the copies examples/parallel/
makes around its collectives, and one autograd.Function's forward + backward (µs).
``topology``: whether two collectives of disjoint ranks share a link (loopback, one NIC
per host: the contention penalty applies) or every rank has its own (per-rank capped
links: it does not). Every fit is non-negative least squares over all samples, each
size's extremes trimmed (:func:`_fit`).

``calls[n]``: the per-call cost of **back-to-back** calls at n processes (measure.py's
``stream_*`` samples: no barrier or idle between calls, as a step's halo exchanges and
pipeline sends follow each other): ``p2p`` (a blocking send/recv pair), ``exchange``,
``allreduce``; α: the median over the rounds of a round's mean per-call time less the
wire time of the isolated calls' fit (:func:`fit_stream`), with the rounds' spread. The formulas
charge a halo exchange and a pipeline send this α (:meth:`Calibration.per_call`) and the
wire time W of the isolated calls' fit (which holds the token bucket and its refill).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

import numpy as np

from dpro.oracle.bucket import stream_alpha

COLLECTIVES = ("allreduce", "allgather", "exchange")
HOST_OPS = ("cat", "slice", "clone", "zeros")
TOPOLOGIES = ("shared", "per-rank")


@dataclass(frozen=True, slots=True)
class Cost:
    """``alpha`` µs per call (or ring step), ``beta`` µs per byte; on a link with a token
    bucket, the first ``burst`` bytes a rank sends go at ``beta_burst`` µs per byte."""

    alpha: float = 0.0
    beta: float = 0.0
    burst: float = 0.0
    beta_burst: float = 0.0

    def wire(self, sent: float, refill_us: float = math.inf) -> float:
        """µs to send ``sent`` bytes: as many as the bucket holds (its burst, or what
        refills at the capped rate 1/β in the ``refill_us`` since the last collective
        emptied it) at ``beta_burst``, the rest at β."""
        fast = 0.0
        if self.burst > 0 and sent > 0:
            fast = min(sent, self.burst, refill_us / self.beta if self.beta > 0 else math.inf)
        return self.beta_burst * fast + self.beta * (sent - fast)

    def us(self, nbytes: float) -> float:
        return self.alpha + self.wire(nbytes)

    def to_json(self) -> dict:
        d = {"alpha_us": self.alpha, "beta_us_per_byte": self.beta}
        if self.burst > 0:
            d |= {"burst_bytes": self.burst, "burst_beta_us_per_byte": self.beta_burst}
        return d


@dataclass(frozen=True)
class HostCosts:
    """The host work examples/parallel/ does around its collectives (one core): copies
    (``cat``, ``slice`` made contiguous, ``clone``, ``zeros_like``) per call + per byte
    and one autograd.Function (forward + backward). All zero: not calibrated."""

    cat: Cost = Cost()
    slice: Cost = Cost()
    clone: Cost = Cost()
    zeros: Cost = Cost()
    function_us: float = 0.0

    def to_json(self) -> dict:
        return {k: getattr(self, k).to_json() for k in HOST_OPS} | {"function_us": self.function_us}


@dataclass(frozen=True, slots=True)
class PerCall:
    """Back-to-back calls of one kind: ``cost`` (α per call, β per byte sent) fitted to the
    median over ``rounds`` rounds; ``alpha_rounds``: (lowest, median, highest) α of the
    rounds fitted one by one (the spread)."""

    cost: Cost
    alpha_rounds: tuple[float, float, float] = (0.0, 0.0, 0.0)
    rounds: int = 0

    def to_json(self) -> dict:
        return self.cost.to_json() | {"alpha_rounds_us": list(self.alpha_rounds), "rounds": self.rounds}


@dataclass
class Calibration:
    """Per world size, the collectives' costs; the host costs; whether collectives of
    disjoint ranks share a link (``topology``: "shared", the default, or "per-rank")."""

    links: dict[int, dict[str, Cost]] = field(default_factory=dict)
    host: HostCosts = HostCosts()
    topology: str = "shared"
    #: measured: a pair's all-reduce with another pair's at once over it alone (None: declared)
    concurrent_ratio: float | None = None
    #: per world size, back-to-back calls' costs ("p2p", "exchange", "allreduce"; empty: not measured)
    calls: dict[int, dict[str, PerCall]] = field(default_factory=dict)

    def per_call(self, world: int) -> dict[str, PerCall]:
        """The back-to-back costs at ``world`` processes (the same choice of world as :meth:`link`)."""
        if not self.calls:
            return {}
        below = [n for n in self.calls if n <= world]
        return self.calls[max(below) if below else min(self.calls)]

    def link(self, world: int) -> dict[str, Cost] | None:
        """The costs measured at ``world`` processes, else at the largest smaller world,
        else the smallest (None: no collective calibrated)."""
        if not self.links:
            return None
        below = [n for n in self.links if n <= world]
        return self.links[max(below) if below else min(self.links)]

    def to_json(self) -> dict:
        return {"links": {str(n): {k: c.to_json() for k, c in d.items()} for n, d in sorted(self.links.items())},
                "host": self.host.to_json(),
                "topology": {"links": self.topology, "concurrent_ratio": self.concurrent_ratio,
                             "source": "declared" if self.concurrent_ratio is None else "measured"}} | (
            {"calls": {str(n): {k: c.to_json() for k, c in d.items()} for n, d in sorted(self.calls.items())}}
            if self.calls else {})


#: a pair's all-reduce next to another pair's this many times slower than alone: they share a link
SHARED_RATIO = 1.3
#: share of the samples dropped at each end of a size's samples before averaging them
TRIM = 0.1
#: a knee is a token bucket when the rate beyond it is this many times slower than below it ...
BURST_SLOWDOWN = 3.0
#: ... and it takes this share of the squared error of the plain fit away
BURST_GAIN = 0.3


def _trim(v: list[float]) -> list[float]:
    """``v`` sorted, without the ``TRIM`` share of its values at each end."""
    v = sorted(v)
    k = int(len(v) * TRIM)
    return v[k:len(v) - k] if len(v) > 2 * k else v


def _trimmed(rows: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    by: dict[float, list[float]] = {}
    for b, t in rows:
        if t == t:  # NaN: no rank took part
            by.setdefault(float(b), []).append(float(t))
    xs, ys = [], []
    for b, v in by.items():
        kept = _trim(v)
        xs += [b] * len(kept)
        ys += kept
    return np.array(xs, dtype=float), np.array(ys, dtype=float)


def _nnls(A: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """min |A x - y|² over x >= 0: (x, squared error)."""
    from scipy.optimize import nnls

    x, r = nnls(A, y)
    return x, float(r) ** 2


def _fit(rows: list[list[float]], steps: float, per: float, burst: bool = False) -> Cost:
    """``µs = steps * α + W(S)``, S = ``steps * bytes / per`` the bytes one rank sends,
    fitted by least squares (every coefficient >= 0) to every sample but the ``TRIM`` share
    at each end of each size's samples: the mean, because a step of many collectives adds
    up their mean (a call on a shared host is bimodal: a fast path and a wait of ~3 ms for
    the CPU, so a median jumps between the two from one run to the next), pooled over the
    sizes (the wait is the same for every size: α), and trimmed of the rare extremes.

    ``W(S) = βS``; with ``burst``, also the token bucket ``W(S) = β_b min(S, K) + β (S - K)⁺``
    with the knee K at each measured S in turn (at least two sizes above it). A knee is
    kept when it is a bucket, not a bend of a fast link: the rate beyond it is
    ``BURST_SLOWDOWN`` times the rate below, the burst saves more than one call's α
    (K(β - β_b) > steps·α), and it takes ``BURST_GAIN`` of the plain fit's error away,
    the error relative to each size's mean (the large sizes' spread would hide the small
    ones' in absolute terms)."""
    xs, ys = _trimmed(rows)
    if not len(xs):
        return Cost()
    S = steps * xs / per
    ones = np.full_like(S, steps)
    (a, b), _ = _nnls(np.column_stack([ones, S]), ys)
    plain = Cost(float(a), float(b))
    sizes = np.unique(S)
    if not burst or len(sizes) < 5:
        return plain
    mean = {v: ys[S == v].mean() for v in sizes}
    w = np.array([1 / mean[v] if mean[v] > 0 else 0.0 for v in S])

    def rel(c: Cost) -> float:
        pred = steps * c.alpha + np.array([c.wire(v) for v in S])
        return float((((pred - ys) * w) ** 2).sum())

    best: tuple[float, Cost] = (rel(plain), plain)
    for K in sizes[1:-2]:
        A = np.column_stack([ones, np.minimum(S, K), np.maximum(S - K, 0.0)])
        (a, bb, b), _ = _nnls(A, ys)
        c = Cost(float(a), float(b), float(K), float(bb))
        if b >= BURST_SLOWDOWN * bb and K * (b - bb) > steps * a and (e := rel(c)) < best[0]:
            best = (e, c)
    return best[1] if best[0] <= (1 - BURST_GAIN) * rel(plain) else plain


def shape(kind: str, world: int) -> tuple[float, float]:
    """(calls, bytes of the sample per byte a rank sends) of ``kind`` at ``world`` processes."""
    nb = min(2, world - 1)
    return {"allreduce": (2 * (world - 1), world / (2 * (world - 1))), "allgather": (world - 1, world / (world - 1)),
            "exchange": (1, 1 / nb)}[kind]


def fit_collectives(world: int, raw: dict[str, list[list[float]]], burst: bool = True) -> dict[str, Cost]:
    """Per kind of ``raw`` (measure.py's samples at ``world`` processes), its per-call cost
    and the wire time of the bytes one rank sends (with a token bucket when the samples show one)."""
    out = {}
    for k in COLLECTIVES:
        if raw.get(k):
            steps, per = shape(k, world)
            out[k] = _fit(raw[k], steps, per * steps, burst)
    return out


STREAMS = ("p2p", "exchange", "allreduce")


def fit_stream(rows: list[list[float]], steps: float, per: float, wire: Cost | None = None,
               calls: int = 1) -> PerCall | None:
    """The per-call cost of back-to-back samples ``[[round, bytes, µs per call], ...]``
    (measure.py: ``calls`` calls in a row, each ``steps`` ring steps sending
    S = ``steps * bytes / per`` bytes).

    Each sample's α is what is left of it after the wire time: ``calls·steps·α + W = calls·t``
    (dpro/oracle/bucket.py :func:`stream_alpha`), W the isolated calls' fit ``wire`` of the
    same kind, else βS by least squares over the samples. On a link with a token bucket
    W follows the bucket from full through the calls, refilled during each call's α; only
    the sizes whose whole stream (calls·S bytes) the full bucket passes at the line rate
    are kept (beyond, the calls wait for the capped rate, which hides α: a stream of
    128 KiB messages under a 128 KiB bucket takes its bytes' time at the rate whatever α
    is), all of them when none is that small. Per
    round, the mean of its samples' α (pooled over the sizes, the ``TRIM`` share at each
    end dropped: a step pays the mean); α = the **median over the rounds**, the spread
    (lowest, median, highest round). β and the bucket: those of W. None without samples."""
    pts = [(int(r), float(b), float(t)) for r, b, t in rows if t == t]
    if not pts:
        return None
    if wire is None:
        S = np.array([steps * b / per for _, b, _ in pts])
        (_, beta), _ = _nnls(np.column_stack([np.full_like(S, steps), S]), np.array([t for *_, t in pts]))
        wire = Cost(0.0, float(beta))
    if wire.burst > 0:  # α where a stream's bytes all leave at the line rate (beyond, the rate hides α)
        inside = [x for x in pts if calls * steps * x[1] / per <= wire.burst]
        pts = inside or pts
    by: dict[int, list[float]] = {}
    for r, b, t in pts:
        by.setdefault(r, []).append(stream_alpha(wire, steps, steps * b / per, calls, t))
    means = sorted(float(np.mean(_trim(v))) for v in by.values())
    mid = statistics.median(means)
    return PerCall(replace(wire, alpha=max(0.0, mid)), (means[0], mid, means[-1]), len(means))


def fit_streams(world: int, raw: dict[str, list[list[float]]], links: dict[str, Cost] | None = None,
                calls: int = 1) -> dict[str, PerCall]:
    """The back-to-back costs of ``raw``'s ``stream_*`` samples at ``world`` processes
    (``p2p``: one message to one peer; the others shaped as :func:`shape`), each with the
    wire time of the isolated calls in ``links`` (a p2p send: the all-reduce's, per byte
    sent) when given."""
    links = links or {}
    out = {}
    for k in STREAMS:
        rows = raw.get(f"stream_{k}")
        if rows:
            steps, per = (1.0, 1.0) if k == "p2p" else shape(k, world)
            got = fit_stream(rows, steps, per * steps, links.get("allreduce" if k == "p2p" else k), calls)
            if got is not None:
                out[k] = got
    return out


def with_per_call(links: dict[str, Cost], calls: dict[str, PerCall]) -> dict[str, Cost]:
    """The isolated calls' costs with the per-call α of back-to-back calls where measured:
    the halo ``exchange`` gets the streamed exchange's α, and a ``send`` (pipeline P2P,
    added) the streamed p2p's α with the all-reduce's wire time (a ring step is such a
    send; its W holds the token bucket). Without an isolated cost, the streamed one."""
    out = dict(links)
    if "exchange" in calls:
        ex = links.get("exchange")
        out["exchange"] = replace(ex, alpha=calls["exchange"].cost.alpha) if ex else calls["exchange"].cost
    if "p2p" in calls:
        ar = links.get("allreduce")
        out["send"] = replace(ar, alpha=calls["p2p"].cost.alpha) if ar else calls["p2p"].cost
    return out


def topology_of(raw: dict[str, list[list[float]]]) -> tuple[str, float] | None:
    """("shared" | "per-rank", ratio) from the ``pair`` and ``concurrent`` samples: the
    median over sizes of a pair's all-reduce next to another pair's over it alone; two
    flows on one link take twice as long (ratio 2), on links of their own as long (1; a
    little more where the ranks share CPU cores): "shared" from ``SHARED_RATIO``. None without the samples (fewer than 4 processes)."""
    pair, conc = _trimmed(raw.get("pair") or []), _trimmed(raw.get("concurrent") or [])
    ratios = []
    for s in np.unique(pair[0]):
        a, c = pair[1][pair[0] == s], conc[1][conc[0] == s]
        if len(a) and len(c) and a.mean() > 0:
            ratios.append(float(c.mean() / a.mean()))
    if not ratios:
        return None
    r = statistics.median(ratios)
    return ("shared" if r >= SHARED_RATIO else "per-rank"), r


def fit_host(raw: dict[str, list[list[float]]], function_us: list[float]) -> HostCosts:
    """The host costs from measure.py's host samples."""
    kw = {k: _fit(raw[k], 1, 1) for k in HOST_OPS if raw.get(k)}
    return HostCosts(**kw, function_us=statistics.median(function_us) if function_us else 0.0)


def calibration_of(samples: dict[int, dict], topology: str = "measure") -> Calibration:
    """The calibration from measure.py's samples per process count (the host costs from
    the first that has them); ``topology``: "measure" (from the samples of 4 processes or
    more, else "shared"), or declared "shared" / "per-rank"."""
    if topology not in (*TOPOLOGIES, "measure"):
        raise ValueError(f"topology must be measure, shared or per-rank (got {topology!r})")
    cal = Calibration()
    for n, d in sorted(samples.items()):
        cal.links[n] = fit_collectives(n, d["raw"])
        if got := fit_streams(n, d["raw"], cal.links[n], int(d.get("stream_calls", 1))):
            cal.calls[n] = got
        if cal.host == HostCosts() and d.get("function_us"):
            cal.host = fit_host(d["raw"], d["function_us"])
    if topology == "measure":
        got = [t for n, d in sorted(samples.items()) if (t := topology_of(d["raw"])) is not None]
        cal.topology, cal.concurrent_ratio = got[-1] if got else ("shared", None)
    else:
        cal.topology = topology
    return cal


def platform_from_samples(samples: dict[int, dict], cores: int | None = None, topology: str = "measure") -> dict:
    """A platform file (dpro/graph/platform.py's format, what ``dpro calibrate --oracle``
    writes): the first process count's all-reduce as the link cost, ``cores``, the
    ``oracle`` section, the all-reduce's median per size."""
    import socket

    from dpro.graph.platform import FORMAT

    cal = calibration_of(samples, topology)
    first = min(samples)
    ar = cal.links[first].get("allreduce", Cost())
    xs, ys = _trimmed(samples[first]["raw"].get("allreduce") or [])
    return {"format": FORMAT, "version": 1, "backend": "gloo", "processes": first, "host": socket.gethostname(),
            "allreduce": {"alpha_us": ar.alpha, "beta_us_per_byte": ar.beta,
                          "model": "per ring step: t = 2(N-1) * (alpha + beta * bytes/N)"},
            "cores": cores, "oracle": cal.to_json(),
            "samples": [{"bytes": int(b), "us": float(np.median(ys[xs == b]))} for b in np.unique(xs)]}


def _cost(d: object) -> Cost:
    if not isinstance(d, dict) or not all(isinstance(d.get(k), (int, float)) and not isinstance(d.get(k), bool)
                                          and d[k] >= 0 for k in ("alpha_us", "beta_us_per_byte")):
        raise ValueError("needs alpha_us and beta_us_per_byte, numbers >= 0")
    extra = [d.get(k, 0.0) for k in ("burst_bytes", "burst_beta_us_per_byte")]
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 for v in extra):
        raise ValueError("burst_bytes and burst_beta_us_per_byte must be numbers >= 0")
    return Cost(float(d["alpha_us"]), float(d["beta_us_per_byte"]), float(extra[0]), float(extra[1]))


def read_calibration(d: object) -> Calibration:
    """The ``"oracle"`` section of a platform file (ValueError with what is wrong)."""
    if not isinstance(d, dict):
        raise ValueError("'oracle' must be an object")
    links: dict[int, dict[str, Cost]] = {}
    for n, kinds in (d.get("links") or {}).items():
        if not str(n).isdigit() or int(n) < 2 or not isinstance(kinds, dict):
            raise ValueError(f"'oracle.links' keys are process counts >= 2 with an object each (got {n!r})")
        links[int(n)] = {k: _cost(v) for k, v in kinds.items() if k in COLLECTIVES}
    host = d.get("host")
    hc = HostCosts()
    if host is not None:
        if not isinstance(host, dict):
            raise ValueError("'oracle.host' must be an object")
        fn = host.get("function_us", 0.0)
        if isinstance(fn, bool) or not isinstance(fn, (int, float)) or fn < 0:
            raise ValueError("'oracle.host.function_us' must be a number >= 0")
        hc = HostCosts(**{k: _cost(host[k]) for k in HOST_OPS if k in host}, function_us=float(fn))
    topo = d.get("topology") or {}
    if not isinstance(topo, dict) or topo.get("links", "shared") not in TOPOLOGIES:
        raise ValueError("'oracle.topology' must be {\"links\": \"shared\" | \"per-rank\"}")
    ratio = topo.get("concurrent_ratio")
    ratio = float(ratio) if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) else None
    calls: dict[int, dict[str, PerCall]] = {}
    if not isinstance(d.get("calls") or {}, dict):
        raise ValueError("'oracle.calls' must be an object of process counts")
    for n, kinds in (d.get("calls") or {}).items():
        if not str(n).isdigit() or int(n) < 2 or not isinstance(kinds, dict):
            raise ValueError(f"'oracle.calls' keys are process counts >= 2 with an object each (got {n!r})")
        calls[int(n)] = {}
        for k, v in kinds.items():
            if k in STREAMS:
                lo = v.get("alpha_rounds_us") if isinstance(v, dict) else None
                ok = isinstance(lo, list) and len(lo) == 3 and all(isinstance(x, (int, float)) for x in lo)
                r = v.get("rounds", 0)
                calls[int(n)][k] = PerCall(_cost(v), tuple(float(x) for x in lo) if ok else (0.0, 0.0, 0.0),
                                           r if isinstance(r, int) and not isinstance(r, bool) else 0)
    return Calibration(links, hc, topo.get("links", "shared"), ratio, calls)
