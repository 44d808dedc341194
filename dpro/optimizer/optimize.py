"""`dpro optimize` end to end: model the job, replay baselines, search, realise per library."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from dpro.contracts import strategy_files as sf
from dpro.executor import Mapper, serial
from dpro.graph.comm_model import LinkCost
from dpro.graph.global_dfg import BuildOptions
from dpro.graph.stats import OpStats, node_stats
from dpro.gtrace.schema import GTrace
from dpro.optimizer import libraries as lib
from dpro.optimizer.evaluate import analyse, iteration_us
from dpro.optimizer.job_model import JobModel, job_model
from dpro.optimizer.memory.fit import MemoryFit, evaluate_memory, fit_memory
from dpro.optimizer.passes.base import GraphPass
from dpro.optimizer.passes.registry import default_registry
from dpro.optimizer.ps import bound_search
from dpro.optimizer.search import SearchResult, search
from dpro.optimizer.strategy import OpScale, Strategy
from dpro.optimizer.xla import xla_fusion, xla_strategy
from dpro.progress import Tick, _noop
from dpro.replayer.replay import ReplayResult

log = logging.getLogger(__name__)


@dataclass
class Realized:
    """A strategy expressed in one library's settings, and its own predicted time."""

    library: str
    settings: dict
    strategy: Strategy
    iteration_us: float


@dataclass
class OptimizeResult:
    """What `dpro optimize` found: the model, the baselines, the search results (best
    first), their realisation per library, and the notes for the user."""

    model: JobModel
    replay_us: float
    measured_us: float | None
    baselines: dict[str, float]
    results: list[SearchResult]
    realized: list[Realized] = field(default_factory=list)
    critical_before: list[dict] = field(default_factory=list)
    critical_after: list[dict] = field(default_factory=list)
    time_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    #: the memory step (with ``--memory-budget``)
    memory: MemoryFit | None = None
    #: predicted peak memory of the representative worker: as profiled, with the best strategy
    peak_before_bytes: int | None = None
    peak_after_bytes: int | None = None

    @property
    def best(self) -> SearchResult:
        return self.results[0]

    @property
    def baseline_us(self) -> float:
        return self.baselines["job as profiled"]

    def to_json(self) -> dict:
        """The `dpro optimize --json` object."""
        m = self.model
        b = self.best
        return {
            "replay_predicted_us": self.replay_us,
            "measured_us": self.measured_us,
            "baseline_us": self.baseline_us,
            "best_us": b.iteration_us,
            "speedup": self.baseline_us / b.iteration_us if b.iteration_us > 0 else None,
            "baselines_us": self.baselines,
            "best": {"start": b.start, "steps": [s.to_json() for s in b.steps], "strategy": b.strategy.to_json(m),
                     "evaluations": sum(r.evaluations for r in self.results), "converged": b.converged},
            "realized": [{"library": r.library, "settings": r.settings, "iteration_us": r.iteration_us} for r in self.realized],
            "critical_path_before": self.critical_before,
            "critical_path_after": self.critical_after,
            "model": {"units": len(m.units), "ops": len(m.ops), "world_size": m.world_size, "scheme": m.scheme,
                      "library": m.library, "link_alpha_us": m.link.alpha, "link_beta_us_per_byte": m.link.beta},
            "memory": {"peak_before_bytes": self.peak_before_bytes, "peak_after_bytes": self.peak_after_bytes,
                       **(self.memory.to_json() if self.memory is not None else {})},
            "time_s": self.time_s,
            "notes": self.notes,
        }


def _critical(model: JobModel, st: Strategy, top: int = 10) -> list[dict]:
    a = analyse(model, st)
    g, s = a.built.graph, a.schedule
    rows = [{"name": g.names[i], "device": g.devices[g.device[i]], "start_us": float(s.start[i]),
             "dur_us": float(s.end[i] - s.start[i])} for i in a.critical]
    return sorted(rows, key=lambda r: -r["dur_us"])[:top]


def _unit_ready_times(model: JobModel) -> list[float]:
    a = analyse(model, Strategy.from_groups([[i] for i in range(len(model.units))]))
    end = {o: float(a.schedule.end[i]) for o, i in a.built.node_of_op.items()}
    return [max((end[r] for r in u.ready), default=0.0) for u in model.units]


