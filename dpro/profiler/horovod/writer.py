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
and the writer's written-bytes counter (``/proc/self/task/<tid>/io``, ``wchar``) has grown
by the file's size plus a few bytes (0–49 over 50 probes). Another thread can match by
chance: Horovod's background thread writes its per-cycle coordination to gloo's sockets,
0.7–15 KB per probe, and over 80 thread-probes one landed 7 bytes short of the file's size
and one 23 bytes short. Parking that thread stalls every collective for 36 s and gloo's
timeout then ends the job (the likely cause of a job that died in one `make test`). So the probe runs :data:`PROBES` times and
the writer is the one thread that matched (within :data:`SLACK_BYTES`) in most of them (the
writer itself missed one probe in 180 under load); none or several: not found, nothing is
touched. Only with ``HOROVOD_TIMELINE=DYNAMIC`` (a timeline
file the user asked for is never touched) and on Linux.

Idle priority is not enough: a spinning thread still takes every idle moment of a core
(each time a worker thread blocks briefly), and on the 2-core VM a 2-worker TF
transformer still ran 10-15 % slower for the whole job (docs/fidelity.md). So between
uses the writer is also **parked** (:class:`TimelineWriter`): a real-time signal whose
handler is libc's ``sleep`` (async-signal-safe; it sleeps as many seconds as the
signal's number, 36, with every other signal but the wake-up one blocked), sent to that
thread alone with ``tgkill``. It sleeps in the kernel, taking no CPU; the recorder
re-parks it every 20 s while the job calls its step function, and wakes it (a second
signal, whose handler is ``getpid``: a no-op that interrupts the sleep) before the
window's ``start_timeline`` and before ``hvd.shutdown()`` (which joins it) or exit. If
anything is missed, the writer wakes by itself within 36 s. While parked the timeline
is stopped, so Horovod does not touch the writer (every timeline call returns early on
its ``active`` flag). ``DPRO_HOROVOD_PARK=0`` keeps the idle priority only.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpro.contracts.recording import ENV_HOROVOD_PARK, ENV_HOROVOD_TIMELINE, HOROVOD_TIMELINE_DYNAMIC

log = logging.getLogger(__name__)

PROBE_S = 0.05
#: parks the writer: the handler sleeps this signal's number of seconds (36) at most
PARK_SIG = signal.SIGRTMIN + 2
#: wakes a parked writer (its handler does nothing; delivering it ends the sleep)
WAKE_SIG = signal.SIGRTMIN + 3
#: re-park this often while the job runs (before the sleep ends by itself)
REPARK_S = 20.0
#: wake-up signals sent, 1 ms apart, until the writer is seen running
WAKE_TRIES = 50
#: how many more bytes than the file's size the writer may have written in a probe
#: (measured 0-49; its own bookkeeping)
SLACK_BYTES = 256
#: probe timelines run; the writer must match in most of them
PROBES = 3


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


def writer_candidates(before: dict[int, int], after: dict[int, int], size: int) -> set[int]:
    """Threads whose ``wchar`` grew by ``size`` to ``size + SLACK_BYTES`` bytes."""
    if size <= 0:
        return set()
    return {t for t in after if size <= after[t] - before.get(t, 0) <= size + SLACK_BYTES}


def writer_thread(probes: list[set[int]]) -> int | None:
    """The one thread that matched in more than half of the probes, or None (none did, or
    several)."""
    hits = Counter(t for p in probes for t in p)
    most = [t for t, n in hits.items() if 2 * n > len(probes)]
    return most[0] if len(most) == 1 else None


def find_timeline_writer(hvd: Any) -> int | None:
    """Thread id of Horovod's timeline writer in this process, or None (not the coordinator,
    no dynamic timeline, or not found)."""
    if os.environ.get(ENV_HOROVOD_TIMELINE) != HOROVOD_TIMELINE_DYNAMIC or not sys.platform.startswith("linux"):
        return None
    try:
        if not hvd.is_initialized() or hvd.rank() != 0:
            return None
    except (AttributeError, ValueError):
        return None
    probes = []
    with tempfile.TemporaryDirectory(prefix="dpro-hvd-probe-") as tmp:
        for i in range(PROBES):
            path = Path(tmp) / f"probe{i}.json"
            before = thread_wchar()
            hvd.start_timeline(str(path), mark_cycles=True)
            time.sleep(PROBE_S)
            hvd.stop_timeline()
            after = thread_wchar()
            probes.append(writer_candidates(before, after, path.stat().st_size if path.exists() else 0))
    tid = writer_thread(probes)
    if tid is None:
        log.warning("dpro: Horovod's timeline writer could not be told apart from other threads (candidates "
                    "per probe: %s); it keeps a core busy: expect a slower job", probes)
    return tid


