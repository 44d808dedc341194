"""Algorithm 1, step 1: make the job fit a memory budget, as fast as possible.

If the job as profiled is predicted to fit, nothing changes. Otherwise every combination
of at most one candidate per memory pass (recomputation, gradient accumulation, a user's
``kind = "memory"`` pass) is replayed and its peak estimated; the fastest that fits
wins (ties: the smaller peak). The throughput search then starts from it.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

from dpro.errors import DproInputError
from dpro.optimizer.evaluate import analyse, schedule_of
from dpro.optimizer.job_model import JobModel
from dpro.optimizer.memory.peak import strategy_memory
from dpro.optimizer.passes.base import Candidate, GraphPass, PassContext
from dpro.optimizer.strategy import Strategy
from dpro.optimizer.worker_graph import build
from dpro.progress import Tick, _noop

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryChoice:
    """A tried combination of memory changes and what it is predicted to cost."""

    strategy: Strategy
    iteration_us: float
    peak_bytes: int
    changes: tuple[str, ...]

    def to_json(self) -> dict:
        return {"changes": list(self.changes), "iteration_us": self.iteration_us, "peak_bytes": self.peak_bytes,
                "recompute": list(self.strategy.recompute), "accumulation_steps": self.strategy.accum}


@dataclass
class MemoryFit:
    """The memory step's outcome: the budget, the job as it was, the choice, all tried."""

    budget_bytes: int
    before: MemoryChoice
    chosen: MemoryChoice
    tried: list[MemoryChoice] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"budget_bytes": self.budget_bytes, "before": self.before.to_json(), "chosen": self.chosen.to_json(),
                "tried": len(self.tried)}


class CannotFit(DproInputError):
    """No combination of the memory passes fits the budget (the CLI exits with 3)."""

    exit_code = 3


def evaluate_memory(model: JobModel, st: Strategy, changes: tuple[str, ...] = ()) -> MemoryChoice:
    built = build(model, st)
    sched = schedule_of(model, built)
    return MemoryChoice(st, sched.makespan, strategy_memory(model, st, built, sched).peak_bytes, changes)


def fmt_bytes(n: float) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= f:
            return f"{n / f:.2f} {unit}"
    return f"{int(n)} B"


def fit_memory(model: JobModel, budget_bytes: int, passes: list[GraphPass], start: Strategy,
               tick: Tick = _noop) -> MemoryFit:
    """The fastest strategy (memory changes applied to ``start``) predicted to fit ``budget_bytes``.

    Raises :class:`CannotFit` (a one-line message with the smallest peak found) when none does.
    """
    where = "--memory-budget"
    if model.memory is None:
        raise DproInputError(where, "the trace has no memory record (profile with dpro's PyTorch recorder)")
    before = evaluate_memory(model, start)
    if before.peak_bytes <= budget_bytes:
        return MemoryFit(budget_bytes, before, before, [before])
    ctx = PassContext(model, start, analyse(model, start))
    options: list[list[tuple[GraphPass, Candidate] | None]] = [
        [None] + [(p, c) for c in p.candidates(ctx)] for p in passes if p.kind == "memory"]
    tried = [before]
    for combo in itertools.product(*options):
        picks = [x for x in combo if x is not None]
        if not picks:
            continue
        st = start
        for p, c in picks:
            st = p.apply(PassContext(model, st, ctx.analysis), c)
        tried.append(evaluate_memory(model, st, tuple(c.reason for _, c in picks)))
        tick(f"memory: {len(tried)} tried")
    fits = [c for c in tried if c.peak_bytes <= budget_bytes]
    if not fits:
        low = min(tried, key=lambda c: (c.peak_bytes, c.iteration_us))
        how = "; ".join(low.changes) or "as profiled"
        raise CannotFit(where, f"cannot fit in {fmt_bytes(budget_bytes)}: the best found needs {fmt_bytes(low.peak_bytes)} "
                               f"({how}); the job as profiled needs {fmt_bytes(before.peak_bytes)}")
    best = min(fits, key=lambda c: (round(c.iteration_us, 3), c.peak_bytes))
    return MemoryFit(budget_bytes, before, best, tried)
