"""The oracle's calibration: collective and host-op costs fitted from microbenchmark samples.

A platform file may hold an ``"oracle"`` section (benchmarks/oracle/calibrate.py writes it
from benchmarks/oracle/gloo_link.py's samples; never from the runs it is checked against)::

    "oracle": {"links": {"2": {"allreduce": {"alpha_us", "beta_us_per_byte"},
                               "allgather": {...}, "exchange": {...}}, "4": {...}},
               "host": {"cat": {"alpha_us", "beta_us_per_byte"}, "slice": {...}, "clone": {...},
                        "zeros": {...}, "function_us": 41.0}}

``links[n]``: measured in a job of n processes; all-reduce and all-gather per ring step
(``AR(k, m) = 2(k-1)(α + β m/k)``, ``AG(k, m) = (k-1)(α + β m/k)``, m the whole result),
``exchange`` per message of one halo exchange (isend/irecv to each neighbour, then wait).
``host``: per call + per byte of the copies examples/parallel/ makes around its
collectives, and one autograd.Function's forward + backward (µs). Every fit is non-negative
least squares over all samples, each size's extremes trimmed (:func:`_fit`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np


COLLECTIVES = ("allreduce", "allgather", "exchange")
HOST_OPS = ("cat", "slice", "clone", "zeros")


@dataclass(frozen=True, slots=True)
class Cost:
    """``alpha`` µs per call (or ring step), ``beta`` µs per byte."""

    alpha: float = 0.0
    beta: float = 0.0

    def us(self, nbytes: float) -> float:
        return self.alpha + self.beta * nbytes

    def to_json(self) -> dict:
        return {"alpha_us": self.alpha, "beta_us_per_byte": self.beta}


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


@dataclass
class Calibration:
    """Per world size, the collectives' costs; the host costs."""

    links: dict[int, dict[str, Cost]] = field(default_factory=dict)
    host: HostCosts = HostCosts()

    def link(self, world: int) -> dict[str, Cost] | None:
        """The costs measured at ``world`` processes, else at the largest smaller world,
        else the smallest (None: no collective calibrated)."""
        if not self.links:
            return None
        below = [n for n in self.links if n <= world]
        return self.links[max(below) if below else min(self.links)]

    def to_json(self) -> dict:
        return {"links": {str(n): {k: c.to_json() for k, c in d.items()} for n, d in sorted(self.links.items())},
                "host": self.host.to_json()}


#: share of the samples dropped at each end of a size's samples before averaging them
TRIM = 0.1


def _nnls2(A: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """min |A x - y|² over x >= 0, A with two columns (the unconstrained optimum, else the
    best with one coefficient zero)."""
    x, *_ = np.linalg.lstsq(A, y, rcond=None)
    if (x >= 0).all():
        return float(x[0]), float(x[1])
    best = (np.inf, 0.0, 0.0)
    for j in (0, 1):
        col = A[:, j]
        c = max(0.0, float(col @ y / (col @ col))) if col @ col > 0 else 0.0
        r = float(((col * c - y) ** 2).sum())
        best = min(best, (r, c if j == 0 else 0.0, c if j == 1 else 0.0))
    return best[1], best[2]


def _fit(rows: list[list[float]], steps: float, per: float) -> Cost:
    """``µs = steps * (α + β * bytes / per)`` fitted by least squares (α, β >= 0) to every
    sample but the ``TRIM`` share at each end of each size's samples: the mean, because a
    step of many collectives adds up their mean (a call on a shared host is bimodal: a
    fast path and a wait of ~3 ms for the CPU, so a median jumps between the two from one
    run to the next), pooled over the sizes (the wait is the same for every size: α), and
    trimmed of the rare extremes."""
    by: dict[float, list[float]] = {}
    for b, t in rows:
        by.setdefault(float(b), []).append(float(t))
    xs, ys = [], []
    for b, v in by.items():
        v = sorted(v)
        k = int(len(v) * TRIM)
        kept = v[k:len(v) - k] if len(v) > 2 * k else v
        xs += [b] * len(kept)
        ys += kept
    A = np.array([[steps, steps * b / per] for b in xs], dtype=float)
    return Cost(*_nnls2(A, np.array(ys, dtype=float)))


def fit_collectives(world: int, raw: dict[str, list[list[float]]]) -> dict[str, Cost]:
    """Per kind of ``raw`` (gloo_link.py's samples at ``world`` processes), its per-step (per-message) cost."""
    shape = {"allreduce": (2 * (world - 1), world), "allgather": (world - 1, world), "exchange": (1, 1)}
    return {k: _fit(raw[k], *shape[k]) for k in COLLECTIVES if raw.get(k)}


def fit_host(raw: dict[str, list[list[float]]], function_us: list[float]) -> HostCosts:
    """The host costs from gloo_link.py's host samples."""
    kw = {k: _fit(raw[k], 1, 1) for k in HOST_OPS if raw.get(k)}
    return HostCosts(**kw, function_us=statistics.median(function_us) if function_us else 0.0)


def _cost(d: object) -> Cost:
    if not isinstance(d, dict) or not all(isinstance(d.get(k), (int, float)) and not isinstance(d.get(k), bool)
                                          and d[k] >= 0 for k in ("alpha_us", "beta_us_per_byte")):
        raise ValueError("needs alpha_us and beta_us_per_byte, numbers >= 0")
    return Cost(float(d["alpha_us"]), float(d["beta_us_per_byte"]))


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
    return Calibration(links, hc)
