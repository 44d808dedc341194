"""Recomputation (activation checkpointing): drop a block's activations after its forward
and recompute them just before its backward (dPRO Fig. 2b).

Candidates (:mod:`dpro.optimizer.blocks`): at each module depth, the first m blocks of that
depth for every m (checkpointing the earliest blocks frees the activations that live
longest), i.e. ``torch.utils.checkpoint`` on those modules. The time cost is the
block's forward run again (own times + host gaps) before its backward; the memory saved
is what :mod:`dpro.optimizer.memory.peak` computes from the recorded lifetimes.
"""

from __future__ import annotations

from collections import defaultdict

from dpro.optimizer.blocks import blocks
from dpro.optimizer.passes.base import Candidate, GraphPass, PassContext
from dpro.optimizer.strategy import Strategy


class Recomputation(GraphPass):
    """Checkpoint model blocks: recompute their forward in backward instead of keeping activations."""

    name = "recomputation"
    kind = "memory"

    def candidates(self, ctx: PassContext) -> list[Candidate]:
        """At each module depth, the first m blocks of that depth, for every m."""
        by_depth: dict[int, list[str]] = defaultdict(list)
        for b in blocks(ctx.model):
            by_depth[b.depth].append(b.name)
        out = []
        for depth, names in sorted(by_depth.items()):
            for m in range(1, len(names) + 1):
                sel = tuple(names[:m])
                out.append(Candidate(self.name, sel, f"checkpoint {m} of the {len(names)} depth-{depth} module(s): "
                                                     f"{', '.join(sel[:3])}{', ...' if m > 3 else ''}"))
        return out

    def apply(self, ctx: PassContext, cand: Candidate) -> Strategy:
        return ctx.strategy.with_memory(recompute=tuple(cand.target))
