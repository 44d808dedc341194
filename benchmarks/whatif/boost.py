"""Give the measured jobs the machine's CPU first, as a dedicated machine would.

Linux's autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``) puts every
session (``setsid``: torchrun's and horovodrun's ranks, our own launcher's processes) in
its own group, and groups share the CPU equally whatever their processes' ``nice``: other
work niced to 19 in another session still takes an equal share from the measured job.
While :func:`boosted` is active, a thread gives the autogroup of every descendant of this
process (but its own) the group nice ``NICE`` (root; elsewhere it does nothing and says so), so other
sessions only get the CPU the measured job leaves idle. Inside the job, its processes
share the cores as usual (same scheduler class, equal nice).

The group nice follows the caller (:func:`caller_nice`): under benchmarks/measure.sh (the
caller's own autogroup at -19, holding the measuring lock) the jobs get -19; a harness
started under ``nice -n 19`` (a test run outside the lock) gives its jobs +19, so that it
never takes CPU from a measurement; otherwise the caller's autogroup nice.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)
NICE = -19


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d.name))
    return kids


def descendants(root: int) -> list[int]:
    kids, out, todo = _children(), [], [root]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def _group(pid: int | str) -> str:
    """``/autogroup-N`` of a process ("" if unreadable)."""
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().split()[0]
    except (OSError, IndexError):
        return ""


def boost_once(root: int, nice: int = NICE) -> int:
    """Set the autogroup nice of ``root``'s descendants' groups, all but the caller's own
    group (that one is measure.sh's to set); returns how many changed."""
    n, own = 0, _group("self")
    for pid in descendants(root):
        f = Path(f"/proc/{pid}/autogroup")
        try:
            group, _, value = f.read_text().split()
            if group != own and value != str(nice):
                f.write_text(str(nice))
                n += 1
        except (OSError, ValueError):
            continue
    return n


def caller_nice() -> int:
    """The group nice the caller's jobs get: the caller's own autogroup nice when below 0
    (-19 under measure.sh), else 19 if this process is niced (a run outside the measuring
    lock), else the caller's own autogroup nice."""
    try:
        own = int(Path("/proc/self/autogroup").read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        own = 0
    return 19 if own >= 0 and os.getpriority(os.PRIO_PROCESS, 0) > 0 else own


@contextlib.contextmanager
def boosted(period_s: float = 0.5, nice: int | None = None) -> Iterator[bool]:
    """Give this process's descendants' autogroups the group nice ``nice`` (default:
    :func:`caller_nice`) every ``period_s`` while the block runs; yields whether they are
    boosted (autogroup on, allowed to set it, and the nice is ``NICE``)."""
    nice = caller_nice() if nice is None else nice
    ag = Path("/proc/sys/kernel/sched_autogroup_enabled")
    try:
        ok = ag.read_text().strip() == "1" and os.geteuid() == 0 and bool(_group("self"))
    except OSError:
        ok = False
    if not ok:
        log.warning("boost: autogroup off or not allowed: the measured jobs share the CPU with other sessions")
        yield False
        return
    if nice != NICE:
        log.warning("boost: not under benchmarks/measure.sh: the jobs' autogroups get nice %d, not %d", nice, NICE)
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(period_s):
            boost_once(os.getpid(), nice)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield nice == NICE
    finally:
        stop.set()
        t.join()