class _Sigaction(ctypes.Structure):
    """glibc's ``struct sigaction`` (Linux)."""

    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]


def _install_park_handlers(libc: Any) -> bool:
    """PARK_SIG -> libc ``sleep`` (every signal but WAKE_SIG blocked meanwhile), WAKE_SIG ->
    libc ``getpid``. False (nothing changed) if another handler already owns either."""
    plan = [(PARK_SIG, ctypes.cast(libc.sleep, ctypes.c_void_p).value, True),
            (WAKE_SIG, ctypes.cast(libc.getpid, ctypes.c_void_p).value, False)]
    for sig, fn, _ in plan:
        old = _Sigaction()
        if libc.sigaction(sig, None, ctypes.byref(old)) != 0 or old.handler not in (None, fn):
            return False
    for sig, fn, block_all in plan:
        sa = _Sigaction()
        sa.handler = fn
        if block_all:
            libc.sigfillset(ctypes.byref(sa.mask))
            libc.sigdelset(ctypes.byref(sa.mask), WAKE_SIG)
        if libc.sigaction(sig, ctypes.byref(sa), None) != 0:
            return False
    return True


def thread_state(tid: int) -> str | None:
    """The kernel's one-letter state of thread ``tid`` of this process (R, S, ...)."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@dataclass
class TimelineWriter:
    """Horovod's timeline writer thread of this process (idle priority), parked between uses."""

    tid: int
    module: str
    parkable: bool = False
    parked_at: float | None = None
    closed: bool = False
    _libc: Any = field(default=None, repr=False)

    def _signal(self, sig: int) -> bool:
        return self._libc is not None and self._libc.tgkill(os.getpid(), self.tid, sig) == 0

    def park(self) -> None:
        """Put the writer to sleep (it must not be needed until :meth:`wake`)."""
        if self.parkable and not self.closed and self._signal(PARK_SIG):
            self.parked_at = time.monotonic()

    def keep_parked(self) -> None:
        """Called between steps: re-park before the sleep ends by itself."""
        if self.parked_at is not None and time.monotonic() - self.parked_at > REPARK_S:
            self.park()

    def wake(self) -> None:
        """Wake the writer (before the timeline is started, or Horovod shut down).

        Sent again until the thread is seen running: a wake-up that arrives before the
        park's handler has started is taken first, and the sleep would then go on."""
        if self.parked_at is None:
            return
        self.parked_at = None
        for _ in range(WAKE_TRIES):
            if not self._signal(WAKE_SIG):
                return
            time.sleep(0.001)
            if thread_state(self.tid) != "S":
                return
        log.warning("dpro: Horovod's timeline writer (thread %d) did not wake; it will within %d s", self.tid,
                    PARK_SIG)

    def close(self) -> None:
        """Wake it for good (Horovod's shutdown joins it)."""
        self.wake()
        self.closed = True


def idle_timeline_writer(module: str) -> TimelineWriter | None:
    """Run the timeline writer of the Horovod binding ``module`` (``horovod.torch``,
    ``horovod.tensorflow``; must be imported and initialised) at ``SCHED_IDLE`` and park it.

    Returns it, or None where there is nothing to do or it could not be done (logged;
    training is never affected).
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
    writer = TimelineWriter(tid, module)
    if os.environ.get(ENV_HOROVOD_PARK, "1") not in ("0", "false", "no"):
        _make_parkable(writer, hvd)
    log.info("dpro: Horovod's timeline writer (thread %d) now runs at idle priority%s (it spins for the whole "
             "job while HOROVOD_TIMELINE is set)", tid, " and is parked outside the window" if writer.parkable else "")
    writer.park()
    return writer


def _make_parkable(writer: TimelineWriter, hvd: Any) -> None:
    """Signal handlers, and a wake-up before ``hvd.shutdown()`` and at exit."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if not hasattr(libc, "tgkill") or not _install_park_handlers(libc):
            log.info("dpro: not parking Horovod's timeline writer (signals %d/%d taken or no tgkill)",
                     PARK_SIG, WAKE_SIG)
            return
    except (OSError, AttributeError) as e:
        log.info("dpro: not parking Horovod's timeline writer: %s", e)
        return
    writer._libc = libc
    shutdown = getattr(hvd, "shutdown", None)
    if callable(shutdown):
        def wake_then_shutdown(*args: Any, **kwargs: Any) -> Any:
            writer.close()
            return shutdown(*args, **kwargs)

        hvd.shutdown = wake_then_shutdown
    # registered after Horovod's own (hvd.init), so it runs before Horovod's shutdown at exit
    atexit.register(writer.close)
    writer.parkable = True
