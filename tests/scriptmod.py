"""Scripts outside the package (benchmarks/, scripts/, tests/data/), loaded as modules by
the tests that exercise them: one loader instead of importlib's three lines in each test."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(name: str, relpath: str) -> ModuleType:
    """The script at ``REPO / relpath``, executed as a fresh module called ``name`` (not
    registered in ``sys.modules``: each call runs it anew)."""
    spec = importlib.util.spec_from_file_location(name, REPO / relpath)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod
