"""Open whatever the user points at: a gTrace directory or torch.profiler traces."""

from __future__ import annotations

from pathlib import Path

from dpro.errors import DproInputError
from dpro.gtrace.io import is_gtrace, load_gtrace
from dpro.gtrace.schema import GTrace
from dpro.executor import Mapper
from dpro.importers.kineto.read import DEFAULT_RANK_PATTERN
from dpro.jsonio import regular_file_problem


def open_trace(path: str | Path, rank_pattern: str = DEFAULT_RANK_PATTERN, *, cache: bool | None = None,
               progress: bool | None = None, mapper: Mapper | None = None) -> GTrace:
    """Load ``path`` as gTrace if it has a manifest, else import it as Kineto traces.

    Either way the result has passed the gTrace checks (dpro.gtrace.validate). An import
    is kept in the trace cache (:mod:`dpro.gtrace.cache`) and taken from it next time
    while the files are unchanged; ``cache`` False skips it (default: on unless
    ``DPRO_NO_CACHE`` is set). ``progress``: a bar per rank imported, on stderr (default:
    when it is a terminal). ``mapper(fn, items)``: how the ranks are imported (see
    :func:`dpro.importers.kineto.import_kineto`; default: a local process pool for big inputs).
    """
    from dpro.importers.kineto import is_kineto_path

    p = Path(path)
    if not p.exists():
        raise DproInputError(p, "no such file or directory")
    if is_gtrace(p):
        return load_gtrace(p)
    if not p.is_dir() and (problem := regular_file_problem(p)):
        raise DproInputError(p, problem)
    try:
        kineto = is_kineto_path(p)
    except OSError as e:
        raise DproInputError(p, f"cannot read: {e.strerror or e}") from None
    if kineto:
        return _import_cached(p, rank_pattern, cache, progress, mapper)
    raise DproInputError(p, "neither a gTrace directory (manifest.json) nor torch.profiler traces (*.json[.gz])")


def _import_cached(p: Path, rank_pattern: str, cache: bool | None, progress: bool | None,
                   mapper: Mapper | None = None) -> GTrace:
    """``import_kineto`` + validate, through the trace cache."""
    from dpro.gtrace.validate import validate
    from dpro.importers.kineto import import_kineto
    from dpro.importers.kineto.read import trace_files
    from dpro.resultcache import enabled_by_default

    store = None
    if enabled_by_default() if cache is None else cache:  # the cache module (hashlib, ~5 ms) only when used
        from dpro.gtrace.cache import TraceCache, default_dir

        store = TraceCache(default_dir())
    key = None
    if store is not None and store.usable_for(p):
        try:
            key = store.key(trace_files(p), {"importer": "kineto", "rank_pattern": rank_pattern})
        except OSError:
            key = None  # unreadable: the import says why
        if key is not None and (gt := store.load(key)) is not None:
            return gt
    gt = import_kineto(p, rank_pattern, progress=progress, mapper=mapper)
    validate(gt)
    if key is not None:
        store.store(key, gt)
    return gt
