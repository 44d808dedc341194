"""The CPU a rank's *main thread* spends in one gloo collective call (``time.thread_time``
around the call), next to the call's wall time, with ``--compute-us`` of matmuls before
every call (as in a training step) — docs/oracle.md, #29's fifth session: the strategies
that call collectives themselves (filter, channel, the hybrids) have a main-thread CPU per
step that the profile of data parallelism does not explain. Rank 0 prints medians over the
calls (µs), per kind and size.

    benchmarks/measure.sh .venv/bin/python -m torch.distributed.run --nproc_per_node 2 \\
        benchmarks/oracle/call_cpu.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist


def _compute(us: float, a: torch.Tensor) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        a @ a


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--compute-us", type=float, default=2000.0)
    p.add_argument("--sizes", default="16384,131072", help="bytes per rank's part")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    a = torch.randn(64, 64)
    rows = []
    for size in (int(x) for x in args.sizes.split(",")):
        t = torch.ones(size // 4)
        parts = [torch.empty_like(t) for _ in range(n)]
        for kind in ("all_gather", "all_reduce"):
            cpu, wall = [], []
            for i in range(args.calls + 5):
                _compute(args.compute_us, a)
                c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
                if kind == "all_gather":
                    dist.all_gather(parts, t)
                else:
                    dist.all_reduce(t)
                if i >= 5:
                    cpu.append((time.thread_time_ns() - c0) / 1e3)
                    wall.append((time.perf_counter_ns() - w0) / 1e3)
            got = torch.tensor([statistics.median(cpu), statistics.median(wall)])
            dist.all_reduce(got)
            rows.append((kind, size, *(got / n).tolist()))
    if rank == 0:
        print(f"{n} processes, {args.compute_us:g} µs of compute before each call; mean over ranks of the median "
              f"over {args.calls} calls (µs)")
        print(f"{'call':<11} {'bytes':>7} {'main cpu':>9} {'wall':>9}")
        for kind, size, c, w in rows:
            print(f"{kind:<11} {size:>7} {c:9.1f} {w:9.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
