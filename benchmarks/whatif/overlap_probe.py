"""How fast a rank computes, and how fast its all-reduce goes, while the two overlap (issue #28).

DDP runs a bucket's all-reduce on gloo's thread while the main thread goes on with the
backward; on a host whose cores the ranks share, the two take CPU from each other. This
probe measures that on this machine, without dpro: N local processes (gloo, one compute
thread each, unpinned, as jobenv's ``ddp`` setting), each

* computes alone: ``units`` gradient-like matmuls (``[H, b] @ [b, H]`` into an ``[H, H]``
  output, the MLP's weight gradient at batch b), the time per unit;
* all-reduces alone: a tensor of each size, every rank entering after a barrier, median;
* both at once: after a barrier, starts the all-reduce (``async_op``) and computes units until
  it has ended (its end stamped by the future's callback on gloo's thread): the all-reduce's
  time, and the units done meanwhile (the last one pro rata).

Prints, per size, rank 0's medians over ``--repeats``: the all-reduce alone and overlapped
(their ratio: how much slower the collective goes), and the compute rate while it runs
(units per ms overlapped over alone). Usage:
``benchmarks/measure.sh .venv/bin/python benchmarks/whatif/overlap_probe.py [--processes 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, sizes: list[int], repeats: int, hidden: int, batch: int,
          flush: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    a, b = torch.randn(hidden, batch), torch.randn(batch, hidden)
    w = torch.empty(hidden, hidden)
    junk = torch.zeros(max(1, flush // 4))

    def cold() -> None:  # what a training step does between collectives: touch other memory
        if flush:
            junk.add_(1.0)

    def unit() -> None:
        torch.mm(a, b, out=w)

    for _ in range(20):
        unit()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(200):
        unit()
    alone_unit_us = (time.perf_counter() - t0) * 1e6 / 200
    rows = []
    for nbytes in sizes:
        x = torch.ones(nbytes // 4)
        for _ in range(2):
            dist.all_reduce(x)
        comm, over, rate = [], [], []
        for _ in range(repeats):
            cold()
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            comm.append((time.perf_counter() - t0) * 1e6)
            cold()
            dist.barrier()
            end: list[float] = []
            t0 = time.perf_counter()
            work = dist.all_reduce(x, async_op=True)
            work.get_future().add_done_callback(lambda _f: end.append(time.perf_counter()))
            stamps = [t0]
            while not end:
                unit()
                stamps.append(time.perf_counter())
            work.wait()
            t_end = end[0]
            # units ended by then, and the one running then pro rata
            k = sum(1 for s in stamps[1:] if s <= t_end)
            done = k + ((t_end - stamps[k]) / (stamps[k + 1] - stamps[k]) if k + 1 < len(stamps) else 0.0)
            over.append((t_end - t0) * 1e6)
            rate.append(done * alone_unit_us / max((t_end - t0) * 1e6, 1e-9))
        rows.append({"bytes": nbytes, "alone_us": statistics.median(comm), "overlapped_us": statistics.median(over),
                     "compute_rate": statistics.median(rate), "unit_us": alone_unit_us})
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--sizes", default="1048576,8433704,25182208")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--flush-bytes", type=int, default=0,
                   help="write over this many bytes of other memory before each collective (cold caches)")
    o = p.parse_args()
    import torch.multiprocessing as mp

    sizes = [int(s) // 4 * 4 for s in o.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        mp.spawn(_rank, args=(o.processes, _free_port(), sizes, o.repeats, o.hidden, o.batch, o.flush_bytes, out),
                 nprocs=o.processes, join=True)
        rows = json.loads(Path(out).read_text())
    print(f"# {o.processes} processes, {o.flush_bytes} bytes flushed before each collective, unit {rows[0]['unit_us']:.0f} us alone")
    print("| bytes | all-reduce alone ms | overlapped ms | x slower | compute rate while overlapped |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['bytes']} | {r['alone_us'] / 1e3:.2f} | {r['overlapped_us'] / 1e3:.2f} | "
              f"{r['overlapped_us'] / r['alone_us']:.2f} | {r['compute_rate']:.2f} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
