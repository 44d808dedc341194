"""Horovod inside a recorded job: the timeline `dpro profile` asks for (dynamic, so that only
the profiling window is written) and the fusion settings the job runs with. The recorders
(:mod:`dpro.profiler.pytorch.backend`, :mod:`dpro.profiler.tensorflow.backend`) call these;
:mod:`dpro.importers.horovod.atoms` reads what they left."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from dpro.contracts.recording import ENV_HOROVOD_TIMELINE, HOROVOD_TIMELINE_DYNAMIC, TIMELINE_NAME

log = logging.getLogger(__name__)

#: Horovod's fusion settings; a rank's meta records those set (``horovod_settings``): none set
#: means the job ran with Horovod's default fusion, so its own grouping is that default
SETTINGS_ENV = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_AUTOTUNE")


def settings_from_env() -> dict[str, str]:
    """Horovod's fusion settings this process runs with (the environment variables set)."""
    return {k: os.environ[k] for k in SETTINGS_ENV if k in os.environ}


def start_dynamic_timeline(module: str, out_dir: Path) -> Any | None:
    """Start Horovod's timeline for the profiling window when `dpro profile` made it dynamic.

    ``HOROVOD_TIMELINE=DYNAMIC`` (what `dpro profile` sets): every rank calls
    ``start_timeline``, rank 0 writes it. ``module`` is the Horovod binding the job imported
    (``horovod.torch``, ``horovod.tensorflow``). Returns it, to stop the timeline with, or
    None. Outside the window Horovod then records nothing (a timeline for the whole run
    costs ~14 % per step here).
    """
    if os.environ.get(ENV_HOROVOD_TIMELINE) != HOROVOD_TIMELINE_DYNAMIC:
        return None
    hvd = sys.modules.get(module)
    if hvd is None:
        return None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        hvd.start_timeline(str(out_dir.resolve() / TIMELINE_NAME), mark_cycles=False)
    except Exception as e:  # noqa: BLE001 - profiling must never break training
        log.warning("dpro: cannot start Horovod's timeline (%s): collectives will not be modelled", e)
        return None
    return hvd


def stop_dynamic_timeline(hvd: Any | None) -> None:
    """Stop what :func:`start_dynamic_timeline` started (None: nothing to stop)."""
    if hvd is None:
        return
    try:
        hvd.stop_timeline()
    except Exception as e:  # noqa: BLE001 - profiling must never break training
        log.warning("dpro: cannot stop Horovod's timeline: %s", e)
