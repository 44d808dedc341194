"""Per-link cost of one ring step, t(bytes) = alpha + beta * bytes, fitted from the run.

A ring AllReduce of B bytes over N ranks is 2(N-1) steps, each moving B/N bytes over
every link at once, so a collective that all ranks enter together lasts
``2(N-1) * (alpha + beta * B/N)``.  Collectives that overlap in time share the links
(gloo runs several at once on its worker threads), so we fit on *busy periods*: per
step, collectives are ordered by the moment the last rank started them; a period
collects every collective that starts before all earlier ones of the period ended.
A period of m collectives with B_total bytes that lasts T gives the sample
``T = 2(N-1) * (m * alpha + beta * B_total / N)``, which is also what the replayer's
FIFO links reproduce.  alpha, beta >= 0 by least absolute deviations, robust to a slow step (docs/replayer.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class LinkCost:
    """alpha in µs per ring step, beta in µs per byte."""

    alpha: float
    beta: float
    samples: int = 0
    #: relative RMS error of the fit on its own samples
    fit_error: float = 0.0
    #: distinct sample shapes (collectives, bytes per rank); with one, alpha cannot be
    #: told from beta and the fit is bandwidth-only (0: not fitted from samples)
    shapes: int = 0

    @property
    def latency_known(self) -> bool:
        return self.shapes != 1

    def step_us(self, nbytes: float) -> float:
        return self.alpha + self.beta * nbytes


def ring_steps(n: int) -> int:
    """Number of ring steps of an AllReduce over n ranks."""
    return 2 * (n - 1)


def fit_link_cost(samples: list[tuple[int, int, int, float]]) -> LinkCost | None:
    """Fit from busy-period samples (collectives m, total bytes, ranks N, duration µs).

    None when no sample is usable (no bytes, one rank, non-positive duration).
    """
    rows = [(m, b, n, t) for m, b, n, t in samples if n > 1 and t > 0 and b > 0 and m > 0]
    if not rows:
        return None
    k = np.array([ring_steps(n) for _, _, n, _ in rows], dtype=float)
    cnt = np.array([m for m, _, _, _ in rows], dtype=float)
    x = np.array([b / n for _, b, n, _ in rows], dtype=float)
    y = np.array([t for _, _, _, t in rows], dtype=float)
    return lad_link_cost(np.stack([k * cnt, k * x], axis=1), y)


def lad_link_cost(A: np.ndarray, y: np.ndarray) -> LinkCost:
    """``y ≈ A @ (alpha, beta)`` fitted by :func:`lad_nonneg` (rows: messages-like and
    bytes-like columns per sample, µs), with its RMS relative error and distinct shapes."""
    return link_cost_on(A, y, *lad_nonneg(A, y))


def link_cost_on(A: np.ndarray, y: np.ndarray, alpha: float, beta: float) -> LinkCost:
    """``(alpha, beta)`` as a LinkCost with its RMS relative error on the samples ``A``,
    ``y`` (as in :func:`lad_link_cost`) and their distinct shapes."""
    pred = A @ np.array([alpha, beta])
    err = float(np.sqrt(np.mean(((pred - y) / y) ** 2)))
    shapes = len(set(map(tuple, A.tolist())))
    return LinkCost(float(alpha), float(beta), len(y), err, shapes)


def _median(v: list[float]) -> float:
    """``np.median(v)``, bit for bit (NaN if any is), without its NaN check's first-call
    import of ``numpy.ma`` (~20 ms)."""
    if any(x != x for x in v):
        return float("nan")
    s = sorted(v)
    k = len(s) // 2
    return float(s[k]) if len(s) % 2 else (s[k - 1] + s[k]) / 2.0


def lad_nonneg(A: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """min sum |A x - y| over x >= 0, A with two columns.

    An L1 optimum lies on a line through two samples (or one sample with one coefficient
    zero), so we enumerate those candidates; samples of the same shape are first reduced
    to their median with a weight, which keeps the enumeration tiny.
    """
    shapes: dict[tuple[float, float], list[float]] = {}
    for row, t in zip(A.tolist(), y.tolist()):
        shapes.setdefault((row[0], row[1]), []).append(t)
    S = np.array(list(shapes), dtype=float)
    ys = np.array([_median(v) for v in shapes.values()], dtype=float)
    w = np.array([len(v) for v in shapes.values()], dtype=float)
    cands = [np.array([0.0, v]) for v in ys / np.where(S[:, 1] > 0, S[:, 1], np.inf)]
    cands += [np.array([v, 0.0]) for v in ys / np.where(S[:, 0] > 0, S[:, 0], np.inf)]
    for i in range(len(S)):
        for j in range(i + 1, len(S)):
            M = S[[i, j]]
            if abs(np.linalg.det(M)) > 1e-12 * max(1.0, np.abs(M).max() ** 2):
                cands.append(np.linalg.solve(M, ys[[i, j]]))
    ok = [c for c in cands if np.isfinite(c).all() and (c >= 0).all()]
    err = np.array([float(w @ np.abs(S @ c - ys)) for c in ok])
    tied = [c for c, e in zip(ok, err) if e <= err.min() * (1 + 1e-9) + 1e-9 * float(ys.max())]
    best = min(tied, key=lambda c: float(c[0]))  # among equally good fits, the least latency
    return float(best[0]), float(best[1])


#: how each coarse collective is expanded (docs/replayer.md): ring AllReduce; the two ring
#: halves (AllGather, ReduceScatter; Broadcast as a pipelined ring); pairwise exchanges
#: (AllToAll: N-1 rounds, rank r sends to r+s in round s)
PATTERNS = {"ALLREDUCE": "ring", "ALLGATHER": "ring", "REDUCESCATTER": "ring", "BROADCAST": "ring",
            "ALLTOALL": "pairwise"}


#: a point-to-point transfer (a SEND and its RECV, joined by transaction id): one step of
#: the whole message on the link from sender to receiver
P2P = ("SEND", "RECV")


def collective_steps(sub_op: str, n: int) -> int:
    """Transfer steps of a collective over n ranks, each on every rank's link at once."""
    if sub_op in P2P:
        return 1
    return ring_steps(n) if sub_op == "ALLREDUCE" else n - 1


