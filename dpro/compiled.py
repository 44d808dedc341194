"""The project's optional compiled modules (C, built by setup.py), loaded once per process."""

from __future__ import annotations

import functools
import importlib
from types import ModuleType


@functools.cache
def load_compiled(name: str) -> ModuleType | str:
    """The compiled module ``name``, or why it cannot be loaded ("not built (...)"): the
    caller then runs its Python reference and says so in one line."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        return f"not built ({e})"
