"""A 4-stage pipeline on CPU (gloo) with point-to-point send/recv and micro-batches.

Rank r holds stage r (two linear layers). Each step runs M micro-batches GPipe-style:
all forwards (rank r receives the activation from r-1 with ``dist.recv``, sends its
output to r+1 with ``dist.send``), then all backwards (gradients flow back r+1 -> r),
then the optimizer step. Recorded with plain torch.profiler, as a user would; also times
the same steps unprofiled with perf_counter (written to timing.json).

    python examples/kineto_multirank/pipeline.py OUTDIR [--steps 6] [--micro 4]
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from harness import parser, record, spawn, time_unprofiled

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
    record(step, out, rank, args.steps)
    time_unprofiled(step, out, rank, WORLD, args.timed)  # the same job unprofiled, by its own clock
    dist.destroy_process_group()


def main() -> None:
    ap = parser(__doc__, steps=6, port=29532)
    ap.add_argument("--micro", type=int, default=4, help="micro-batches per step")
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=128)
    spawn(worker, ap.parse_args(), WORLD)


if __name__ == "__main__":
    main()
