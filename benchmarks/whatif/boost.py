"""Give the measured jobs the machine's CPU first, as a dedicated machine would.

Linux's autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``) puts every
session (``setsid``: torchrun's and horovodrun's ranks, our own launcher's processes) in
its own group, and groups share the CPU equally whatever their processes' ``nice``: other
work niced to 19 in another session still takes an equal share from the measured job.
While :func:`boosted` is active, a thread gives the autogroup of every descendant of this
process the group nice ``NICE`` (root; elsewhere it does nothing and says so), so other
sessions only get the CPU the measured job leaves idle. Inside the job, its processes
share the cores as usual (same scheduler class, equal nice).
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


def boost_once(root: int, nice: int = NICE) -> int:
    """Set the autogroup nice of ``root``'s and its descendants' groups; returns how many changed."""
    n = 0
    for pid in [root, *descendants(root)]:
        f = Path(f"/proc/{pid}/autogroup")
        try:
            if f.read_text().split()[-1] != str(nice):
                f.write_text(str(nice))
                n += 1
        except (OSError, IndexError):
            continue
    return n


@contextlib.contextmanager
def boosted(period_s: float = 0.5) -> Iterator[bool]:
    """Boost this process's descendants every ``period_s`` while the block runs; yields
    whether boosting works here (autogroup on, and allowed to set it)."""
    ag = Path("/proc/sys/kernel/sched_autogroup_enabled")
    try:
        on = ag.read_text().strip() == "1"
        boost_once(os.getpid())
        ok = on and Path(f"/proc/{os.getpid()}/autogroup").read_text().split()[-1] == str(NICE)
    except OSError:
        ok = False
    if not ok:
        log.warning("boost: autogroup off or not allowed: the measured jobs share the CPU with other sessions")
        yield False
        return
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(period_s):
            boost_once(os.getpid())

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield True
    finally:
        stop.set()
        t.join()
