"""Gradient accumulation: a step runs k micro-batches of 1/k of the batch and synchronises
once (DDP's ``no_sync()`` for the first k-1).

Time model (:mod:`dpro.optimizer.worker_graph`): each forward/backward op's own time scales
by 1/k per micro-batch, its host gap does not (dispatch costs the same for a smaller
batch); the synchronisation and the update run once. Memory
(:mod:`dpro.optimizer.memory.peak`): activations are 1/k as large; gradients are allocated by
the first micro-batch and accumulated in place after.
"""

from __future__ import annotations

from dpro.optimizer.passes.base import Candidate, GraphPass, PassContext
from dpro.optimizer.strategy import Strategy

#: micro-batches per step tried (the batch must divide by k: the strategy says so)
FACTORS = (2, 4, 8)


class GradientAccumulation(GraphPass):
    """Run each step as k micro-batches and synchronise once (activations 1/k as large)."""

    name = "grad_accumulation"
    kind = "memory"

    def __init__(self, factors: tuple[int, ...] = FACTORS) -> None:
        self.factors = tuple(factors)

    def candidates(self, ctx: PassContext) -> list[Candidate]:
        return [Candidate(self.name, (k,), f"{k} micro-batches of 1/{k} of the batch per step") for k in self.factors]

    def apply(self, ctx: PassContext, cand: Candidate) -> Strategy:
        return ctx.strategy.with_memory(accum=int(cand.target[0]))
