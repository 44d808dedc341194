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


#: records Horovod queues per tensor per step, at most: negotiation begin/end, one tick per
#: rank, the operation's begin/end and its activities' (docs/profiling.md)
RECORDS_PER_TENSOR = 12


class WindowTimeline:
    """Horovod's timeline for the profiling window, and its writer thread kept off the CPUs:
    the part the torch and TF recorders share.

    Made when the recorder is (finds the writer, idles and parks it: writer.py); then
    :meth:`start` at the window's start (wakes the writer, starts the dynamic timeline,
    parks the writer again where it holds no lock), :meth:`keep_parked` before every step,
    :meth:`stop` at the window's end (wakes it: ``stop_timeline`` returns once it has written
    the queued records and closed the file; parks it).
    """

    def __init__(self, module: str) -> None:
        from dpro.profiler.horovod.writer import idle_timeline_writer

        self.module = module
        self.writer = idle_timeline_writer(module)
        self._hvd: Any = None

    @property
    def writer_tid(self) -> int | None:
        """Thread id of the writer when it was found (rank 0 of a `dpro profile` job)."""
        return self.writer.tid if self.writer is not None else None

    def keep_parked(self) -> None:
        if self.writer is not None:
            self.writer.keep_parked()

    def start(self, out_dir: Path, steps: int, tensors: int, world: int) -> None:
        """Start the timeline for a window of ``steps`` steps reducing ``tensors`` tensors
        over ``world`` ranks."""
        from dpro.profiler.horovod.writer import QUEUE_RECORDS, idle_timeline_writer

        if self.writer is None:  # the Recorder was made before hvd.init()
            self.writer = idle_timeline_writer(self.module)
        if self.writer is not None:
            self.writer.wake()
        self._hvd = start_dynamic_timeline(self.module, out_dir)
        if self.writer is not None:
            records = steps * max(tensors, 1) * (RECORDS_PER_TENSOR + world)
            if self._hvd is None:
                self.writer.set_normal(False)
                self.writer.park()
            elif records * 4 <= QUEUE_RECORDS:
                self.writer.park_unlocked()  # back at idle priority, parked or not
            else:
                self.writer.set_normal(False)
                log.info("dpro: up to %d timeline records in the window: Horovod's writer stays awake", records)

    def stop(self) -> None:
        """Stop the timeline (it is complete on disk when this returns) and park the writer."""
        if self.writer is not None:
            self.writer.wake()  # at normal priority: the window's records are written now
        stop_dynamic_timeline(self._hvd)  # returns once the writer has closed the file
        if self.writer is not None:
            self.writer.set_normal(False)
            self.writer.park()
        self._hvd = None
