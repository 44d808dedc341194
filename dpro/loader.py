"""Open whatever the user points at: a gTrace directory or torch.profiler traces."""

from __future__ import annotations

from pathlib import Path

from dpro.errors import DproInputError
from dpro.gtrace.io import is_gtrace, load_gtrace
from dpro.gtrace.schema import GTrace
from dpro.importers.kineto.read import DEFAULT_RANK_PATTERN
from dpro.jsonio import regular_file_problem


def open_trace(path: str | Path, rank_pattern: str = DEFAULT_RANK_PATTERN) -> GTrace:
    """Load ``path`` as gTrace if it has a manifest, else import it as Kineto traces.

    Either way the result has passed the gTrace checks (dpro.gtrace.validate).
    """
    from dpro.gtrace.validate import validate
    from dpro.importers.kineto import import_kineto, is_kineto_path

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
        gt = import_kineto(p, rank_pattern)
        validate(gt)
        return gt
    raise DproInputError(p, "neither a gTrace directory (manifest.json) nor torch.profiler traces (*.json[.gz])")
