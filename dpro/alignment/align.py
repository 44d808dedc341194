"""align(gt) -> AlignResult: one clock offset per node (dPRO, MLSys'22, §4.2)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from dpro.alignment.bounds import PairBounds, check_feasible, pair_bounds, theta_intervals
from dpro.alignment.extract import AlignData, drop_inconsistent, extract
from dpro.alignment.options import AlignOptions
from dpro.alignment.result import AlignResult
from dpro.gtrace.schema import GTrace

if TYPE_CHECKING:
    from dpro.alignment.problem import Pattern

log = logging.getLogger(__name__)


def _components(data: AlignData, pb: PairBounds, use_hosts: bool) -> list[list[int]]:
    """Groups of nodes joined by a dependency (or, through O2, by sharing a host)."""
    n = len(data.names)
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for a, b in zip(pb.i.tolist(), pb.j.tolist()):
        union(a, b)
    if use_hosts:
        first: dict[str, int] = {}
        for i, h in enumerate(data.hosts):
            union(first.setdefault(h, i), i)
    comps: dict[int, list[int]] = {}
    for i in range(n):
        comps.setdefault(find(i), []).append(i)
    return sorted(comps.values(), key=lambda c: c[0])


def _key(p: Pattern) -> bytes:
    return p.recv_send.tobytes() + p.coll_arg.tobytes()


def align(gt: GTrace, options: AlignOptions | None = None) -> AlignResult:
    """Clock offset θ of every node of ``gt`` (µs; add θ_n to node n's timestamps).

    Never raises on degenerate input: a single node, nodes sharing one host, nodes without
    cross-node dependencies, contradictory dependencies and solver failures all give
    usable offsets (0 where nothing is known) and a line in ``notes``.
    """
    opts = options or AlignOptions()
    opts.validate()
    t_start = time.perf_counter()
    names = list(gt.nodes)
    if not names:
        return AlignResult({}, None, status="trivial", notes=["no nodes: nothing to align"])
    if opts.reference is not None and opts.reference not in gt.nodes:
        raise ValueError(f"reference node '{opts.reference}' is not in the trace")
    hosts = {nt.info.host for nt in gt.nodes.values()}
    if len(names) == 1:
        return AlignResult({names[0]: 0.0}, names[0], status="trivial", notes=["one node only: nothing to align"])
    tol_ms = opts.tolerance_us * 1e-3
    if len(hosts) == 1 and not opts.force:
        ref = opts.reference or min(names, key=lambda n: (gt.nodes[n].info.role != "worker", gt.nodes[n].info.rank, n))
        res = AlignResult(
            {n: 0.0 for n in names}, ref, status="trivial",
            notes=[f"all {len(names)} nodes run on host '{next(iter(hosts))}' and share its clock: offsets are 0"],
        )
        # one clock: a violated dependency can only be an error of the recorded events
        checked = drop_inconsistent(extract(gt), tol_ms)
        res.notes += [n for n in checked.notes if n.startswith("inconsistent events")]
        res.time_s = time.perf_counter() - t_start
        return res

    data = drop_inconsistent(extract(gt), tol_ms)
    pb = pair_bounds(data)
    notes = list(data.notes)
    n = len(data.names)
    ref = data.names.index(opts.reference) if opts.reference else 0
    comps = _components(data, pb, opts.a2 > 0)
    fixed: list[int] = []
    comp_ref: dict[int, int] = {}
    for comp in comps:
        r = ref if ref in comp else comp[0]
        for i in comp:
            comp_ref[i] = r
        fixed.append(r)
        if len(comp) == 1:
            notes.append(
                f"{data.names[r]}: no cross-node dependency and no other node on its host "
                f"'{data.hosts[r]}': its clock cannot be aligned, offset 0"
            )
        elif r != ref:
            notes.append(
                f"{', '.join(data.names[i] for i in comp)}: no dependency links them to {data.names[ref]}: "
                f"offsets are relative to {data.names[r]} (offset 0)"
            )
    res = AlignResult(
        {name: 0.0 for name in data.names}, data.names[ref], recv_instances=data.recv.n,
        collective_instances=data.coll.n, dependency_pairs=pb.n, notes=notes,
    )

    cyc, excess = check_feasible(n, pb, tol_ms)
    elastic = cyc is not None
    if elastic:
        notes.append(
            "contradictory dependencies: around "
            + " -> ".join(data.names[i] for i in cyc)  # type: ignore[union-attr]
            + f" the ops would have to overlap by {excess * 1e3:.1f} µs more than any clock offsets allow "
            "(a receive that ends before its sender starts, on every side); solved with dependencies "
            "relaxed, violating them as little as possible"
        )
    else:
        for r in set(fixed):
            lo, hi = theta_intervals(n, pb, r, tol_ms)
            for i in range(n):
                if comp_ref[i] == r:
                    res.bounds_us[data.names[i]] = (
                        float(lo[i] * 1e3) + 0.0 if np.isfinite(lo[i]) else None,
                        float(hi[i] * 1e3) + 0.0 if np.isfinite(hi[i]) else None,
                    )
    if len(fixed) == n:
        res.status = "fallback"
        res.time_s = time.perf_counter() - t_start
        return res

    import cvxpy as cp  # only now: a trace on one host never pays for importing CVXPY

    from dpro.alignment.problem import Builder

    solver_errors = (cp.SolverError, ValueError, ArithmeticError, np.linalg.LinAlgError)
    builder = Builder(data, pb, opts, sorted(set(fixed)), elastic, use_o1=True)
    res.solver = opts.solver.upper()
    deadline = t_start + opts.time_limit_s

    def left() -> float:
        return deadline - time.perf_counter()

    try:
        sol = builder.solve(None, left())
    except solver_errors as e:
        log.warning("alignment: the solver failed: %s", e)
        notes.append(f"the solver failed ({e}): offsets 0")
        res.status = "fallback"
        res.time_s = time.perf_counter() - t_start
        return res
    theta, status = sol.theta, sol.status
    res.variables, res.constraints = sol.variables, sol.constraints
    terms = builder.terms(theta)
    best = builder.objective(terms)
    its = 0
    if builder.use_o1:
        pat = builder.pattern(theta)
        seen = {_key(pat)}
        while its < opts.max_iters:
            if left() <= 0:
                notes.append(f"time limit ({opts.time_limit_s:g} s) reached after {its} iteration(s): best offsets so far")
                break
            try:
                sol = builder.solve(pat, left())
            except solver_errors as e:
                notes.append(f"the solver failed in iteration {its + 1} ({e}): best offsets so far")
                break
            res.variables, res.constraints = sol.variables, sol.constraints
            t_new = builder.terms(sol.theta)
            f = builder.objective(t_new)
            if f > best * (1 + 1e-9) + 1e-12:
                # an inaccurate solve (time limit, numerics) that did not improve: stop here
                if sol.status != "optimal":
                    notes.append(f"iteration {its + 1} ended '{sol.status}' without improving: best offsets so far")
                break
            its += 1
            improved = best - f
            theta, terms, best, status = sol.theta, t_new, f, sol.status
            pat = builder.pattern(theta)
            k = _key(pat)
            if k in seen or improved <= opts.rel_tol * max(abs(best), 1e-12):
                break
            seen.add(k)
    res.offsets_us = {name: float(theta[i] * 1e3) + 0.0 for i, name in enumerate(data.names)}
    res.objective = float(best)
    res.terms = terms
    res.status = status
    res.iterations = its
    if status != "optimal":
        notes.append(f"solver status '{status}'")
    if terms.get("max_violation_ms", 0.0) > tol_ms * 1.01 and not elastic:
        notes.append(f"a dependency is violated by {terms['max_violation_ms'] * 1e3:.1f} µs (solver accuracy)")
    res.time_s = time.perf_counter() - t_start
    log.info("alignment: %d nodes, objective %.4g, %d iteration(s), %.3f s", n, best, its, res.time_s)
    return res
