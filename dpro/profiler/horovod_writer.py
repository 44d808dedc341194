"""Horovod's timeline writer thread, and keeping it off the job's CPUs.

Horovod (0.28.1 and earlier) starts a timeline writer thread on the coordinator (rank 0)
as soon as ``HOROVOD_TIMELINE`` is set, ``DYNAMIC`` included (what `dpro profile` sets so
that the recorder can record the window only). The thread polls its record queue in a
loop that only calls ``sched_yield`` (``TimelineWriter::WriterLoop``), for the life of
the job, timeline started or not: it takes a whole core. On the 2-core development VM a
2-worker TF + Horovod convnet ran ~30 % slower for the whole run with
``HOROVOD_TIMELINE=DYNAMIC`` and nothing recorded (docs/fidelity.md).

:func:`idle_timeline_writer` finds that thread and gives it Linux's ``SCHED_IDLE``
policy: it then runs only on otherwise idle CPU time, which is plenty for writing the
window's few thousand records. Finding it: a thread has no name, but the writer is the
only thread that writes the timeline file. A 50 ms probe timeline (cycle markers on) is
started and stopped — stopping returns once the writer has flushed and closed the file —
and the thread whose written-bytes counter (``/proc/self/task/<tid>/io``, ``wchar``) grew
by the file's size is the writer. Only with ``HOROVOD_TIMELINE=DYNAMIC`` (a timeline
file the user asked for is never touched) and on Linux.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PROBE_S = 0.05
#: other threads may write a little (log lines) while the probe runs
SLACK_BYTES = 4096


def thread_wchar() -> dict[int, int]:
    """Bytes each thread of this process has written (``wchar``), by thread id."""
    out: dict[int, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/io") as f:
                for line in f:
                    if line.startswith("wchar:"):
                        out[int(tid)] = int(line.split()[1])
                        break
        except (OSError, ValueError):
            continue
    return out


def writer_thread(before: dict[int, int], after: dict[int, int], size: int) -> int | None:
    """The thread whose ``wchar`` grew by ``size`` bytes (within :data:`SLACK_BYTES`), if one did."""
    if size <= 0:
        return None
    grown = [(after[t] - before.get(t, 0), t) for t in after]
    fits = sorted((d - size, t) for d, t in grown if size <= d <= size + SLACK_BYTES)
    return fits[0][1] if fits else None


def find_timeline_writer(hvd: Any) -> int | None:
    """Thread id of Horovod's timeline writer in this process, or None (not the coordinator,
    no dynamic timeline, or not found)."""
    if os.environ.get("HOROVOD_TIMELINE") != "DYNAMIC" or not sys.platform.startswith("linux"):
        return None
    try:
        if not hvd.is_initialized() or hvd.rank() != 0:
            return None
    except (AttributeError, ValueError):
        return None
    with tempfile.TemporaryDirectory(prefix="dpro-hvd-probe-") as tmp:
        path = Path(tmp) / "probe.json"
        before = thread_wchar()
        hvd.start_timeline(str(path), mark_cycles=True)
        time.sleep(PROBE_S)
        hvd.stop_timeline()
        after = thread_wchar()
        size = path.stat().st_size if path.exists() else 0
    return writer_thread(before, after, size)


def idle_timeline_writer(module: str) -> int | None:
    """Run the timeline writer of the Horovod binding ``module`` (``horovod.torch``,
    ``horovod.tensorflow``; must be imported and initialised) at ``SCHED_IDLE``.

    Returns its thread id, or None where there is nothing to do or it could not be done
    (logged; training is never affected).
    """
    hvd = sys.modules.get(module)
    if hvd is None:
        return None
    try:
        tid = find_timeline_writer(hvd)
        if tid is None:
            return None
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    except Exception as e:  # noqa: BLE001 - profiling must never break training
        log.warning("dpro: Horovod's timeline writer thread keeps a core busy and could not be moved to idle "
                    "priority (%s): expect a slower job", e)
        return None
    log.info("dpro: Horovod's timeline writer (thread %d) now runs at idle priority (it spins for the whole job "
             "while HOROVOD_TIMELINE is set)", tid)
    return tid
