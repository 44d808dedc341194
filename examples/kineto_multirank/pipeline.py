"""A 4-stage pipeline on CPU (gloo) with point-to-point send/recv and micro-batches.

Rank r holds stage r (two linear layers). Each step runs M micro-batches GPipe-style:
all forwards (rank r receives the activation from r-1 with ``dist.recv``, sends its
output to r+1 with ``dist.send``), then all backwards (gradients flow back r+1 -> r),
then the optimizer step. Recorded with plain torch.profiler, as a user would; also times
the same steps unprofiled with perf_counter (written to timing.json).

    python examples/kineto_multirank/pipeline.py OUTDIR [--steps 6] [--micro 4]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

WORLD = 4


def worker(rank: int, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(rank)
    stage = torch.nn.Sequential(torch.nn.Linear(args.d, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.d))
    opt = torch.optim.SGD(stage.parameters(), lr=1e-3)
    mb = args.batch // args.micro
    first, last = rank == 0, rank == WORLD - 1

    def step() -> None:
        opt.zero_grad()
        ins, outs = [], []
        for _ in range(args.micro):  # forward of every micro-batch
            x = torch.randn(mb, args.d)
            if not first:
                dist.recv(x, src=rank - 1)
            x.requires_grad_(not first)
            y = stage(x)
            if not last:
                dist.send(y.detach(), dst=rank + 1)
            ins.append(x)
            outs.append(y)
        for x, y in zip(reversed(ins), reversed(outs)):  # backward, last micro-batch first
            if last:
                y.square().mean().backward()
            else:
                g = torch.empty_like(y)
                dist.recv(g, src=rank + 1)
                y.backward(g)
            if not first:
                dist.send(x.grad, dst=rank - 1)
        opt.step()

    out = Path(args.out)
    sched = schedule(wait=1, warmup=1, active=args.steps)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched, record_shapes=True,
                 on_trace_ready=tensorboard_trace_handler(str(out / "trace"), worker_name=f"rank{rank}")) as prof:
        for _ in range(2 + args.steps):
            step()
            prof.step()
    times = []
    for _ in range(args.timed):  # the same job unprofiled, timed by its own clock
        dist.barrier()
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e6)
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, times)
    if rank == 0:
        (out / "timing.json").write_text(json.dumps({"step_us_per_rank": gathered}))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=6, help="profiled (active) steps")
    ap.add_argument("--timed", type=int, default=20, help="unprofiled steps timed by perf_counter")
    ap.add_argument("--micro", type=int, default=4, help="micro-batches per step")
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--port", type=int, default=29532)
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    mp.spawn(worker, args=(args,), nprocs=WORLD)


if __name__ == "__main__":
    main()
