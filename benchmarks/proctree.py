"""Run a command and sample the memory of its whole process tree (benchmarks only).

``ru_maxrss`` of the children is the peak of the largest one; an import that runs its
ranks in worker processes needs the peak of their sum, sampled here from /proc.
"""

from __future__ import annotations

import os
import resource
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Measured:
    returncode: int
    wall_s: float
    #: peak over the samples of the summed RSS of the command and all its descendants
    peak_tree_bytes: int
    #: the most processes alive at once in the tree
    processes: int
    stdout: str
    stderr: str
    #: user + system CPU seconds of the command and the descendants it waited for: less
    #: sensitive than ``wall_s`` to the other jobs of a shared machine
    cpu_s: float = 0.0


def _tree(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            kids.setdefault(int(fields[1]), []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _rss(pid: int) -> int:
    try:
        return int((Path(f"/proc/{pid}/statm")).read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def run(cmd: list[str], env: dict | None = None, interval: float = 0.05, cwd: Path | None = None) -> Measured:
    """Run ``cmd`` (in ``cwd``: `python -m` imports from there first) and measure it."""
    t0 = time.perf_counter()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    peak, most = 0, 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak, most
        while not done.is_set():
            pids = _tree(proc.pid)
            peak = max(peak, sum(_rss(p) for p in pids))
            most = max(most, len(pids))
            done.wait(interval)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    done.set()
    th.join()
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return Measured(proc.returncode, wall, peak, most, out, err, cpu)
