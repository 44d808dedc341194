"""Cross-node dependencies as difference constraints ``θ_i - θ_j >= lo_ij``.

Every dependency instance "an op on node i cannot end before an op on node j started"
(``end_i + θ_i >= start_j + θ_j``) bounds the difference ``θ_i - θ_j``; of all instances
of a pair only the tightest matters, so the constraint set has at most N(N-1) rows
whatever the number of steps and tensors.  A system of difference constraints is
feasible iff the graph with an edge i -> j of weight ``-lo_ij`` has no negative cycle
(Bellman-Ford), and shortest paths from the reference give the interval every θ can
take.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpro.alignment.extract import AlignData

#: instances stacked at once when reducing collective pairs (memory: chunk * m * m floats)
_CHUNK_ELEMS = 4_000_000


@dataclass
class PairBounds:
    """Tightest dependency of every ordered node pair: θ_i - θ_j >= lo (ms)."""

    i: np.ndarray
    j: np.ndarray
    lo: np.ndarray

    @property
    def n(self) -> int:
        return int(self.i.size)


def pair_bounds(data: AlignData) -> PairBounds:
    """The tightest bound on θ_i - θ_j of every ordered node pair, over all the
    dependency instances in ``data`` (receives and collectives)."""
    n = len(data.names)
    LO = np.full((n, n), -np.inf)
    rv = data.recv
    if rv.n:
        # consumer end + θ_r >= producer start + θ_s
        np.maximum.at(LO, (rv.r, rv.s), rv.b - rv.e)
    co = data.coll
    if co.n:
        # group instances by member set so that they stack into K x m arrays
        groups: dict[tuple[int, ...], list[int]] = {}
        for k in range(co.n):
            members = tuple(co.node[co.ptr[k] : co.ptr[k + 1]].tolist())
            groups.setdefault(members, []).append(k)
        for members, ks in groups.items():
            m = len(members)
            idx = np.asarray(members)
            rows = co.ptr[np.asarray(ks)][:, None] + np.arange(m)[None, :]
            S, E = co.s[rows], co.e[rows]  # K x m
            best = np.full((m, m), -np.inf)
            step = max(1, _CHUNK_ELEMS // (m * m))
            for c in range(0, len(ks), step):
                # lo[r, q] = max_k (S[k, q] - E[k, r]): rank r ends after rank q starts
                d = S[c : c + step, None, :] - E[c : c + step, :, None]
                np.maximum(best, d.max(axis=0), out=best)
            np.fill_diagonal(best, -np.inf)
            sub = LO[np.ix_(idx, idx)]
            LO[np.ix_(idx, idx)] = np.maximum(sub, best)
    np.fill_diagonal(LO, -np.inf)
    ii, jj = np.nonzero(np.isfinite(LO))
    return PairBounds(ii.astype(np.int64), jj.astype(np.int64), LO[ii, jj])


def bellman_ford(n: int, src: np.ndarray, dst: np.ndarray, w: np.ndarray, sources: list[int] | None = None):
    """Shortest distances (edges src -> dst of weight w), vectorised, Jacobi order.

    Returns ``(dist, pred, cycle)``; ``cycle`` is a list of nodes forming a negative
    cycle (then ``dist`` is meaningless), else None.  ``sources=None``: a virtual source
    joined to every node with weight 0 (a feasibility check).
    """
    dist = np.zeros(n) if sources is None else np.full(n, np.inf)
    if sources is not None:
        dist[sources] = 0.0
    pred = np.full(n, -1, dtype=np.int64)
    if src.size == 0:
        return dist, pred, None
    for it in range(n + 1):
        cand = dist[src] + w
        cur = dist[dst]
        fin = np.isfinite(cur)
        better = np.isfinite(cand) & (~fin | (cand < np.where(fin, cur - 1e-12 * np.maximum(1.0, np.abs(np.where(fin, cur, 0.0))), 0.0)))
        if not better.any():
            return dist, pred, None
        idx = np.nonzero(better)[0]
        order = idx[np.lexsort((cand[idx], dst[idx]))]
        d = dst[order]
        first = np.ones(d.size, dtype=bool)
        first[1:] = d[1:] != d[:-1]
        sel = order[first]
        dist[dst[sel]] = cand[sel]
        pred[dst[sel]] = src[sel]
        if it == n:
            return dist, pred, _cycle_from(pred, int(dst[sel[0]]), n)
    return dist, pred, None  # pragma: no cover


def _cycle_from(pred: np.ndarray, v: int, n: int) -> list[int] | None:
    for _ in range(n):
        if pred[v] < 0:
            return None
        v = int(pred[v])
    cyc = [v]
    u = int(pred[v])
    while u != v and len(cyc) <= n:
        if u < 0:
            return None
        cyc.append(u)
        u = int(pred[u])
    cyc.append(v)
    return cyc[::-1]


def check_feasible(n: int, pb: PairBounds, tol_ms: float) -> tuple[list[int] | None, float]:
    """A negative cycle of the constraint graph, if any, and by how much (ms) it contradicts.

    Constraint θ_i - θ_j >= lo_ij is the edge i -> j with weight -lo_ij (θ_j <= θ_i - lo_ij).
    """
    _, _, cyc = bellman_ford(n, pb.i, pb.j, -(pb.lo - tol_ms))
    if cyc is None:
        return None, 0.0
    w = {(int(a), int(b)): float(-(lo - tol_ms)) for a, b, lo in zip(pb.i, pb.j, pb.lo)}
    total = sum(w.get((cyc[k], cyc[k + 1]), 0.0) for k in range(len(cyc) - 1))
    return cyc, -total


def theta_intervals(n: int, pb: PairBounds, ref: int, tol_ms: float) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi] of θ_k - θ_ref allowed by the dependencies (±inf where unbounded)."""
    w = -(pb.lo - tol_ms)
    up, _, c1 = bellman_ford(n, pb.i, pb.j, w, [ref])  # θ_k - θ_ref <= dist(ref -> k)
    dn, _, c2 = bellman_ford(n, pb.j, pb.i, w, [ref])  # θ_ref - θ_k <= dist(k -> ref)
    if c1 is not None or c2 is not None:
        return np.full(n, -np.inf), np.full(n, np.inf)
    return -dn, up
