"""``dpro calibrate --backend horovod``: Horovod's own all-reduce (over gloo) on this machine.

A torch.distributed calibration (:mod:`dpro.whatif.calibrate`) leaves out what Horovod adds
to every all-reduce: its background thread's cycles and negotiation, the fusion buffer's
copies. On this VM a 2-rank Horovod job used 83 ms of CPU per rank and step where its
computation is 38 ms (the cores 99 % busy), against 16 ms that torch's gloo all-reduce of the
same bytes takes. This calibration runs ``processes`` ranks under ``horovodrun --gloo`` (the
launcher next to this Python, or on the PATH) and measures, per size, as
:mod:`dpro.whatif.calibrate` does for torch: ``hvd.allreduce`` alone after ``hvd.barrier()``
(wall and the process's CPU, every thread), then ``hvd.allreduce_async`` while the rank
computes (polled after each unit of computation, so the end is known to within a unit,
about 1 ms). ``pin``: each rank bound to core ``rank % cores`` before Horovod starts its
threads, as jobs pinned that way (``--bind-to core``) run. The fit is
:func:`dpro.whatif.calibrate.fit_platform`'s, without the CPU cost: Horovod's threads wait
by polling, so its calls take CPU for all of their wall time (a 4 KiB call: 1.8 ms of both,
Horovod's cycle), which tells nothing of the work they take from cores that others want
(the samples keep it); the CPU cost (``dpro whatif --cpu-cost``) is torch's gloo all-reduce's
(``dpro calibrate``): the same transport's work.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dpro.errors import DproInputError
from dpro.whatif.calibrate import (DEFAULT_SIZES, compute_unit, fit_platform, measure_tries, process_cpu_us,
                                   size_row)


def horovodrun() -> str | None:
    """The ``horovodrun`` next to this Python, else the one on the PATH (None: not installed)."""
    here = Path(sys.executable).with_name("horovodrun")
    return str(here) if here.exists() else shutil.which("horovodrun")


def calibrate_horovod(processes: int = 2, sizes: list[int] | None = None, repeats: int = 10, tries: int = 3,
                      pin: bool = False, tick: Callable[[str], None] | None = None, timeout_s: float = 600) -> dict:
    """Measure and fit Horovod's all-reduce; returns the platform file's content."""
    if processes < 2:
        raise ValueError("calibrate needs at least 2 processes")
    run = horovodrun()
    if run is None:
        raise DproInputError(None, "--backend horovod: horovodrun not found (install Horovod with gloo: make horovod)")
    sizes = sizes or DEFAULT_SIZES

    def measure(out: Path) -> None:
        cmd = [run, "-np", str(processes), "--gloo", "-H", f"localhost:{processes}", sys.executable, "-m",
               "dpro.whatif.calibrate_hvd", "--out", str(out), "--sizes", ",".join(map(str, sizes)),
               "--repeats", str(repeats), *(["--pin"] if pin else [])]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise DproInputError(None, f"--backend horovod: horovodrun did not finish in {timeout_s:g} s") from None
        if p.returncode != 0 or not out.exists():
            last = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
            raise DproInputError(None, f"--backend horovod: horovodrun failed (exit {p.returncode}): {last[0][:200]}")

    d = fit_platform(measure_tries(tries, "dpro-calibrate-hvd-", measure, tick), processes, "horovod", cpu_cost=False)
    d["pinned"] = pin
    return d


def _rank(out: str, sizes: list[int], repeats: int, pin: bool) -> None:
    """One rank of the calibration (run by horovodrun)."""
    if pin:
        cores = sorted(os.sched_getaffinity(0))
        rank = int(os.environ.get("HOROVOD_RANK", "0"))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    import torch
    import horovod.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    unit, unit_us = compute_unit(torch)
    rows = []
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        name = f"calib.{nbytes}"
        for _ in range(2):
            hvd.allreduce(x, name=name)
        ts, cpu = [], []
        for _ in range(repeats):
            hvd.barrier()
            c0, t0 = process_cpu_us(), time.perf_counter()
            hvd.allreduce(x, name=name)
            ts.append((time.perf_counter() - t0) * 1e6)
            cpu.append(process_cpu_us() - c0)
        over, work = [], []
        for _ in range(repeats):
            hvd.barrier()
            t0 = time.perf_counter()
            h = hvd.allreduce_async(x, name=name)
            done = 0
            while not hvd.poll(h):
                unit()
                done += 1
            over.append((time.perf_counter() - t0) * 1e6)
            hvd.synchronize(h)
            work.append(done * unit_us)
        rows.append(size_row(int(x.numel() * 4), ts, cpu, over, work))
    if hvd.rank() == 0:
        Path(out).write_text(json.dumps(rows))
    hvd.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description="one rank of dpro calibrate --backend horovod (run by horovodrun)")
    p.add_argument("--out", required=True)
    p.add_argument("--sizes", required=True)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--pin", action="store_true")
    o = p.parse_args()
    _rank(o.out, [int(s) for s in o.sizes.split(",")], o.repeats, o.pin)


if __name__ == "__main__":
    main()
