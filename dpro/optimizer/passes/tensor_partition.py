"""Tensor partition: split a group's synchronisation into k pieces.

``t_sync(s, k)`` comes from a partial replay of the group's communication subgraph
(:func:`dpro.optimizer.evaluate.sync_time`), k* is the best k of 1, 2, 4, ... up to
``max_pieces``. On a ring AllReduce every piece pays the per-step overhead again while the
links are already all busy, so k* = 1; with S parameter servers, S pieces spread a tensor
over all servers' links.
"""

from __future__ import annotations

from dpro.optimizer.evaluate import sync_time
from dpro.optimizer.passes.base import Candidate, GraphPass, PassContext
from dpro.optimizer.strategy import Strategy


def best_partition(model, nbytes: int, max_pieces: int = 16) -> tuple[int, float]:
    """(k*, t_sync(s, k*)) over k = 1, 2, 4, ..., max_pieces."""
    best = (1, sync_time(model, nbytes, 1))
    k = 2
    while k <= max_pieces:
        t = sync_time(model, nbytes, k)
        if t < best[1] - 1e-9:
            best = (k, t)
        k *= 2
    return best


class TensorPartition(GraphPass):
    """For each group on the critical path, the piece count with the fastest partial replay."""

    name = "tensor_partition"

    def __init__(self, max_pieces: int = 16) -> None:
        self.max_pieces = max_pieces

    def candidates(self, ctx: PassContext) -> list[Candidate]:
        """Each group on the critical path whose best piece count syncs faster than its own."""
        m, st, a = ctx.model, ctx.strategy, ctx.analysis
        on_path = sorted({int(a.built.group[i]) for i in a.critical if a.built.group[i] >= 0})
        out = []
        for g in on_path:
            nbytes = st.group_bytes(m, g)
            k, t = best_partition(m, nbytes, self.max_pieces)
            now = sync_time(m, nbytes, st.partitions[g])
            if k != st.partitions[g] and t < now - 1e-9:
                out.append(Candidate(self.name, ("partition", g, k), (
                    f"partial replay: {nbytes} B in {k} pieces syncs in {t / 1e3:.2f} ms "
                    f"vs {now / 1e3:.2f} ms in {st.partitions[g]}"), now - t))
        return out

    def apply(self, ctx: PassContext, cand: Candidate) -> Strategy:
        _, g, k = cand.target
        return ctx.strategy.with_partition(g, k)
