"""Point-to-point transfers inside 2-rank subgroups on CPU (gloo), recorded with torch.profiler.

Four ranks, two pair groups made with ``dist.new_group``: {0,1} and {2,3}. In each pair the
first rank runs a layer and sends its output to the second (``dist.send(y, dst=peer,
group=g)``), which runs its layer and sends the gradient-like result back; then each pair
all-reduces a small tensor in its group. c10d records the peer of a send/recv issued on a
subgroup as the peer's rank IN THAT GROUP (0 or 1 here), not its global rank: the trace of
rank 2 says "send to 1", meaning global rank 3 (docs/kineto.md, "point-to-point in
subgroups"). Recorded with plain torch.profiler, as a user would.

    python examples/kineto_multirank/p2p_groups.py OUTDIR [--steps 4]
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from harness import parser, record, spawn

WORLD = 4


def worker(rank: int, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group
    g = pairs[rank // 2]
    peer = rank ^ 1  # global rank of the other member of the pair
    first = rank % 2 == 0
    torch.manual_seed(rank)
    layer = torch.nn.Linear(args.d, args.d)

    def step() -> None:
        x = torch.randn(args.batch, args.d)
        if not first:
            dist.recv(x, src=peer, group=g)
        with torch.no_grad():
            y = layer(x)
        if first:
            dist.send(y, dst=peer, group=g)
            dist.recv(y, src=peer, group=g)
        else:
            dist.send(y, dst=peer, group=g)
        dist.all_reduce(layer.bias.data, group=g)

    out = Path(args.out)
    record(step, out, rank, args.steps)
    dist.destroy_process_group()


def main() -> None:
    ap = parser(__doc__, steps=4, port=29541, timed=False)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    spawn(worker, ap.parse_args(), WORLD)


if __name__ == "__main__":
    main()
