"""Import torch.profiler (Kineto) Chrome traces, one file per rank, into gTrace.

See docs/kineto.md for how the local DFG is derived from the trace.
"""

from __future__ import annotations

from typing import Any

__all__ = ["import_kineto", "is_kineto_path"]


def __getattr__(name: str) -> Any:
    """``import_kineto`` and ``is_kineto_path`` from :mod:`.convert`, imported on first use:
    the CLI imports this package's light ``read`` module at start-up."""
    if name in __all__:
        from dpro.importers.kineto import convert

        return getattr(convert, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
