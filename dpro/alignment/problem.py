"""The alignment problem in matrix form, solved with CVXPY (docs/alignment.md).

One stacked variable ``z = [θ (N) | μ (F) | u (M) | v (M) | σ (P, elastic only)]``:

* θ — the offset of every node (ms internally);
* μ — the mean duration of every receive family (the variance's centre, a variable:
  ``Var(x) = min_μ mean (x - μ)^2``);
* u, v — the positive and negative parts of every receive instance's deviation
  ``x_k - μ_f``, so that the squared deviation is ``u_k^2 + v_k^2``;
* σ — violations of dependencies, only when the dependencies contradict each other.

O1 is not convex (a duration clipped by a max); each majorize-minimize iteration replaces
the non-convex half of every squared deviation by a convex upper bound that is tight at
the current point (the tangent of the max, i.e. its current active piece), so each
iteration is one sparse convex QP and the true objective never increases.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from dpro.alignment.bounds import PairBounds
from dpro.alignment.extract import AlignData
from dpro.alignment.options import AlignOptions

log = logging.getLogger(__name__)


@dataclass
class Layout:
    """Where each block of ``z`` starts, and sizes."""

    n: int
    fr: int  # recv families
    fc: int  # collective families
    mr: int  # recv instances (u, v each)
    mc: int  # collective instances
    p: int  # elastic slacks

    @property
    def mu(self) -> int:
        return self.n

    @property
    def u(self) -> int:
        return self.n + self.fr + self.fc

    @property
    def v(self) -> int:
        return self.u + self.mr + self.mc

    @property
    def sig(self) -> int:
        return self.v + self.mr + self.mc

    @property
    def size(self) -> int:
        return self.sig + self.p


@dataclass
class Pattern:
    """The active piece of every max at the current point (defines the majorizer)."""

    recv_send: np.ndarray  # bool per recv instance: the producer's start is the later one
    coll_arg: np.ndarray  # per collective instance: the member (node index) that started last


@dataclass
class Solved:
    theta: np.ndarray  # ms
    status: str
    variables: int
    constraints: int


class Builder:
    """Precomputes the parts of the problem that do not change across iterations."""

    def __init__(self, data: AlignData, pb: PairBounds, opts: AlignOptions, fixed: list[int], elastic: bool, use_o1: bool) -> None:
        self.data, self.pb, self.opts, self.fixed, self.elastic = data, pb, opts, fixed, elastic
        n = len(data.names)
        rv, co = data.recv, data.coll
        self.use_recv = use_o1 and opts.a1 > 0 and rv.n > 0
        self.use_coll = use_o1 and opts.a1_coll > 0 and co.n > 0
        self.use_o1 = self.use_recv or self.use_coll
        self.L = Layout(
            n=n,
            fr=len(rv.families) if self.use_recv else 0,
            fc=len(co.families) if self.use_coll else 0,
            mr=rv.n if self.use_recv else 0,
            mc=co.n if self.use_coll else 0,
            p=pb.n if elastic else 0,
        )
        co_sizes = np.diff(co.ptr) if co.n else np.zeros(0, dtype=np.int64)
        self.co_sizes = co_sizes
        self.co_inst = np.repeat(np.arange(co.n), co_sizes) if co.n else np.zeros(0, dtype=np.int64)
        self.co_ebar = (np.add.reduceat(co.e, co.ptr[:-1]) / co_sizes) if co.n else np.zeros(0)
        self.w1 = float(rv.n)  # O1 normaliser: receive instances
        self.w1c = float(co_sizes.sum())  # O1c normaliser: collective rank-instances
        self._static_quad()

    # ------------------------------------------------------------------ static parts
    def _static_quad(self) -> None:
        """Quadratic rows of O2, O3 and the tie-break, on θ: sum_squares(Q θ + q) + const."""
        d, o = self.data, self.opts
        n = len(d.names)
        rows: list[sp.spmatrix] = []
        rhs: list[np.ndarray] = []
        # O2: same host, same clock
        by_host: dict[str, list[int]] = {}
        for i, h in enumerate(d.hosts):
            by_host.setdefault(h, []).append(i)
        multi = [ix for ix in by_host.values() if len(ix) > 1]
        self.o2_groups = multi
        n2 = sum(len(ix) for ix in multi)
        if multi and o.a2 > 0:
            rows.append(np.sqrt(o.a2 / n2) * self._centering(multi, n))
            rhs.append(np.zeros(n2))
        # O3: aligned ends of a collective instance agree
        self.o3 = self._o3_stats(n)
        if self.o3 is not None and o.a3 > 0:
            R, c, _, w3 = self.o3
            rows.append(np.sqrt(o.a3 / w3) * R)
            rhs.append(np.sqrt(o.a3 / w3) * c)
        # tie-break: slack of the tightest dependency of every pair
        pb = self.pb
        if pb.n and o.tie > 0:
            D = sp.coo_matrix(
                (np.r_[np.ones(pb.n), -np.ones(pb.n)], (np.r_[np.arange(pb.n), np.arange(pb.n)], np.r_[pb.i, pb.j])),
                shape=(pb.n, n),
            ).tocsr()
            rows.append(np.sqrt(o.tie / pb.n) * D)
            rhs.append(-np.sqrt(o.tie / pb.n) * pb.lo)
        if rows:
            self.Q = sp.vstack(rows).tocsr()
            self.q = np.concatenate(rhs)
        else:
            self.Q = sp.csr_matrix((0, n))
            self.q = np.zeros(0)

    @staticmethod
    def _centering(groups: list[list[int]], n: int) -> sp.csr_matrix:
        r, c, v = [], [], []
        row = 0
        for ix in groups:
            m = len(ix)
            for a in ix:
                for b in ix:
                    r.append(row)
                    c.append(b)
                    v.append((1.0 if a == b else 0.0) - 1.0 / m)
                row += 1
        return sp.coo_matrix((v, (r, c)), shape=(row, n)).tocsr()

    def _o3_stats(self, n: int):
        """Sufficient statistics of O3 = sum_k sum_r (e_rk + θ_r - E_k)^2 (E_k free).

        Per member set M with K instances: K * ||P_M θ + cbar||^2 + sum (c_rk - cbar_r)^2,
        where c_rk = e_rk - mean_r e_rk and cbar_r = mean_k c_rk (exact, see docs).
        """
        co = self.data.coll
        if co.n == 0:
            return None
        groups: dict[tuple[int, ...], list[int]] = {}
        for k in range(co.n):
            groups.setdefault(tuple(co.node[co.ptr[k] : co.ptr[k + 1]].tolist()), []).append(k)
        blocks, cs = [], []
        const, w3 = 0.0, 0.0
        for members, ks in groups.items():
            m = len(members)
            rows = co.ptr[np.asarray(ks)][:, None] + np.arange(m)[None, :]
            E = co.e[rows]
            C = E - E.mean(axis=1, keepdims=True)
            cbar = C.mean(axis=0)
            const += float(((C - cbar) ** 2).sum())
            K = len(ks)
            w3 += K * m
            blocks.append(np.sqrt(K) * self._centering([list(members)], n))
            cs.append(np.sqrt(K) * cbar)
        return sp.vstack(blocks).tocsr(), np.concatenate(cs), const, w3

    # ------------------------------------------------------------------ patterns
    def pattern(self, theta: np.ndarray) -> Pattern:
        """The active pattern at ``theta``: for every receive, whether its sender's start (not
        its own recorded start) binds it; for every collective instance, the node that arrived last."""
        rv, co = self.data.recv, self.data.coll
        send = (rv.b + theta[rv.s] - theta[rv.r]) > rv.a if rv.n else np.zeros(0, dtype=bool)
        if co.n:
            t = co.s + theta[co.node]
            amax = np.maximum.reduceat(t, co.ptr[:-1])
            hit = t >= np.repeat(amax, self.co_sizes)
            # first member attaining the max in every instance
            pos = np.nonzero(hit)[0]
            inst = self.co_inst[pos]
            first = np.ones(pos.size, dtype=bool)
            first[1:] = inst[1:] != inst[:-1]
            arg = co.node[pos[first]]
        else:
            arg = np.zeros(0, dtype=np.int64)
        return Pattern(send, arg)

    # ------------------------------------------------------------------ objective (exact)
    def terms(self, theta: np.ndarray) -> dict[str, float]:
        """The unweighted terms at θ (ms^2), evaluated exactly (no majorization)."""
        rv, co = self.data.recv, self.data.coll
        out: dict[str, float] = {}
        out["O1"] = out["O1c"] = 0.0
        if rv.n:
            dur = rv.e - np.maximum(rv.a, rv.b + theta[rv.s] - theta[rv.r])
            F = len(rv.families)
            cnt = np.bincount(rv.fam, minlength=F)
            mean = np.bincount(rv.fam, weights=dur, minlength=F) / np.maximum(cnt, 1)
            out["O1"] = float(((dur - mean[rv.fam]) ** 2).sum()) / self.w1
        if co.n:
            A = np.maximum.reduceat(co.s + theta[co.node], co.ptr[:-1])
            x = A - self.co_ebar
            w = self.co_sizes.astype(float)
            F = len(co.families)
            sw = np.bincount(co.fam, weights=w, minlength=F)
            mean = np.bincount(co.fam, weights=w * x, minlength=F) / np.maximum(sw, 1e-300)
            out["O1c"] = float((w * (x - mean[co.fam]) ** 2).sum()) / self.w1c
        n2 = sum(len(ix) for ix in self.o2_groups)
        out["O2"] = float(sum(((theta[ix] - theta[ix].mean()) ** 2).sum() for ix in self.o2_groups)) / n2 if n2 else 0.0
        if self.o3 is not None:
            R, c, const, w3 = self.o3
            out["O3"] = float((np.sum((R @ theta + c) ** 2) + const) / w3)
        else:
            out["O3"] = 0.0
        pb = self.pb
        out["T"] = float(np.mean((theta[pb.i] - theta[pb.j] - pb.lo) ** 2)) if pb.n else 0.0
        viol = pb.lo - (theta[pb.i] - theta[pb.j]) if pb.n else np.zeros(0)
        out["max_violation_ms"] = float(max(0.0, viol.max())) if viol.size else 0.0
        out["violation_ms"] = float(np.maximum(0.0, viol - self.opts.tolerance_us * 1e-3).sum()) if viol.size else 0.0
        return out

    def objective(self, t: dict[str, float]) -> float:
        o = self.opts
        val = (o.a1 * t["O1"] if self.use_recv else 0.0) + (o.a1_coll * t["O1c"] if self.use_coll else 0.0)
        val += o.a2 * t["O2"] + o.a3 * t["O3"] + o.tie * t["T"]
        if self.elastic:
            val += o.elastic_penalty * t["violation_ms"]
        return val

    # ------------------------------------------------------------------ one convex QP
    def solve(self, pat: Pattern | None, time_left: float) -> Solved:
        """Minimise the convex majorizer at ``pat`` (no O1 when ``pat`` is None)."""
        L, o = self.L, self.opts
        n = L.n
        use_o1 = self.use_o1 and pat is not None
        nz = L.size if use_o1 else n + L.p
        sig0 = L.sig if use_o1 else n
        G_r, G_c, G_v, h = [], [], [], []
        row = 0

        def add(r, c, v, rhs):
            nonlocal row
            G_r.append(r + row)
            G_c.append(c)
            G_v.append(v)
            h.append(rhs)
            row += len(rhs)

        # dependencies: θ_i - θ_j (+ σ) >= lo - tol
        pb = self.pb
        tol = o.tolerance_us * 1e-3
        if pb.n:
            ar = np.arange(pb.n)
            r = np.r_[ar, ar]
            c = np.r_[pb.i, pb.j]
            v = np.r_[np.ones(pb.n), -np.ones(pb.n)]
            if L.p:
                r, c, v = np.r_[r, ar], np.r_[c, sig0 + ar], np.r_[v, np.ones(pb.n)]
            add(r, c, v, pb.lo - tol)
            if L.p:
                add(ar, sig0 + ar, np.ones(pb.n), np.zeros(pb.n))
        P_diag = np.zeros(nz)
        lin = np.zeros(nz)
        if use_o1:
            self._o1_rows(pat, add)
            w = np.r_[np.full(L.mr, o.a1 / max(self.w1, 1.0)), (o.a1_coll / max(self.w1c, 1.0)) * self.co_sizes[: L.mc]]
            P_diag[L.u : L.u + L.mr + L.mc] = w
            P_diag[L.v : L.v + L.mr + L.mc] = w
        if L.p:
            lin[sig0 : sig0 + L.p] = o.elastic_penalty
        G = sp.csr_matrix((np.concatenate(G_v), (np.concatenate(G_r), np.concatenate(G_c))), shape=(row, nz)) if row else None
        hv = np.concatenate(h) if row else None

        z = cp.Variable(nz)
        theta = z[:n]
        obj = 0
        if self.Q.shape[0]:
            obj = obj + cp.sum_squares(self.Q @ theta + self.q)
        if P_diag.any():
            idx = np.nonzero(P_diag)[0]
            obj = obj + cp.sum_squares(cp.multiply(np.sqrt(P_diag[idx]), z[idx]))
        if lin.any():
            obj = obj + lin @ z
        cons = []
        if G is not None:
            cons.append(G @ z >= hv)
        if self.fixed:
            cons.append(z[np.asarray(self.fixed)] == 0)
        prob = cp.Problem(cp.Minimize(obj), cons)
        nvars = nz
        ncons = row + len(self.fixed)
        status = self._run(prob, time_left)
        if z.value is None:
            raise cp.SolverError(f"no solution ({status})")
        th = np.asarray(z.value[:n], dtype=float)
        if self.fixed:
            th[np.asarray(self.fixed)] = 0.0
        return Solved(th, status, nvars, ncons)

    def _o1_rows(self, pat: Pattern, add) -> None:
        L = self.L
        rv, co = self.data.recv, self.data.coll
        if self.use_recv:
            k = np.arange(rv.n)
            u = L.u + k
            v = L.v + k
            mu = L.mu + rv.fam
            one = np.ones(rv.n)
            # u >= μ - A   (A = e - a)
            add(np.r_[k, k], np.r_[u, mu], np.r_[one, -one], -(rv.e - rv.a))
            # u >= μ - B + θ_s - θ_r   (B = e - b)
            add(np.r_[k, k, k, k], np.r_[u, mu, rv.s, rv.r], np.r_[one, -one, -one, one], -(rv.e - rv.b))
            # v >= L - μ with L the active piece of min(A, B - θ_s + θ_r)
            snd = pat.recv_send
            rr = np.arange(rv.n)
            cols = [v, mu]
            vals = [one, one]
            rws = [rr, rr]
            ks = np.nonzero(snd)[0]
            cols += [rv.s[ks], rv.r[ks]]
            vals += [np.ones(ks.size), -np.ones(ks.size)]
            rws += [ks, ks]
            rhs = np.where(snd, rv.e - rv.b, rv.e - rv.a)
            add(np.concatenate(rws), np.concatenate(cols), np.concatenate(vals), rhs)
            add(k, u, one, np.zeros(rv.n))
            add(k, v, one, np.zeros(rv.n))
        if self.use_coll:
            nnz = co.node.size
            j = np.arange(nnz)
            inst = self.co_inst
            u = L.u + L.mr + inst
            mu = L.mu + L.fr + co.fam[inst]
            one = np.ones(nnz)
            # u_k >= s_qk + θ_q - ebar_k - μ   for every member q
            add(np.r_[j, j, j], np.r_[u, mu, co.node], np.r_[one, one, -one], co.s - self.co_ebar[inst])
            # v_k >= μ - (s_q*k + θ_q* - ebar_k) with q* the member that started last
            k = np.arange(co.n)
            start_q = self._start_of(pat.coll_arg)
            one = np.ones(co.n)
            add(np.r_[k, k, k], np.r_[L.v + L.mr + k, L.mu + L.fr + co.fam, pat.coll_arg], np.r_[one, -one, one],
                -(start_q - self.co_ebar))
            add(k, L.u + L.mr + k, one, np.zeros(co.n))
            add(k, L.v + L.mr + k, one, np.zeros(co.n))

    def _start_of(self, arg: np.ndarray) -> np.ndarray:
        """s_{q,k} of member ``arg[k]`` of every collective instance k."""
        co = self.data.coll
        hit = co.node == np.repeat(arg, self.co_sizes)
        pos = np.nonzero(hit)[0]
        inst = self.co_inst[pos]
        first = np.ones(pos.size, dtype=bool)
        first[1:] = inst[1:] != inst[:-1]
        return co.s[pos[first]]

    def _run(self, prob: cp.Problem, time_left: float) -> str:
        o = self.opts
        solver = o.solver.upper()
        limit = max(0.05, float(time_left))
        kw: dict = {}
        if solver == "CLARABEL":
            kw = {"time_limit": limit}
        elif solver == "OSQP":
            kw = {"time_limit": limit, "eps_abs": 1e-7, "eps_rel": 1e-7, "max_iter": 200_000, "polish": True}
        elif solver == "SCS":
            kw = {"time_limit_secs": limit, "eps_abs": 1e-7, "eps_rel": 1e-7}
        t = time.perf_counter()
        with warnings.catch_warnings():
            # "Solution may be inaccurate": reported through the status instead
            warnings.simplefilter("ignore", UserWarning)
            prob.solve(solver=solver, **kw)
        log.debug("alignment QP: %s in %.3f s (%s)", prob.status, time.perf_counter() - t, solver)
        return str(prob.status)