HOROVOD_BASELINE = "Horovod default (64 MiB, 1 ms cycle)"
#: the TF baseline (and the only op fusion dpro applies on TF): dpro.optimizer.xla
XLA_BASELINE = "XLA of forward+backward (measured)"


def horovod_default(model: JobModel) -> Strategy:
    """The groups Horovod's defaults form in this job: the job's own where it ran with them
    (a simulation that differed from what Horovod did once made dpro write explicit groups
    for a predicted 3.6 % gain that measured 7.6 % slower: TF transformer, 200 Mbit/s);
    else simulated, each fused buffer running for its ring cost on the fitted link and the
    tensors ready meanwhile waiting for the next cycle."""
    if model.horovod_defaults_profiled:
        return Strategy.as_profiled(model)
    return Strategy.from_groups(lib.horovod_cycle_groups(_unit_ready_times(model), [u.bytes for u in model.units],
                                                   busy_us=model.ring_us))


def baselines(model: JobModel) -> dict[str, Strategy]:
    """The strategies to beat: the job as profiled, no fusion, fuse everything, library defaults."""
    if model.ps is not None:
        return bound_search.bound_baselines(model)
    n = len(model.units)
    out = {
        "job as profiled": Strategy.as_profiled(model),
        "no fusion": Strategy.from_groups([[i] for i in range(n)]),
        "fuse everything": Strategy.from_groups([list(range(n))]),
    }
    if model.framework == "pytorch" and model.library in ("gloo", "nccl") and all(u.params for u in model.units):
        out["DDP default (25 MiB buckets)"] = ddp_strategy(model, None)
    if model.library == "horovod" or model.scheme == "allreduce":
        out[HOROVOD_BASELINE] = horovod_default(model)
    if model.framework == "pytorch" and model.compile and "" in model.compile:
        out["torch.compile of the whole model (measured)"] = compiled_model_strategy(model)
    xla = xla_strategy(model)
    if xla is not None:
        out[XLA_BASELINE] = xla
    return out


def compiled_model_strategy(model: JobModel) -> Strategy:
    """The job with the whole model under ``torch.compile``: every forward/backward op's time
    (own + host gap) × the compiled / eager ratio the recorder measured for the model."""
    m = model.compile[""]  # type: ignore[index]
    f = m["compiled_us"] / m["eager_us"]
    scales = tuple(OpScale(o.id, max(0.0, (f * (o.dur + o.gap) - o.gap) / o.dur))
                   for o in model.ops.values() if o.cat in ("FW", "BW") and o.dur > 0)
    return Strategy.as_profiled(model).with_scales(scales)


def ddp_strategy(model: JobModel, bucket_cap_mb: float | None) -> Strategy:
    """The buckets DDP forms with ``bucket_cap_mb`` (None: DDP's default, 1 MiB then 25 MiB)."""
    sizes = [u.bytes for u in model.units]
    if bucket_cap_mb is None:
        return Strategy.from_groups(lib.ddp_buckets(sizes, lib.DDP_DEFAULT_CAP_BYTES, lib.DDP_FIRST_BUCKET_BYTES))
    return Strategy.from_groups(lib.ddp_buckets(sizes, int(bucket_cap_mb * lib.MiB)))


#: a library's own default is kept unless dpro's setting is predicted this much faster
#: (a change that the model cannot tell from the default is not worth making)
MIN_GAIN = 0.01


