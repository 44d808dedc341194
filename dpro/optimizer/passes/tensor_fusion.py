"""Tensor fusion: synchronise two adjacent groups of gradients as one (Theorem 2)."""

from __future__ import annotations

import numpy as np

from dpro.optimizer.evaluate import sync_time
from dpro.optimizer.passes.base import Candidate, GraphPass, PassContext
from dpro.optimizer.strategy import Strategy
from dpro.optimizer.theorems import tensor_fusion_gain
from dpro.optimizer.worker_graph import KIND_IN, KIND_XFER


def group_times(ctx: PassContext) -> dict[int, tuple[float, float, float]]:
    """Per group: (launch start r, transfer start, transfer end e) in the current replay."""
    b, s = ctx.analysis.built, ctx.analysis.schedule
    out: dict[int, list[float]] = {}
    for i in np.flatnonzero(b.group >= 0):
        g = int(b.group[i])
        r = out.setdefault(g, [np.inf, np.inf, -np.inf])
        if b.kind[i] == KIND_IN:
            r[0] = float(s.start[i])
        elif b.kind[i] == KIND_XFER:
            r[1] = min(r[1], float(s.start[i]))
            r[2] = max(r[2], float(s.end[i]))
    for g, r in out.items():  # no transfer (one worker): the launch is the whole sync
        if not np.isfinite(r[1]):
            r[1] = r[2] = r[0]
    return {g: (r[0], r[1], r[2]) for g, r in out.items()}


class TensorFusion(GraphPass):
    """Fuse adjacent groups where a group on the critical path waited behind its predecessor."""

    name = "tensor_fusion"

    def candidates(self, ctx: PassContext) -> list[Candidate]:
        """Each adjacent pair of groups, one on the critical path, where Theorem 2 gains."""
        m, st, a = ctx.model, ctx.strategy, ctx.analysis
        on_path = {int(a.built.group[i]) for i in a.critical if a.built.group[i] >= 0}
        times = group_times(ctx)
        out = []
        for i in range(len(st.groups) - 1):
            if i not in on_path and i + 1 not in on_path:
                continue
            s1, s2 = st.group_bytes(m, i), st.group_bytes(m, i + 1)
            k = max(st.partitions[i], st.partitions[i + 1])
            t2 = sync_time(m, s2, st.partitions[i + 1])
            t12 = sync_time(m, s1 + s2, k)
            _, _, e1 = times[i]
            r2 = times[i + 1][0]
            gain = tensor_fusion_gain(r2, e1, t2, t12)
            if gain > 0:
                out.append(Candidate(self.name, ("merge", i), (
                    f"Theorem 2: group {i + 1} ({s2} B) ready at {r2 / 1e3:.2f} ms waited for group {i} "
                    f"to end at {e1 / 1e3:.2f} ms; one sync of both takes {t12 / 1e3:.2f} ms vs {t2 / 1e3:.2f} ms"), gain))
        return out

    def apply(self, ctx: PassContext, cand: Candidate) -> Strategy:
        return ctx.strategy.merge_groups(cand.target[1])
