"""The optimizer for MXNet parameter-server jobs: one setting, searched exhaustively.

MXNet pushes every key apart (no tensor fusion to choose) and splits a key across the
servers when it has at least ``MXNET_KVSTORE_BIGARRAY_BOUND`` elements (tensor partition,
all-or-nothing, by size). Every distinct split is one candidate bound
(:meth:`dpro.optimizer.ps.layout.PsLayout.candidate_bounds`, at most one per key), so all of them
are replayed and the largest bound within 1 % of the fastest is chosen (fewer messages
for what the model cannot tell apart: the same margin MXNet's default must lose by).
"""

from __future__ import annotations

import time

from dpro.contracts import strategy_files as sf
from dpro.optimizer.evaluate import iteration_us
from dpro.optimizer.job_model import JobModel
from dpro.optimizer.libraries import MXNET_DEFAULT_BOUND
from dpro.optimizer.search import SearchResult, Step
from dpro.optimizer.strategy import Strategy
from dpro.progress import Tick, _noop

LIBRARY = "mxnet-kvstore"
ENV = sf.MXNET_KVSTORE_BIGARRAY_BOUND
#: bounds predicted within this fraction of the fastest count as equally fast
SAME_WITHIN = 0.01


def with_bound(model: JobModel, bound: int) -> Strategy:
    """The job as profiled, with every key split as ``bound`` splits it."""
    assert model.ps is not None
    parts = model.ps.partitions(bound)
    st = Strategy.as_profiled(model)
    return Strategy(st.groups, tuple(parts[g[0]] for g in st.groups), st.fusions, st.recompute, st.accum, st.scales)


def bound_of(model: JobModel, st: Strategy) -> int | None:
    """The bound that gives ``st``'s partitions, if one does."""
    for b in (model.ps.candidate_bounds() if model.ps else []):
        if with_bound(model, b).partitions == st.partitions:
            return b
    return None


def bound_baselines(model: JobModel) -> dict[str, Strategy]:
    """The job as profiled, MXNet's default bound, no split, every key split."""
    assert model.ps is not None
    return {
        "job as profiled": Strategy.as_profiled(model),
        "MXNet default (bound 1000000)": with_bound(model, MXNET_DEFAULT_BOUND),
        "no key split": with_bound(model, model.ps.no_split_bound),
        "every key split across all servers": with_bound(model, 1),
    }


def search_bounds(model: JobModel, *, tick: Tick = _noop) -> list[SearchResult]:
    """Replay every distinct bound; the chosen one first."""
    assert model.ps is not None
    t0 = time.perf_counter()
    start = Strategy.as_profiled(model)
    before = iteration_us(model, start)
    tried = []
    for b in model.ps.candidate_bounds():
        tried.append((b, iteration_us(model, with_bound(model, b))))
        tick(f"bound {b}: {tried[-1][1] / 1e3:.2f} ms")
    fastest = min(t for _, t in tried)
    bound, t = max((b, t) for b, t in tried if t <= fastest * (1 + SAME_WITHIN))
    st = with_bound(model, bound)
    split = sum(1 for p in st.partitions if p > 1)
    res = SearchResult(f"each distinct {ENV}", st, t, evaluations=len(tried) + 1, converged=True)
    if st.partitions != start.partitions:
        res.steps.append(Step("tensor_partition", f"{ENV}={bound}: {split} of {len(st.partitions)} keys split across "
                                                  f"{model.ps.servers} servers", before, t))
    res.time_s = time.perf_counter() - t0
    return [res]
