"""Shared by the tests that run real Horovod jobs."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def horovodrun() -> str | None:
    """The horovodrun beside this interpreter, else on PATH."""
    local = Path(sys.executable).parent / "horovodrun"
    return str(local) if local.is_file() else shutil.which("horovodrun")


def horovod_skip_reason() -> str | None:
    """Why real Horovod jobs cannot run here, or None."""
    try:
        import horovod.torch  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        return f"horovod.torch is not importable ({type(e).__name__}: {e}); run scripts/install_horovod.sh"
    if horovodrun() is None:
        return "horovodrun not found next to the python interpreter or on PATH"
    return None
