"""What the three example jobs share: record some steps with plain torch.profiler, as a
user's script would, then time the same steps unprofiled with the script's own clock."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def record(step: Callable[[], None], out: Path, rank: int, steps: int) -> None:
    """Run ``2 + steps`` steps under torch.profiler (1 waiting, 1 warm-up, ``steps``
    recorded); the trace goes to ``out/trace/rank<rank>.*.pt.trace.json``."""
    sched = schedule(wait=1, warmup=1, active=steps)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched, record_shapes=True,
                 on_trace_ready=tensorboard_trace_handler(str(out / "trace"), worker_name=f"rank{rank}")) as prof:
        for _ in range(2 + steps):
            step()
            prof.step()


def time_unprofiled(step: Callable[[], None], out: Path, rank: int, world: int, timed: int) -> None:
    """Time ``timed`` more steps, unprofiled, each after a barrier, with ``perf_counter``
    (a harness that does not trust dpro); rank 0 writes every rank's µs to ``out/timing.json``."""
    times = []
    for _ in range(timed):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e6)
    gathered = [None] * world
    dist.all_gather_object(gathered, times)
    if rank == 0:
        (out / "timing.json").write_text(json.dumps({"step_us_per_rank": gathered}))


def parser(doc: str | None, *, steps: int, port: int, timed: bool = True) -> argparse.ArgumentParser:
    """The options every example takes: OUT, ``--steps`` (recorded), ``--port`` and, for a
    job that times itself, ``--timed``; the job adds its own."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=steps, help="profiled (active) steps")
    if timed:
        ap.add_argument("--timed", type=int, default=20, help="unprofiled steps timed by perf_counter")
    ap.add_argument("--port", type=int, default=port)
    return ap


def spawn(worker: Callable[..., None], args: argparse.Namespace, world: int) -> None:
    """Run ``worker(rank, args)`` in ``world`` processes, OUT created first."""
    Path(args.out).mkdir(parents=True, exist_ok=True)
    mp.spawn(worker, args=(args,), nprocs=world)
