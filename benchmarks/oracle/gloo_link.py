"""Time gloo all-reduces of several sizes (run under torchrun); rank 0 writes the samples.

    torchrun --nproc_per_node 2 benchmarks/oracle/gloo_link.py --out samples.json

``samples.json``: ``{"world_size": n, "samples": [[bytes, median µs], ...]}``; run.py fits
the ring model 2(n-1)(α + β m/n) to it (dpro.graph.comm_model.lad_link_cost) and writes
the platform file ``{"alpha_us", "beta_us_per_byte"}`` that ``dpro oracle --platform`` reads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

SIZES = (1 << 10, 1 << 13, 1 << 15, 1 << 17, 1 << 19, 1 << 21)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    out = []
    for size in SIZES:
        t = torch.ones(size // 4)
        times = []
        for i in range(args.reps + 3):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if i >= 3:
                times.append((time.perf_counter() - t0) * 1e6)
        out.append([size, statistics.median(times)])
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"world_size": dist.get_world_size(), "samples": out}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
