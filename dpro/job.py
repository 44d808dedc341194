"""The prepared job: a trace opened once, with what every analysis shares computed once.

    job = dpro.open("traces/")          # load (gTrace or torch.profiler), validate, align clocks
    r = job.replay()                    # ReplayResult: predicted vs measured, breakdown, critical path
    pd.DataFrame(r.critical_path_rows())
    best = job.optimize(budget_s=20)    # OptimizeResult

A :class:`Job` keeps the trace on one clock, the profiled steps the analyses use, each
worker's op statistics and each replay it has run, so that ``dpro replay`` (with the
prediction without the profiling overhead) and ``dpro optimize`` build on the same
prepared pieces instead of re-deriving them (docs/api.md, docs/architecture.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from dpro.gtrace.schema import GTrace

if TYPE_CHECKING:
    from dpro.alignment import AlignOptions, AlignResult
    from dpro.executor import Mapper
    from dpro.optimizer.optimize import OptimizeResult
    from dpro.graph.stats import OpStats
    from dpro.optimizer.passes.base import GraphPass
    from dpro.progress import Tick
    from dpro.graph.overhead import Overhead
    from dpro.replayer.replay import ReplayResult

log = logging.getLogger(__name__)


@dataclass
class Job:
    """A profiled job ready for analysis (open one with ``dpro.open``: :func:`open_job`)."""

    #: the trace as loaded (each node on its own clock)
    profiled: GTrace
    #: the trace on one clock (``profiled`` itself when nothing needed aligning)
    trace: GTrace
    #: the clock alignment done on opening (None: opened with ``align=False``)
    alignment: AlignResult | None = None
    #: where it was opened from
    path: Path | None = None
    #: progress bars on stderr for the long stages (None: when stderr is a terminal)
    progress: bool | None = field(default=None, repr=False)
    _replays: dict[tuple[bool, bool], ReplayResult] = field(default_factory=dict, repr=False)

    @cached_property
    def steps(self) -> list[int]:
        """The profiled steps every analysis averages over (stalls and outliers dropped)."""
        from dpro.graph.stats import typical_steps

        return typical_steps(list(self.trace.nodes.values()), self.trace.manifest.steps)

    @cached_property
    def stats(self) -> dict[str, dict[str, OpStats]]:
        """Every node's op statistics over :attr:`steps`: ``{node: {op: OpStats}}`` (own
        time, host gap, offset in the step, the samples)."""
        from dpro.graph.stats import node_stats
        from dpro.progress import progress_bar

        steps = self.steps or self.trace.manifest.steps or None
        out = {}
        with progress_bar(len(self.trace.nodes), "op statistics", enabled=self.progress) as tick:
            for name, nt in self.trace.nodes.items():
                out[name] = node_stats(nt, steps)
                tick(name)
        return out

    @cached_property
    def profiling_overhead(self) -> Overhead | None:
        """The overhead dpro's recorder measured (median over the workers), if it did."""
        from dpro.graph.overhead import job_overhead

        return job_overhead(self.trace.workers())

    def replay(self, *, expand_collectives: bool = True) -> ReplayResult:
        """Predict one iteration: predicted vs measured, breakdown, critical path, peak
        memory per worker and, where the recorder measured its own overhead, the
        prediction without it. Computed once per setting."""
        key = (expand_collectives, False)
        if key not in self._replays:
            from dpro.replayer.memory import peak_memory

            res = self._replay(expand_collectives, remove_overhead=False)
            res.memory = peak_memory(self.trace, res)
            ov = res.profiling_overhead = self.profiling_overhead
            if ov is not None and ov.factor != 1.0:
                res.predicted_unprofiled_iteration_us = self._replay(
                    expand_collectives, remove_overhead=True).predicted_iteration_us
            self._replays[key] = res
        return self._replays[key]

    def _replay(self, expand_collectives: bool, *, remove_overhead: bool) -> ReplayResult:
        from dpro.graph.global_dfg import BuildOptions
        from dpro.replayer.replay import replay_on_one_clock

        opts = BuildOptions(expand_collectives=expand_collectives, steps=list(self.steps), remove_overhead=remove_overhead)
        return replay_on_one_clock(self.trace, opts, alignment=self.alignment, stats=self.stats)

    def optimize(self, *, passes: list[GraphPass] | None = None, budget_s: float = 30.0,
                 memory_budget: int | None = None, memory_passes: list[GraphPass] | None = None,
                 micro_trace: Job | GTrace | None = None, tick: Tick | None = None,
                 mapper: Mapper | None = None) -> OptimizeResult:
        """Search a faster strategy (docs/optimizer.md): ``passes`` (default: every
        throughput pass), ``memory_budget`` (bytes per worker) to fit first,
        ``micro_trace`` the same job profiled at a smaller batch, ``mapper`` where the
        candidates are replayed (:mod:`dpro.executor`: a process pool, Ray)."""
        from dpro.optimizer.optimize import optimize

        small = micro_trace.profiled if isinstance(micro_trace, Job) else micro_trace
        kw = {"tick": tick} if tick is not None else {}
        if mapper is not None:
            kw["mapper"] = mapper
        return optimize(self.trace, base=self.replay(), stats=self.stats, passes=passes, budget_s=budget_s,
                        memory_budget=memory_budget, memory_passes=memory_passes, micro_trace=small, **kw)