def realize(model: JobModel, best: Strategy, bl: dict[str, Strategy] | None = None) -> list[Realized]:
    """Express ``best`` in the settings of the libraries that can run it; where it is not
    predicted ``MIN_GAIN`` faster than the library's default, keep the default.
    ``bl``: :func:`baselines` of ``model``, where the caller has them already."""
    bl = bl or {}
    out: list[Realized] = []
    sizes = [u.bytes for u in model.units]
    # Library settings change the synchronisation only: op fusion is applied (and predicted) apart;
    # the memory settings (recomputation, accumulation) stay. XLA on TF stays too: it decides
    # when the gradients are ready, and Horovod's default is then the one under XLA.
    xf = xla_fusion(model, best)
    best = Strategy(best.groups, best.partitions, (xf,) if xf else (), recompute=best.recompute, accum=best.accum)
    if model.framework == "pytorch" and all(u.params for u in model.units):
        # DDP takes a size cap, not explicit groups: try the caps that give distinct bucketings.
        total = sum(sizes)
        caps = sorted({int(c) for c in np.geomspace(max(1, min(sizes)), max(total, 2), 96)} | {lib.DDP_DEFAULT_CAP_BYTES})
        seen, best_r = set(), None
        for cap in reversed(caps):  # largest first: on a tie, fewer buckets
            groups = lib.ddp_buckets(sizes, cap)
            key = tuple(map(tuple, groups))
            if key in seen:
                continue
            seen.add(key)
            st = Strategy(tuple(tuple(g) for g in groups), (1,) * len(groups), recompute=best.recompute, accum=best.accum)
            t = iteration_us(model, st)
            if best_r is None or t < best_r.iteration_us * (1 - 1e-3):
                best_r = Realized("pytorch-ddp", {sf.BUCKET_CAP_MB: cap / lib.MiB, "bucket_cap_bytes": cap,
                                                  "buckets": [[model.units[u].name for u in g] for g in groups]}, st, t)
        default = ddp_strategy(model, None).with_memory(best.recompute, best.accum)
        t_default = iteration_us(model, default)
        if best_r is not None and best_r.iteration_us > t_default * (1 - MIN_GAIN):
            best_r = Realized("pytorch-ddp", {
                sf.BUCKET_CAP_MB: None, sf.KEEP_DEFAULT: True,
                "buckets": [[model.units[u].name for u in g] for g in default.groups]}, default, t_default)
        if best_r is not None:
            out.append(best_r)
    if model.library == "horovod" or (model.framework == "pytorch" and all(u.params for u in model.units)):
        default = bl.get(XLA_BASELINE if xf else HOROVOD_BASELINE) or (xla_strategy(model) if xf else horovod_default(model))
        default = default.with_memory(best.recompute, best.accum)
        t_best, t_default = iteration_us(model, best), iteration_us(model, default)
        if t_best > t_default * (1 - MIN_GAIN) or more_horovod_collectives(model, default, best) > 0:
            out.append(Realized("horovod", {
                sf.GROUPS: None, sf.KEEP_DEFAULT: True, sf.HOROVOD_FUSION_THRESHOLD: lib.HOROVOD_DEFAULT_THRESHOLD,
                sf.HOROVOD_CYCLE_TIME: lib.HOROVOD_DEFAULT_CYCLE_US / 1e3}, default, t_default))
        else:
            groups = [[model.units[u].name for u in g] for g in best.groups]
            thr = max(best.group_bytes(model, i) for i in range(len(best.groups)))
            out.append(Realized("horovod", {
                sf.GROUPS: groups, sf.HOROVOD_FUSION_THRESHOLD: int(thr),
                sf.HOROVOD_CYCLE_TIME: lib.HOROVOD_DEFAULT_CYCLE_US / 1e3}, best, t_best))
    if model.ps is not None:
        bound = bound_search.bound_of(model, best)
        default = bound_search.with_bound(model, lib.MXNET_DEFAULT_BOUND)
        t_best, t_default = iteration_us(model, best), iteration_us(model, default)
        if bound is None or t_best > t_default * (1 - MIN_GAIN):
            out.append(Realized(bound_search.LIBRARY, {bound_search.ENV: lib.MXNET_DEFAULT_BOUND, sf.KEEP_DEFAULT: True},
                                default, t_default))
        else:
            out.append(Realized(bound_search.LIBRARY, {bound_search.ENV: bound, "split": [
                model.units[g[0]].name for g, k in zip(best.groups, best.partitions) if k > 1]}, best, t_best))
    return out


