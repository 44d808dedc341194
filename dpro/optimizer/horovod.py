"""What a Horovod profile tells the optimizer (``meta.horovod``, written by
:mod:`dpro.importers.horovod.atoms`): the fused collectives of each profiled step, the rate their
bytes moved at, the grouping one step ran, whether the job ran Horovod's default fusion,
and each atom's excess (the wait beyond the ring cost)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from dpro.graph.comm_model import LinkCost, link_cost_on, ring_steps
from dpro.gtrace.schema import NodeTrace


@dataclass(frozen=True)
class FusedGroup:
    """One fused Horovod collective of a profiled step (``meta.horovod.groups``)."""

    step: int
    atoms: list[int]
    tensors: list[str]
    bytes: int
    span_us: float
    excess_us: float


def fused_groups(nt: NodeTrace, steps: list[int]) -> list[FusedGroup]:
    """The fused groups of ``meta.horovod`` in ``steps``, in step order; a missing field
    reads as empty or 0, a malformed step (a hand-edited trace) is skipped from there on."""
    out = []
    for s, gs in ((nt.meta.get("horovod") or {}).get("groups") or {}).items():
        try:
            if int(s) not in steps:
                continue
            for g in gs:
                out.append(FusedGroup(int(s), [int(a) for a in g.get("atoms") or []],
                                      [str(t) for t in g.get("tensors") or []], int(g.get("bytes") or 0),
                                      float(g.get("end_us") or 0.0) - float(g.get("start_us") or 0.0),
                                      float(g.get("excess_us") or 0.0)))
        except (TypeError, ValueError, KeyError, AttributeError):
            continue
    return sorted(out, key=lambda g: g.step)


def link_cost(nt: NodeTrace, world: int, steps: list[int], link: LinkCost) -> LinkCost:
    """The link cost of a Horovod job for the optimizer: ``link``'s latency, and the
    bandwidth that prices its fused collectives' whole spans (LAD: the byte-weighted median).

    The replay charges each collective the uncontended ring cost (``link``: the envelope no
    collective undercuts) and its measured excess apart (dpro.importers.horovod.atoms). A small
    collective that ran in a token bucket's burst sets that envelope too fast (TF convnet
    behind a 200 Mbit/s tbf cap: 37 MB/s, and the 2.1 MB collective 30 ms "excess"); a new
    grouping does not inherit the excess, so the optimizer needs the rate the bytes really
    moved at (25.2 MB/s there). The latency stays the envelope's: the spans of small
    collectives also hold Horovod's negotiation and waits (a free two-parameter fit gave
    1.75 ms per ring step on a 1000 Mbit/s mlp job, where no fusion then ran 2 % faster
    than fused)."""
    k, n = ring_steps(max(2, world)), max(2, world)
    rows = [(len(g.atoms), g.bytes, g.span_us) for g in fused_groups(nt, steps) if g.bytes > 0 and g.span_us > 0]
    if not rows:
        return link
    x = np.array([k * b / n for _, b, _ in rows])
    y = np.array([t - k * m * link.alpha for m, _, t in rows])
    order = np.argsort(y / x)
    cum = np.cumsum(x[order])
    beta = max(0.0, float((y / x)[order][np.searchsorted(cum, cum[-1] / 2)]))
    A = np.stack([k * np.array([m for m, _, _ in rows], dtype=float), x], axis=1)
    return link_cost_on(A, np.array([t for _, _, t in rows]), link.alpha, beta)


def step_grouping(nt: NodeTrace, units: list[str], steps: list[int]) -> list[list[int]] | None:
    """The grouping one profiled step ran: Horovod fuses by timing, so each step's groups
    differ and its atoms (the gradients never split across them) are finer than any step's
    (TF transformer: 11 atoms; 3, 5, 2, 2, 3 groups in its 5 steps). The step with the median
    number of groups stands for the job (the lower median; among steps with as many groups,
    the earliest); None when a step's groups do not cover the units (gradient names, in the
    optimizer's order) exactly."""
    index = {u: i for i, u in enumerate(units)}
    by_step: dict[int, list[FusedGroup]] = defaultdict(list)
    for g in fused_groups(nt, steps):
        by_step[g.step].append(g)
    per_step = []
    for gs in by_step.values():
        if any(t not in index for g in gs for t in g.tensors):
            return None
        grouping = [[index[t] for t in g.tensors] for g in gs]
        if sorted(i for g in grouping for i in g) != list(range(len(units))):
            return None
        per_step.append(grouping)
    if not per_step:
        return None
    by_count = sorted(per_step, key=len)  # stable: the earlier step first among equals
    return by_count[(len(by_count) - 1) // 2]


def ran_defaults(nt: NodeTrace) -> bool:
    """Whether the rank recorded that it ran with Horovod's default fusion: no fusion
    setting in its environment, and no explicitly grouped all-reduce in its graph."""
    settings = nt.meta.get("horovod_settings")
    if not isinstance(settings, dict) or settings:
        return False  # not recorded (an older recorder), or set
    tensors = (nt.meta.get("horovod") or {}).get("tensors") or []
    return not any("Grouped" in str(t.get("enqueue_op") or "") for t in tensors if isinstance(t, dict))


def excess_by_atom(nt: NodeTrace, steps: list[int]) -> dict[str, float]:
    """Atom op id -> the median over steps of its fused group's excess (µs) (the importer
    starts an atom's event that much after it could start: dpro.importers.horovod.atoms)."""
    atoms = (nt.meta.get("horovod") or {}).get("atoms") or []
    op_of = {i: a.get("op") for i, a in enumerate(atoms) if isinstance(a, dict)}
    per: dict[str, list[float]] = defaultdict(list)
    for g in fused_groups(nt, steps):
        for a in g.atoms:
            if op_of.get(a):
                per[str(op_of[a])].append(g.excess_us)
    return {o: float(np.median(v)) for o, v in per.items()}
