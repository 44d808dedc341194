"""Shifted copies of a gTrace: inject clock skew, or apply the offsets alignment found."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from dpro.gtrace.schema import Event, GTrace, NodeTrace
from dpro.gtrace.validate import PAIRS

if TYPE_CHECKING:
    from dpro.alignment.options import AlignOptions
    from dpro.alignment.result import AlignResult

log = logging.getLogger(__name__)


def shift_nodes(gt: GTrace, shifts_us: dict[str, float]) -> GTrace:
    """A copy of ``gt`` in which every timestamp of node ``n`` (events and step windows)
    is moved by ``shifts_us[n]`` µs (nodes not named are unchanged).

    The copy has its own events, step windows, node and manifest objects; ops, edges and
    tensors are shared with ``gt`` (they hold no time).
    """
    unknown = set(shifts_us) - set(gt.nodes)
    if unknown:
        raise KeyError(f"unknown node(s): {', '.join(sorted(unknown))}")
    nodes: dict[str, NodeTrace] = {}
    for name, nt in gt.nodes.items():
        d = float(shifts_us.get(name, 0.0))
        nodes[name] = NodeTrace(
            info=replace(nt.info),
            ops=dict(nt.ops),
            edges=list(nt.edges),
            events=[Event(e.op, e.step, e.ts + d, e.dur) for e in nt.events],
            steps={s: (t + d, dur) for s, (t, dur) in nt.steps.items()},
            tensors=list(nt.tensors),
            meta=dict(nt.meta),
        )
    m = gt.manifest
    manifest = replace(m, nodes=[replace(n) for n in m.nodes], steps=list(m.steps), meta=dict(m.meta))
    return GTrace(manifest=manifest, nodes=nodes, source=gt.source, notes=list(gt.notes))


def apply_offsets(gt: GTrace, offsets_us: dict[str, float], correct_recv: bool = True) -> GTrace:
    """``gt`` on one clock: node ``n``'s timestamps shifted by θ_n = ``offsets_us[n]``.

    With ``correct_recv``, a receive (RECV, PUSH_RES, PULL_RES) that was launched before
    its producer started is made to start when the producer started (its recorded start is
    its launch, not the moment data could flow); its end is kept.  The offsets are
    recorded in the manifest's ``meta["clock_offsets_us"]``.
    """
    out = shift_nodes(gt, {k: v for k, v in offsets_us.items() if k in gt.nodes})
    moved = 0
    if correct_recv:
        moved = _correct_recv(out)
        log.debug("apply_offsets: %d receive(s) now start when their producer started", moved)
    out.manifest.meta["clock_offsets_us"] = {k: float(v) for k, v in offsets_us.items() if k in gt.nodes}
    if offsets_us:
        biggest = max(abs(v) for v in offsets_us.values())
        msg = f"clocks aligned: offsets applied to {len(offsets_us)} node(s), largest {biggest:.1f} µs"
        if moved:
            msg += f"; {moved} receive(s) start when their sender started"
        out.notes.append(msg)
    return out


def _correct_recv(gt: GTrace) -> int:
    by_txn: dict[tuple[str, str], tuple[str, str]] = {}
    for name, nt in gt.nodes.items():
        for op in nt.ops.values():
            if op.cat == "COMM" and op.txn is not None and op.sub_op in (set(PAIRS) | set(PAIRS.values())):
                by_txn[(op.sub_op, op.txn)] = (name, op.id)
    # consumer (node, op) -> producer (node, op), cross-node only
    cons_of: dict[str, dict[str, tuple[str, str]]] = {}
    for prod, cons in PAIRS.items():
        for (sub, txn), key in by_txn.items():
            if sub == prod and (cons, txn) in by_txn:
                cn, co = by_txn[(cons, txn)]
                if cn != key[0]:
                    cons_of.setdefault(cn, {})[co] = key
    if not cons_of:
        return 0
    need: dict[str, set[str]] = {}
    for cn, m in cons_of.items():
        for pn, po in m.values():
            need.setdefault(pn, set()).add(po)
    starts: dict[tuple[str, str, int], float] = {}
    for pn, ops in need.items():
        for e in gt.nodes[pn].events:
            if e.op in ops:
                starts[(pn, e.op, e.step)] = e.ts
    moved = 0
    for cn, m in cons_of.items():
        for e in gt.nodes[cn].events:
            p = m.get(e.op)
            if p is None:
                continue
            t = starts.get((p[0], p[1], e.step))
            if t is not None and t > e.ts:
                end = e.ts + e.dur
                e.ts = min(t, end)
                e.dur = end - e.ts
                moved += 1
    return moved


def on_one_clock(gt: GTrace, options: AlignOptions | None = None) -> tuple[GTrace, AlignResult]:
    """``gt`` with every node on one clock, and the alignment that put it there: the
    offsets :func:`dpro.alignment.align` estimates, applied unless nothing needed them
    (status ``"trivial"``: one host), in which case ``gt`` itself is returned."""
    from dpro.alignment.align import align

    res = align(gt, options)
    return (gt if res.status == "trivial" else apply_offsets(gt, res.offsets_us)), res