def representative(gt: GTrace, r: ReplayResult, stats: dict[str, dict[str, OpStats]] | None = None) -> JobModel:
    """The one-worker model whose worker best stands for all.

    A synchronous job runs at its slowest worker's pace, but not at the pace of that worker
    alone: its peers start their collectives earlier and their first ring steps overlap its
    computation, which the full replay (every worker, every link) reproduces and the
    one-worker model cannot. So the slowest, the fastest and the median worker by
    computation are tried, and the one whose model of the job as profiled is closest to the
    full replay (both without the profiling overhead) stands for all. ``stats``: the
    workers' op statistics over ``r.steps``, where the caller has them (:func:`job_model`)."""
    link, steps = r.build.link_cost, r.steps
    if stats is None:
        stats = {name: node_stats(nt, steps) for name, nt in gt.nodes.items() if nt.info.role == "worker"}
    first = job_model(gt, link, steps, stats=stats)
    if len(first.loads) < 2:
        return first
    loads = sorted((v, k) for k, v in first.loads.items())
    picks = dict.fromkeys([loads[-1][1], loads[0][1], loads[len(loads) // 2][1]])
    best, best_gap = first, None
    for name in picks:
        m = first if name == first.worker else job_model(gt, link, steps, worker=name, stats=stats)
        ov = m.overhead
        expect = r.predicted_iteration_us * (ov.factor if ov else 1.0)
        gap = abs(iteration_us(m, Strategy.as_profiled(m)) - expect)
        if best_gap is None or gap < best_gap - 1e-6:
            best, best_gap = m, gap
    return best


def _keep_graph_unless_xla_gains(model: JobModel, results: list[SearchResult]) -> list[SearchResult]:
    """``results`` with the best one without XLA first unless the best with XLA is predicted
    ``MIN_GAIN`` faster: compiling the job is a change worth making only for a real gain."""
    best = results[0]
    if xla_fusion(model, best.strategy) is None:
        return results
    plain = next((r for r in results if xla_fusion(model, r.strategy) is None), None)
    if plain is None or best.iteration_us < plain.iteration_us * (1 - MIN_GAIN):
        return results
    return [plain] + [r for r in results if r is not plain]


def more_horovod_collectives(model: JobModel, default: Strategy, best: Strategy) -> int:
    """How many more collectives per step ``best`` sends than Horovod's ``default`` on a
    Horovod job (0 otherwise). Their cost is not in the model (the link's latency is only
    the least the fused collectives allow: :func:`dpro.optimizer.horovod.link_cost`), and
    every such setting measured slower than predicted: no fusion 1-43 %, and on the TF
    transformer a 9-group split of a job that ran 2-5 groups per step was predicted 4.3 %
    faster and ran 4.8 % slower. So a Horovod default is not traded for more collectives."""
    if model.library != "horovod":
        return 0
    return sum(best.partitions) - sum(default.partitions)


def latency_note(link: LinkCost, start: Strategy, best: Strategy, *, horovod: bool = False) -> list[str]:
    """A warning when ``best`` sends more messages per step than ``start`` and the link's
    per-message latency was not measurable (one collective shape in the profile) or, for
    Horovod, is only the uncontended lower bound (:func:`dpro.optimizer.horovod.link_cost`)."""
    more = sum(best.partitions) - sum(start.partitions)
    if more <= 0 or (link.latency_known and not horovod):
        return []
    why = ("Horovod's per-collective latency is taken as the least its fused collectives allow "
           f"({link.alpha:.0f} us per ring step; no fusion on TF jobs measured 13-43 % slower than so predicted), "
           f"so Horovod's default is kept ({sf.HOROVOD_JSON})"
           if link.latency_known else
           "every collective in the profile has the same shape, so the link's per-message latency could not be "
           "measured and is taken as 0")
    return [f"{why}; the best strategy found sends {more} more message(s) per step than the job, "
            f"so its predicted gain is an upper bound (docs/optimizer.md, Limits)"]


def optimize(gt: GTrace, *, base: ReplayResult | None = None, stats: dict[str, dict[str, OpStats]] | None = None,
             passes: list[GraphPass] | None = None, budget_s: float = 30.0, align_clocks: bool = True,
             memory_budget: int | None = None, memory_passes: list[GraphPass] | None = None,
             micro_trace: GTrace | None = None, tick: Tick = _noop, mapper: Mapper = serial) -> OptimizeResult:
    """Search a faster strategy for the profiled job ``gt``.

    ``base``: the replay of ``gt`` where the caller has it (``gt`` then already on one
    clock): ``gt`` is neither aligned (``align_clocks``) nor replayed again. ``stats``: the
    workers' op statistics over ``base.steps`` (``{node name: node_stats(nt, steps)}``),
    where the caller has them; computed once here otherwise. ``passes``: the throughput
    passes to search with (default: the default registry's, built here only then).
    With ``memory_budget`` (bytes) the job is first made to fit (Algorithm 1, step 1:
    :func:`dpro.optimizer.memory.fit.fit_memory` with ``memory_passes``, default every
    ``kind = "memory"`` pass); the throughput search keeps those memory settings.
    Raises :class:`~dpro.optimizer.memory.fit.CannotFit` when nothing fits.
    ``micro_trace``: the same job profiled at a smaller batch, for the micro-batch op
    times of gradient accumulation (:mod:`dpro.optimizer.memory.micro_batch`). ``mapper``
    (:mod:`dpro.executor`): where the search replays its candidates (a process pool, Ray)."""
    t0 = time.perf_counter()
    r = base
    if r is None:
        from dpro.replayer.replay import replay

        if align_clocks:
            from dpro.alignment import on_one_clock

            gt, _ = on_one_clock(gt)
        r = replay(gt, BuildOptions(), align_clocks=False)
    if stats is None:
        stats = {name: node_stats(nt, r.steps) for name, nt in gt.nodes.items() if nt.info.role == "worker"}
    model = representative(gt, r, stats)
    if micro_trace is not None:
        from dpro.optimizer.memory.micro_batch import attach_micro_trace

        model.notes += attach_micro_trace(model, gt, micro_trace)
    reg = None
    if passes is None:
        reg = default_registry()
        passes = [p for p in reg if p.kind == "throughput"]
    passes = [p for p in passes if p.kind != "memory"]
    start = Strategy.as_profiled(model)
    fit = None
    if memory_budget is not None and model.ps is not None:
        model.notes.append("--memory-budget is not searched for parameter-server jobs (only the key split is)")
    elif memory_budget is not None:
        if memory_passes is None:
            memory_passes = [p for p in (reg or default_registry()) if p.kind == "memory"]
        fit = fit_memory(model, int(memory_budget), memory_passes, start, tick=tick)
    mem = fit.chosen.strategy if fit is not None else start
    bl = baselines(model)
    base_us = {name: iteration_us(model, st) for name, st in bl.items()}
    if model.ps is not None:  # MXNet's one setting: searched exhaustively
        results = bound_search.search_bounds(model, tick=tick)
    else:
        results = search(model, passes, budget_s=budget_s, tick=tick, memory=mem, extra_starts=bl, mapper=mapper)
    results = _keep_graph_unless_xla_gains(model, results)
    best = results[0]
    notes = list(model.notes)
    if model.framework == "tensorflow" and model.ps is None and not model.compile:
        notes.append("op fusion on TensorFlow is XLA of the whole gradient computation: profile with "
                     "`dpro profile --measure-compile` to have it measured and weighed (docs/optimizer.md)")
    peak_before = peak_after = None
    if model.memory is not None:
        peak_before = evaluate_memory(model, start).peak_bytes
        peak_after = evaluate_memory(model, best.strategy).peak_bytes
        if fit is not None and peak_after > fit.budget_bytes:
            notes.append("the throughput changes raise the predicted peak above the budget: use the memory step's "
                         "strategy without them")
    if model.library == "horovod":  # measured against what realize() keeps: Horovod's default
        default = bl[XLA_BASELINE if xla_fusion(model, best.strategy) else HOROVOD_BASELINE]
        notes += latency_note(model.link, default, best.strategy, horovod=True)
    else:
        notes += latency_note(model.link, start, best.strategy)
    ov = model.overhead  # the model is of the job unprofiled: compare with the replay scaled alike
    expect = r.predicted_iteration_us * (ov.factor if ov else 1.0)
    gap = 100.0 * (base_us["job as profiled"] - expect) / expect
    if abs(gap) > 2.0:
        notes.append(f"the optimizer's one-worker model differs from the full replay by {gap:+.1f}% on the job as profiled")
    return OptimizeResult(
        model=model, replay_us=r.predicted_iteration_us, measured_us=r.measured_iteration_us, baselines=base_us,
        results=results, realized=realize(model, best.strategy, bl),
        critical_before=_critical(model, start), critical_after=_critical(model, best.strategy),
        time_s=time.perf_counter() - t0, notes=notes, memory=fit, peak_before_bytes=peak_before,
        peak_after_bytes=peak_after,
    )
