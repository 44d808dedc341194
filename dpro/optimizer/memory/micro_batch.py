"""Micro-batch op times measured, not assumed: a second trace of the same job at a smaller batch.

Gradient accumulation runs every forward/backward op on 1/k of the batch. Scaling an op's
time by 1/k is wrong where the time does not follow the batch: on a CPU a small-batch
matmul is bound by reading its weights, a weight gradient by writing it (measured here:
a 2048x2048 layer's backward mm takes 2.45 ms at batch 32 and 2.33 ms at 16). With a trace
of the same job profiled at a smaller per-rank batch (``dpro optimize --micro-trace``),
each op's own time at batch fraction x is interpolated (or extrapolated) linearly between
the two measurements; the fraction of the second trace is read from the activations both
recorded (their bytes follow the batch).
"""

from __future__ import annotations

import logging

import numpy as np

from dpro.errors import DproInputError
from dpro.graph.overhead import measured_overhead
from dpro.graph.stats import node_stats, typical_steps
from dpro.gtrace.schema import GTrace, NodeTrace
from dpro.optimizer.job_model import CompOp, JobModel, remove_host_overhead

log = logging.getLogger(__name__)


def _activation_bytes(nt: NodeTrace) -> int:
    """Bytes of the blocks forward ops keep for a later op of the same step."""
    mem = nt.meta.get("memory") if isinstance(nt.meta, dict) else None
    prio = {e.op: e.ts - nt.steps[e.step][0] for e in nt.events if e.step in nt.steps}
    total = 0
    for p, rel, nbytes in (mem or {}).get("lifetimes") or []:
        op = nt.ops.get(p)
        if op is not None and op.cat == "FW" and rel in prio and p in prio and prio[rel] >= prio[p]:
            total += int(nbytes)
    return total


def attach_micro_trace(model: JobModel, full: GTrace, small: GTrace) -> list[str]:
    """Give ``model`` (built from ``full``) the op times of ``small``, the same job at a
    smaller batch. Returns notes for the user."""
    where = small.source or "<micro trace>"
    fw, sw = full.workers(), small.workers()
    if not fw or not sw:
        raise DproInputError(where, "has no worker node")
    a_full = np.median([_activation_bytes(nt) for nt in fw])
    a_small = np.median([_activation_bytes(nt) for nt in sw])
    if a_full <= 0 or a_small <= 0:
        raise DproInputError(where, "cannot tell its batch from the full trace's: both need dpro's memory record "
                                    "(activations recorded by the PyTorch recorder)")
    r = float(a_small / a_full)
    if not 0.05 <= r <= 0.95:
        raise DproInputError(where, f"its activations are {r:.2f}x the full trace's: profile the same job with a "
                                    "smaller per-rank batch (e.g. half)")
    steps = typical_steps(list(small.nodes.values()), small.manifest.steps)
    own: dict[str, list[float]] = {}
    for nt in sw:
        ops = {op: CompOp(op, nt.ops[op].name, nt.ops[op].cat, nt.ops[op].device, st.dur, st.gap, st.offset)
               for op, st in node_stats(nt, steps).items() if st.samples and nt.ops[op].cat != "COMM"}
        ov = measured_overhead(nt) if model.overhead is not None else None
        if ov is not None:  # as the full trace's ops: the job unprofiled
            remove_host_overhead(ov, ops)
        for op, o in ops.items():
            own.setdefault(op, []).append(o.dur)
    times = {op: float(np.mean(v)) for op, v in own.items() if op in model.ops}
    fwbw = [o for o in model.ops.values() if o.cat in ("FW", "BW")]
    matched = sum(1 for o in fwbw if o.id in times)
    if matched < 0.9 * len(fwbw):
        raise DproInputError(where, f"only {matched} of the {len(fwbw)} forward/backward ops match the full trace's: "
                                    "profile the same job (same model and steps), only the batch smaller")
    model.micro = (r, times)
    return [f"micro-batch op times interpolated from {where} (batch {r:.2f}x, {matched} of {len(fwbw)} ops matched)"]
