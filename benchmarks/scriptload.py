"""Load a benchmark script as a module from its path: the harnesses share each other's
helpers (benchmarks/ is not a package). Import it with benchmarks/ on ``sys.path``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(name: str, path: Path, *, add_dir: bool = False) -> ModuleType:
    """The script at ``path`` run as module ``name`` (registered in ``sys.modules``);
    ``add_dir``: its folder first on ``sys.path``, for scripts that import their siblings."""
    if add_dir:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
