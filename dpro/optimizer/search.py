"""Algorithm 1: walk the critical path, apply the passes whose rule holds, replay, repeat.

Each round replays the current strategy (:func:`dpro.optimizer.evaluate.analyse`), asks
every pass for candidates near the critical path (op fusion on computation-bound parts,
tensor fusion / partition on communication-bound parts, each justified by its theorem),
tries them by decreasing estimated gain, and keeps the first that
makes the iteration faster. It stops when no candidate helps (converged) or the time
budget is spent. The search runs from the job's own grouping, from no fusion at all
(the paper's starting point) and from the library defaults it is compared with, and
keeps the fastest result; it is deterministic.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field

from dpro.executor import Mapper, serial
from dpro.optimizer.evaluate import analyse, iteration_us
from dpro.optimizer.job_model import JobModel
from dpro.optimizer.passes.base import Candidate, GraphPass, PassContext
from dpro.optimizer.strategy import Strategy
from dpro.progress import Tick, _noop

log = logging.getLogger(__name__)

#: a change must save at least this much (µs) and this fraction of the iteration to be kept:
#: smaller gains are within replay noise and not worth a change to the job
MIN_GAIN_US = 0.5
MIN_GAIN_FRACTION = 1e-3


@dataclass
class Step:
    """One accepted change."""

    pass_name: str
    reason: str
    before_us: float
    after_us: float

    def to_json(self) -> dict:
        return {"pass": self.pass_name, "reason": self.reason, "before_us": self.before_us, "after_us": self.after_us}


@dataclass
class SearchResult:
    """One descent of Algorithm 1: where it started, the strategy it reached and its time."""

    start: str
    strategy: Strategy
    iteration_us: float
    steps: list[Step] = field(default_factory=list)
    evaluations: int = 0
    converged: bool = False
    time_s: float = 0.0


def _descend(model: JobModel, start: Strategy, name: str, passes: list[GraphPass], deadline: float,
             max_tries: int, tick: Tick, coarsen: bool, mapper: Mapper = serial) -> SearchResult:
    t0 = time.perf_counter()
    st, cur = start, iteration_us(model, start, coarsen=coarsen)
    res = SearchResult(name, st, cur, evaluations=1)
    seen = {st.key()}
    by_name = {p.name: p for p in passes}
    while time.perf_counter() < deadline:
        ctx = PassContext(model, st, analyse(model, st))
        cands: list[Candidate] = [c for p in passes for c in p.candidates(ctx)]
        cands.sort(key=lambda c: (-c.est_gain_us, c.pass_name, repr(c.target)))
        tries: list[tuple[Candidate, Strategy]] = []
        keys: set = set()
        for c in cands[:max_tries]:
            nxt = by_name[c.pass_name].apply(ctx, c)
            if nxt.key() not in seen and nxt.key() not in keys:
                keys.add(nxt.key())
                tries.append((c, nxt))
        # serial: lazy, replayed one by one as below; a pool or Ray: all at once. Either way
        # the first that helps, in this order, is kept (the result does not depend on it)
        times = iter(mapper(functools.partial(iteration_us, model, coarsen=coarsen), [n for _, n in tries]))
        accepted = False
        for c, nxt in tries:
            if time.perf_counter() >= deadline:
                break
            seen.add(nxt.key())
            t = next(times)
            res.evaluations += 1
            if t < cur - max(MIN_GAIN_US, MIN_GAIN_FRACTION * cur):
                res.steps.append(Step(c.pass_name, c.reason, cur, t))
                st, cur, accepted = nxt, t, True
                tick(f"{name}: {cur / 1e3:.2f} ms")
                break
        if hasattr(times, "close"):
            times.close()  # a Ray mapper cancels the candidates not looked at
        if not accepted:
            res.converged = time.perf_counter() < deadline
            break
    res.strategy, res.iteration_us, res.time_s = st, cur, time.perf_counter() - t0
    return res


def search(model: JobModel, passes: list[GraphPass], *, budget_s: float = 30.0, max_tries: int = 8,
           tick: Tick = _noop, coarsen: bool = False, memory: Strategy | None = None,
           extra_starts: dict[str, Strategy] | None = None, mapper: Mapper = serial) -> list[SearchResult]:
    """Run Algorithm 1 from the job's grouping, from no fusion and from each of
    ``extra_starts`` (the baselines: so the result is never predicted slower than one of
    them); fastest result first.

    ``memory``: a strategy whose memory settings (recomputation, accumulation) every
    start keeps (the memory step's choice).

    ``coarsen=True`` replays candidates on the coarsened view (benchmarks/search_speed.py: it
    does not pay on a ResNet-50-sized job, whose graph is mostly ring steps).

    ``mapper`` (:mod:`dpro.executor`) replays each round's candidates: :func:`~dpro.executor.serial`
    (default) one by one until one helps; a process pool or Ray all of a round's at once
    (more replays, less wall time). The result is the same."""
    starts = [
        ("job's own grouping", Strategy.as_profiled(model)),
        ("no fusion", Strategy.from_groups([[i] for i in range(len(model.units))])),
    ]
    starts += list((extra_starts or {}).items())
    if memory is not None:
        starts = [(n, st.with_memory(memory.recompute, memory.accum)) for n, st in starts]
    seen: set = set()
    starts = [(n, st) for n, st in starts if not (st.key() in seen or seen.add(st.key()))]
    deadline_total = time.perf_counter() + budget_s
    out = []
    for i, (name, st) in enumerate(starts):
        # split what is left of the budget among the remaining starts
        left = deadline_total - time.perf_counter()
        out.append(_descend(model, st, name, passes, time.perf_counter() + left / (len(starts) - i), max_tries, tick,
                            coarsen, mapper))
    out.sort(key=lambda r: r.iteration_us)
    return out
