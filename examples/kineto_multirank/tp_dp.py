"""4 ranks on CPU (gloo): a tensor-parallel pair group and a data-parallel pair group.

Ranks {0,1} and {2,3} are TP groups: each holds half of the hidden layer's columns, and
the forward pass all-reduces the partial outputs inside its TP group (as Megatron's
row-parallel linear does). Ranks {0,2} and {1,3} are DP groups: after backward each rank
all-reduces its gradients in its DP group. Recorded with plain torch.profiler, as a user
would; also times the same steps unprofiled with perf_counter (written to timing.json).

    python examples/kineto_multirank/tp_dp.py OUTDIR [--steps 6] [--hidden 1024]
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


class TPBlock(torch.nn.Module):
    """Column-parallel then row-parallel linear (half the hidden units per TP rank)."""

    def __init__(self, d: int, hidden: int, tp: int) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d, hidden // tp)
        self.fc2 = torch.nn.Linear(hidden // tp, d, bias=False)

    def forward(self, x: torch.Tensor, group) -> torch.Tensor:
        y = self.fc2(torch.relu(self.fc1(x)))
        dist.all_reduce(y, group=group)  # sum the partial outputs of the TP group
        return y


def worker(rank: int, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=4)
    tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    tp, dp = tp_groups[rank // 2], dp_groups[rank % 2]
    torch.manual_seed(rank % 2)
    blocks = torch.nn.ModuleList(TPBlock(args.d, args.hidden, 2) for _ in range(args.layers))
    opt = torch.optim.SGD(blocks.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.d)

    def step() -> None:
        h = x
        for b in blocks:
            h = b(h, tp)
        loss = h.square().mean()
        opt.zero_grad()
        loss.backward()
        for p in blocks.parameters():  # data-parallel gradient all-reduce, one per tensor
            dist.all_reduce(p.grad, group=dp)
        opt.step()

    out = Path(args.out)
    sched = schedule(wait=1, warmup=1, active=args.steps)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched, record_shapes=True,
                 on_trace_ready=tensorboard_trace_handler(str(out / "trace"), worker_name=f"rank{rank}")) as prof:
        for _ in range(2 + args.steps):
            step()
            prof.step()
    # the same job unprofiled, timed by its own clock (a harness that does not trust dpro)
    times = []
    for _ in range(args.timed):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e6)
    gathered = [None] * 4
    dist.all_gather_object(gathered, times)
    if rank == 0:
        (out / "timing.json").write_text(json.dumps({"step_us_per_rank": gathered}))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=6, help="profiled (active) steps")
    ap.add_argument("--timed", type=int, default=20, help="unprofiled steps timed by perf_counter")
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--port", type=int, default=29531)
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    mp.spawn(worker, args=(args,), nprocs=4)


if __name__ == "__main__":
    main()
