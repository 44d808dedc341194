"""The ring cost of a Horovod profile, fitted on its fused collectives' whole spans.

The Horovod importer (:mod:`dpro.importers.horovod.atoms`) splits each fused execution of
the timeline into an uncontended ring cost, the largest ``alpha + beta * B/N`` per ring
step that *no* execution undercuts, and an *excess* it moves into the host gap before the
collective (a background thread waiting for a core: it does not scale with the bytes).
One fast small message sets that envelope: under a tbf cap a 40 KB gradient fits in the
bucket's burst and the sockets' buffers and crosses at the veth's speed (13.8 ns/B at
500 Mbit/s, where the cap allows 16.7), so the large fused tensors' spans (16.7-17.7 ns
per ring byte, the cap's rate: benchmarks/whatif/hvd_allreduce_probe.py measures 17.0 at
2, 3 and 4 ranks) are charged 20 % as a gap that a scale-out keeps constant instead of
scaling it with the ring.

For a what-if the ring cost is fitted instead on every fused execution's whole span
(``meta.horovod.groups``: start, end, bytes, atoms per profiled step) by the replayer's
least-absolute-deviations fit of busy periods (:func:`dpro.graph.comm_model.fit_link_cost`:
the typical execution, a fast small one or a slow one does not set it), and each
collective's host gap gets back, in place of the importer's excess, its span beyond
that fit (mean over the steps, negative for an execution faster than the typical one; the
gap stays >= 0), so that the profiled cluster replays as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpro.graph.comm_model import fit_link_cost, ring_steps
from dpro.graph.platform import Transfer

if TYPE_CHECKING:
    from dpro.job import Job
    from dpro.whatif.graph import WhatIfGraph

log = logging.getLogger(__name__)


@dataclass
class SpanFit:
    """The ring cost fitted on the fused spans, and per collective op id the change of its
    host gap (µs): the mean over the steps of (span - this fit's cost - importer's excess)."""

    transfer: Transfer
    gap_delta: dict[str, float]
    samples: int


def _groups(job: Job) -> tuple[dict, list[dict]] | None:
    for nt in job.trace.nodes.values():
        h = nt.meta.get("horovod") if isinstance(nt.meta, dict) else None
        if isinstance(h, dict) and isinstance(h.get("groups"), dict) and isinstance(h.get("atoms"), list):
            return h["groups"], h["atoms"]
    return None


def fit_spans(groups: dict[str, list[dict]], atoms: list[dict], world: int, steps: list[str]) -> SpanFit | None:
    """:class:`SpanFit` from ``meta.horovod``'s ``groups`` (step -> fused executions) and
    ``atoms`` (index -> ``{"op": op id}``) of ``steps``, at ``world`` ranks; None if no
    execution can be fitted (one rank, no bytes)."""
    rows: list[tuple[int, int, int, float]] = []
    execs: list[tuple[str, int, int, float, float]] = []  # (first atom's op, atoms m, bytes, span, old excess)
    for s in steps:
        for g in groups.get(s, []):
            try:
                m, nbytes = len(g["atoms"]), int(g["bytes"])
                span = float(g["end_us"]) - float(g["start_us"])
                op = str(atoms[min(g["atoms"])]["op"])
                old = float(g.get("excess_us") or 0.0)
            except (KeyError, TypeError, ValueError, IndexError):
                continue
            if m and nbytes > 0 and span > 0:
                rows.append((m, nbytes, world, span))
                execs.append((op, m, nbytes, span, old))
    lc = fit_link_cost(rows) if world > 1 else None
    if lc is None:
        return None
    k = ring_steps(world)
    delta: dict[str, float] = {}
    for op, m, nbytes, span, old in execs:
        new = span - k * (m * lc.alpha + lc.beta * nbytes / world)  # < 0: faster than typical
        delta[op] = delta.get(op, 0.0) + (new - old) / len(steps)
    return SpanFit(Transfer(lc.alpha, lc.beta), delta, len(rows))


def horovod_span_fit(job: Job) -> SpanFit | None:
    """:func:`fit_spans` of a Horovod profile's timeline groups (None: not a Horovod
    profile with them, or nothing to fit)."""
    found = _groups(job)
    if found is None:
        return None
    groups, atoms = found
    world = int(job.trace.manifest.world_size or 0)
    steps = [str(s) for s in job.steps if str(s) in groups]
    return fit_spans(groups, atoms, world, steps) if steps else None


def give_back_excess(g: WhatIfGraph, fit: SpanFit) -> int:
    """Each all-reduce op of ``g`` (named ``<node>/<op id>``) gets ``fit.gap_delta`` added
    to its host gap (never below 0); returns how many changed."""
    n = 0
    for op in g.select(lambda o: o.attrs.get("sub_op") == "ALLREDUCE"):
        d = fit.gap_delta.get(op.name.split("/", 1)[-1])
        if d:
            op.gap = max(0.0, op.gap + d)
            n += 1
    return n
