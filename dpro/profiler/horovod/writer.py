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

**Inside the window** idle priority is worse than useless: the writer takes Horovod's
``writer_mutex_`` on every turn of its loop, and so does every ``EnqueueWriteEvent`` of
Horovod's background thread. A ``SCHED_IDLE`` writer preempted while it holds that mutex
keeps the background thread — every collective — waiting until a core is idle (priority
inversion; on the loaded 2-core VM the window's steps of a TF convnet ran 1.5–8x slower,
docs/fidelity.md), and when it does run it spins (5 s of CPU over a 15 s window, measured
from ``/proc/<pid>/task/*/stat``). So the writer is parked inside the window too, which
Horovod's queue allows (:data:`QUEUE_RECORDS` records are kept until it is woken before
``stop_timeline``, and each record carries the time it was enqueued), but only where it
holds no lock: :meth:`TimelineWriter.park_unlocked` parks it, reads where the signal
interrupted it (the x86-64 signal frame on its stack, :func:`parked_pc`) and keeps the
park only if that was inside libc's ``sched_yield`` — the loop's only call made without
the mutex, where the spinning thread spends most of its time — else it wakes it and tries
again; after :data:`UNLOCKED_TRIES` misses the window runs with the writer awake, as before.
``DPRO_HOROVOD_PARK=outside`` parks it outside the window only (the previous behaviour).
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import signal
import struct
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpro.contracts.recording import ENV_HOROVOD_PARK, ENV_HOROVOD_TIMELINE, HOROVOD_TIMELINE_DYNAMIC

#: ``DPRO_HOROVOD_PARK=outside``: park the writer outside the window only
PARK_OUTSIDE = "outside"

log = logging.getLogger(__name__)

PROBE_S = 0.05
#: parks the writer: the handler sleeps this signal's number of seconds (36) at most
PARK_SIG = signal.SIGRTMIN + 2
#: wakes a parked writer (its handler does nothing; delivering it ends the sleep)
WAKE_SIG = signal.SIGRTMIN + 3
#: re-park this often while the job runs (before the sleep ends by itself)
REPARK_S = 20.0
#: how long :meth:`TimelineWriter.wake` keeps sending wake-up signals, 1 ms apart (s)
WAKE_WAIT_S = 2.0
#: how many more bytes than the file's size the writer may have written in a probe
#: (measured 0-49; its own bookkeeping)
SLACK_BYTES = 256
#: probe timelines run; the writer must match in most of them
PROBES = 3
#: Horovod's timeline record queue (``boost::lockfree::spsc_queue``, capacity 1048576 in
#: 0.2x); a window whose records could fill a quarter of it keeps the writer awake
QUEUE_RECORDS = 1 << 20
#: tries of :meth:`TimelineWriter.park_unlocked` before the window runs with the writer awake
UNLOCKED_TRIES = 20
#: how long a park signal may take to put the writer to sleep (s)
PARK_WAIT_S = 0.05
#: x86-64 ``struct rt_sigframe`` (arch/x86/include/asm/sigframe.h): the handler's return
#: address (the ``sa_restorer`` libc installed), then ``ucontext``: flags 8, link 8, stack 24,
#: then ``sigcontext`` with rsp at 120 and rip at 128: the interrupted rip is 176 bytes in
FRAME_RIP, FRAME_RSP = 176, 168
#: syscalls a parked writer sleeps in (libc ``sleep``: clock_nanosleep, nanosleep; x86-64)
SLEEP_SYSCALLS = (230, 35)
#: bytes of the writer's stack searched for the signal frame, from its stack pointer up
FRAME_SCAN_BYTES = 8192
#: libc's ``sched_yield`` is a handful of instructions
YIELD_SPAN = 64


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


def _signal_pending(tid: int, sig: int) -> bool:
    """Whether ``sig`` is pending for thread ``tid`` of this process (``SigPnd``)."""
    try:
        with open(f"/proc/self/task/{tid}/status") as f:
            for line in f:
                if line.startswith("SigPnd:"):
                    return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False


def _asleep(tid: int) -> bool:
    """Whether thread ``tid`` sleeps in the park handler (the writer's loop never sleeps)."""
    try:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            nr = f.read().split(None, 1)[0]
    except (OSError, IndexError):
        return False
    return nr.isdigit() and int(nr) in SLEEP_SYSCALLS


def _mapping_end(addr: int) -> int | None:
    """End of the memory mapping of this process that holds ``addr``."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                lo, hi = (int(x, 16) for x in line.split(None, 1)[0].split("-"))
                if lo <= addr < hi:
                    return hi
    except (OSError, ValueError):
        return None
    return None


def parked_pc(tid: int, restorer: int) -> int | None:
    """Where the park signal interrupted thread ``tid`` of this process (its rip), read from
    the signal frame on its stack while it sleeps in the handler: the first word above its
    stack pointer equal to the handler's return address ``restorer`` starts the frame. None
    if it is not asleep there (yet) or no frame is found (x86-64 Linux only)."""
    try:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return None
    if len(fields) < 9 or not fields[0].isdigit() or int(fields[0]) not in SLEEP_SYSCALLS:
        return None
    sp = int(fields[7], 16)
    end = _mapping_end(sp)
    if end is None or not restorer:
        return None
    buf = ctypes.string_at(sp, min(FRAME_SCAN_BYTES, end - sp))
    key = struct.pack("<Q", restorer)
    i = buf.find(key)
    while i >= 0 and i % 8:
        i = buf.find(key, i + 1)
    if i < 0 or i + FRAME_RIP + 8 > len(buf):
        return None
    rsp, rip = struct.unpack_from("<QQ", buf, i + FRAME_RSP)
    return rip if rsp > sp + i else None  # the interrupted stack lies above the frame


@dataclass
class TimelineWriter:
    """Horovod's timeline writer thread of this process (idle priority), parked between uses."""

    tid: int
    module: str
    parkable: bool = False
    parked_at: float | None = None
    closed: bool = False
    #: parked inside the window (by :meth:`park_unlocked`): re-parked the same way
    in_window: bool = False
    _libc: Any = field(default=None, repr=False)
    #: address of libc's ``sched_yield`` (None: in-window parking unavailable)
    _yield_pc: int | None = field(default=None, repr=False)
    #: the park handler's return address (libc's ``__restore_rt``): marks its signal frame
    _restorer: int = field(default=0, repr=False)

    def _signal(self, sig: int) -> bool:
        return self._libc is not None and self._libc.tgkill(os.getpid(), self.tid, sig) == 0

    def park(self) -> None:
        """Put the writer to sleep (it must not be needed until :meth:`wake`)."""
        if self.parkable and not self.closed and self._signal(PARK_SIG):
            self.parked_at = time.monotonic()

    def keep_parked(self) -> None:
        """Called between steps: re-park before the sleep ends by itself."""
        if self.parked_at is not None and time.monotonic() - self.parked_at > REPARK_S:
            if self.in_window:
                self.wake()
                self.park_unlocked()
            else:
                self.park()

    def set_normal(self, normal: bool) -> None:
        """Normal scheduling (to drain the window's records promptly) or back to idle."""
        try:
            os.sched_setscheduler(self.tid, os.SCHED_OTHER if normal else os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            pass

    def park_unlocked(self) -> bool:
        """Park the writer inside the window, where it holds no lock (see the module's doc).

        True if it sleeps in ``sched_yield``; False (awake) if in-window parking is not
        available here or it was caught holding the lock :data:`UNLOCKED_TRIES` times."""
        if not self.parkable or self.closed or self._yield_pc is None:
            return False
        self.set_normal(True)  # run it at once, so that the signal is taken now, not when a core is idle
        try:
            for _ in range(UNLOCKED_TRIES):
                if not self._signal(PARK_SIG):
                    return False
                self.parked_at = time.monotonic()
                pc = None
                deadline = time.monotonic() + PARK_WAIT_S
                while pc is None and time.monotonic() < deadline:
                    time.sleep(0.0002)
                    pc = parked_pc(self.tid, self._restorer)
                if pc is not None and self._yield_pc <= pc < self._yield_pc + YIELD_SPAN:
                    self.in_window = True
                    return True
                self.wake()
            log.info("dpro: Horovod's timeline writer was holding its lock at every try: it stays awake in "
                     "the window")
            return False
        finally:
            self.set_normal(False)

    def wake(self) -> None:
        """Wake the writer (before the timeline is started, or Horovod shut down); it is
        left at normal priority (:meth:`set_normal`), so that it takes the signals now.

        A wake-up taken before the park's handler has started its sleep is lost (the kernel
        runs the wake-up's handler first when both are pending), so: while the thread
        sleeps, send the wake-up again; while a park signal is still pending, wait for it to
        be taken."""
        if self.parked_at is None:
            return
        self.parked_at = None
        self.in_window = False
        self.set_normal(True)
        deadline = time.monotonic() + WAKE_WAIT_S
        while time.monotonic() < deadline:
            if _asleep(self.tid):
                if not self._signal(WAKE_SIG):
                    return
            elif not _signal_pending(self.tid, PARK_SIG):
                return
            time.sleep(0.001)
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
    if os.environ.get(ENV_HOROVOD_PARK, "1") != PARK_OUTSIDE and sys.platform.startswith("linux") \
            and os.uname().machine == "x86_64":
        installed = _Sigaction()
        if libc.sigaction(int(PARK_SIG), None, ctypes.byref(installed)) == 0 and installed.restorer:
            writer._yield_pc = ctypes.cast(libc.sched_yield, ctypes.c_void_p).value
            writer._restorer = installed.restorer
    shutdown = getattr(hvd, "shutdown", None)
    if callable(shutdown):
        def wake_then_shutdown(*args: Any, **kwargs: Any) -> Any:
            writer.close()
            return shutdown(*args, **kwargs)

        hvd.shutdown = wake_then_shutdown
    # registered after Horovod's own (hvd.init), so it runs before Horovod's shutdown at exit
    atexit.register(writer.close)
    writer.parkable = True
