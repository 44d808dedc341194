"""4 ranks on CPU (gloo): a tensor-parallel pair group and a data-parallel pair group.

Ranks {0,1} and {2,3} are TP groups: each holds half of the hidden layer's columns, and
the forward pass all-reduces the partial outputs inside its TP group (as Megatron's
row-parallel linear does). Ranks {0,2} and {1,3} are DP groups: after backward each rank
all-reduces its gradients in its DP group. Recorded with plain torch.profiler, as a user
would; also times the same steps unprofiled with perf_counter (written to timing.json).

    python examples/kineto_multirank/tp_dp.py OUTDIR [--steps 6] [--hidden 1024]
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from harness import parser, record, spawn, time_unprofiled


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
    record(step, out, rank, args.steps)
    time_unprofiled(step, out, rank, 4, args.timed)  # the same job unprofiled, by its own clock
    dist.destroy_process_group()


def main() -> None:
    ap = parser(__doc__, steps=6, port=29531)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    spawn(worker, ap.parse_args(), 4)


if __name__ == "__main__":
    main()