def chunk_bytes(sub_op: str, nbytes: float, n: int) -> float:
    """Bytes each rank moves per step: B/N (AllReduce, ReduceScatter, Broadcast: B is the
    whole tensor; AllToAll: B is the rank's input, one chunk per peer), B for AllGather (B
    is the rank's own input, the chunk every step forwards; a point-to-point message: B)."""
    return nbytes if sub_op == "ALLGATHER" or sub_op in P2P else nbytes / n


def fit_collective_cost(instances: list[tuple[float, float, int, float, int]]) -> LinkCost | None:
    """Fit alpha, beta from collective instances of several kinds.

    ``instances``: (start, end, steps k, chunk bytes x, ranks N) of each complete collective
    in each step (start: when its last rank joined; end: when its last rank finished).
    Instances of one N that overlap in time share the links and form one busy period
    (as in :func:`fit_link_cost`); a period lasting T gives ``T = alpha * sum(k) + beta *
    sum(k * x)``. None when no period is usable.
    """
    v = sorted(i for i in instances if i[4] > 1 and i[2] > 0 and i[3] > 0)
    rows, y = [], []
    i = 0
    while i < len(v):
        t0, t1, k, x, n = v[i]
        ks, kx, j = float(k), k * x, i + 1
        while j < len(v) and v[j][0] < t1 and v[j][4] == n:
            t1 = max(t1, v[j][1])
            ks, kx, j = ks + v[j][2], kx + v[j][2] * v[j][3], j + 1
        if t1 > t0:
            rows.append((ks, kx))
            y.append(t1 - t0)
        i = j
    if not rows:
        return None
    return lad_link_cost(np.array(rows, dtype=float), np.array(y, dtype=float))