def open_job(path: str | Path, *, rank_pattern: str | None = None, align: bool | AlignOptions = True,
             cache: bool | None = None, progress: bool | None = None, mapper=None) -> Job:
    """Open the job traced in ``path`` (a gTrace directory, torch.profiler traces, one file
    per rank): load and validate it, and with ``align`` (True or the
    :class:`~dpro.alignment.AlignOptions` to use) put every node on one clock.

    ``rank_pattern``: regex whose first group is the rank in a trace file name (for traces
    without ``distributedInfo``). ``cache``: use the trace cache for an import
    (:mod:`dpro.gtrace.cache`; default: on unless ``DPRO_NO_CACHE``). ``progress``: bars
    on stderr for the import, the alignment and the op statistics (default: when stderr
    is a terminal; False for ``--json``). ``mapper(fn, items)``: how the ranks of an import
    run (:func:`dpro.importers.kineto.import_kineto`). Bad input raises :class:`dpro.errors.DproInputError`.
    """
    from dpro.importers.kineto.read import DEFAULT_RANK_PATTERN
    from dpro.loader import open_trace

    gt = open_trace(path, rank_pattern or DEFAULT_RANK_PATTERN, cache=cache, progress=progress, mapper=mapper)
    return prepare(gt, align=align, path=Path(path), progress=progress)


def prepare(gt: GTrace, *, align: bool | AlignOptions = True, path: Path | None = None,
            progress: bool | None = None) -> Job:
    """A :class:`Job` of a trace already in memory (see :func:`open_job`)."""
    if align is False:
        return Job(profiled=gt, trace=gt, path=path, progress=progress)
    from dpro.alignment import on_one_clock
    from dpro.errors import DproInputError
    from dpro.progress import progress_pulse

    try:
        with progress_pulse("aligning clocks", enabled=progress) as tick:
            tick(f"{len(gt.nodes)} nodes")
            trace, alignment = on_one_clock(gt, None if align is True else align)
    except ValueError as e:  # e.g. an unknown reference node
        raise DproInputError(path or gt.source or "trace", str(e)) from None
    return Job(profiled=gt, trace=trace, alignment=alignment, path=path, progress=progress)


@dataclass(frozen=True)
class CachedResult:
    """Where one analysis's result of one unchanged input is cached (:func:`result_cache`):
    the exact bytes printed (:mod:`dpro.resultcache`)."""

    store: object  # dpro.resultcache.ResultStore
    key: str

    def load(self) -> bytes | None:
        """The bytes stored, or None (none, or a damaged entry: logged)."""
        try:
            data = self.store.load(self.key)  # type: ignore[attr-defined]
        except (OSError, ValueError) as e:
            log.warning("cached result unusable (%s): computing again", e)
            return None
        if data is not None:
            log.info("result cache: loaded %s", self.store.file(self.key))  # type: ignore[attr-defined]
        return data

    def save(self, result: dict) -> bytes:
        """Store ``result`` as :func:`dpro.jsonio.print_json` prints it; return those bytes.
        A failure to store is logged, not raised."""
        from dpro.jsonio import json_bytes

        data = json_bytes(result)
        try:
            self.store.save(self.key, data)  # type: ignore[attr-defined]
        except OSError as e:
            log.warning("result cache: cannot store %s (%s)", self.key, e)
        return data


def result_cache(path: str | Path, what: str, options: dict, *, rank_pattern: str | None = None,
                 cache: bool | None = None) -> CachedResult | None:
    """The cache entry of the result ``what`` (e.g. ``"replay"``, as JSON) of the
    torch.profiler traces in ``path`` computed with ``options``, or None where there is none
    (cache off, ``path`` not such traces, or not readable: the analysis says why).

    Its key (:func:`dpro.resultcache.result_key`, which the ``dpro`` entry's fast path also
    uses) covers the files (resolved path, size and ``mtime_ns`` of each), the rank pattern,
    ``options``, the read options (``--max-input-bytes``, ``--allow-missing-ranks``),
    ``DPRO_ENGINE`` and dpro's and its libraries' installed files: a changed file, option
    or dpro gets a new key. Cheap: nothing is imported or read but the files' metadata.
    """
    import os
    from dataclasses import asdict

    from dpro import resultcache as rc
    from dpro.importers.kineto.read import DEFAULT_RANK_PATTERN
    from dpro.jsonio import current_read_options

    if not (rc.enabled_by_default() if cache is None else cache) or not os.path.exists(path):
        return None
    root = rc.default_dir()
    if rc.inside(root, path):
        return None
    key = rc.result_key(path, what, options, rank_pattern=rank_pattern or DEFAULT_RANK_PATTERN,
                        read=asdict(current_read_options()), engine=os.environ.get("DPRO_ENGINE", ""))
    return CachedResult(rc.ResultStore(root), key) if key is not None else None
