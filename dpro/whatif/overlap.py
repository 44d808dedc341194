"""Computation and collectives slowing each other on a rank's cores.

On a host whose cores the ranks share (CPU training over gloo), a DDP bucket's all-reduce
runs on the library's thread while the rank's main thread goes on with the backward: each
takes CPU and scheduling turns from the other. ``dpro calibrate`` measures both sides on
the machine (:mod:`dpro.whatif.calibrate`): each size is all-reduced alone, then again while
every rank computes; the platform file keeps the all-reduce's cost while overlapped and the
computation's rate meanwhile (its work per µs over its work per µs alone).

A :class:`Overlap` on a :class:`~dpro.whatif.graph.WhatIfGraph` makes its simulation a fluid
one (:func:`dpro.whatif.fairshare.simulate_fluid`): a node's computation ops and collectives
are flows of their own time; alone each moves at rate 1; while one of the node's collectives
runs, its computation op moves at ``compute_rate`` and the collective at its time alone over
its time overlapped. :func:`deflate_overlap` is the inverse, for a profile whose computation
already ran beside its collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dpro.graph.intervals import intersection_length, merge

if TYPE_CHECKING:
    from dpro.whatif.graph import Op, WhatIfGraph


def _computing(op: Op) -> bool:
    """A computation op on a CPU thread (a GPU stream's kernels do not share the cores)."""
    return op.cat != "COMM" and not op.comm_device and not op.device.split("/", 1)[-1].startswith("gpu")


@dataclass(frozen=True)
class Overlap:
    """How a node's computation and its collectives share its cores while both run."""

    #: a computation op's speed while one of its node's collectives runs (1: unaffected)
    compute_rate: float
    #: collective op id -> its time (µs) while its node computes (its ``dur`` is its time alone)
    comm_us: dict[int, float]

    def flows(self, g: WhatIfGraph, ids: Sequence[int]) -> tuple[dict[int, float], Callable]:
        """The fluid simulation's flows (compiled index -> µs of work) and their rate law."""
        sizes: dict[int, float] = {}
        node: dict[int, str] = {}
        comm_rate: dict[int, float] = {}
        for k, i in enumerate(ids):
            op = g.ops[i]
            if i in self.comm_us:
                comm_rate[k] = min(1.0, op.dur / self.comm_us[i]) if self.comm_us[i] > 0 else 1.0
            elif not _computing(op):
                continue
            sizes[k], node[k] = op.dur + op.gap, op.node

        def law(active: Sequence[int]) -> list[float]:
            communicating = {node[k] for k in active if k in comm_rate}
            computing = {node[k] for k in active if k not in comm_rate}
            return [(comm_rate[k] if node[k] in computing else 1.0) if k in comm_rate
                    else (self.compute_rate if node[k] in communicating else 1.0) for k in active]

        return sizes, law


def deflate_overlap(g: WhatIfGraph, compute_rate: float) -> float:
    """A profile's computation ops ran at ``compute_rate`` while their node's collectives
    (``attrs["sub_op"] == "ALLREDUCE"``) ran: each gets back its time alone, the part of
    its span (in ``g`` simulated as profiled) that overlapped them times ``compute_rate``
    plus the rest. Returns the µs removed from the graph's ops."""
    r = g.simulate()
    at = {i: k for k, i in enumerate(r.ids)}
    start, end = r.schedule.start, r.schedule.end
    by_node: dict[str, list[int]] = {}
    for op in g.ops.values():
        if op.attrs.get("sub_op") == "ALLREDUCE":
            by_node.setdefault(op.node, []).append(at[op.id])
    spans = {n: merge(start[ks], end[ks]) for n, ks in by_node.items()}
    removed = 0.0
    for op in g.ops.values():
        if not _computing(op) or op.node not in spans:
            continue
        s, e = float(start[at[op.id]]), float(end[at[op.id]])
        ov = intersection_length((np.array([s]), np.array([e])), spans[op.node])
        if ov <= 0 or e <= s:
            continue
        f = ((e - s) - ov * (1.0 - compute_rate)) / (e - s)
        removed += (op.dur + op.gap) * (1.0 - f)
        op.dur *= f
        op.gap *= f
    return removed
