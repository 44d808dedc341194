"""Train the small CNN of strategies.py with one parallel strategy over gloo.

    torchrun --nproc_per_node 2 examples/parallel/train.py --strategy filter
    torchrun --nproc_per_node 4 examples/parallel/train.py --strategy data+spatial --p2 2
    dpro profile -o traces/ -- torchrun --nproc_per_node 2 examples/parallel/train.py --strategy channel

``--batch`` is the global batch (data parallelism gives each rank batch/p samples);
``--loss-out`` writes the loss of every step (the same on every strategy for one seed);
``--timing-out`` each rank's step times (µs) after ``--timing-skip`` steps, with the
step's CPU split from the kernel's schedstat (``cpu_us``: the main thread's CPU time and
its wait for a core, the other threads' (gloo's) CPU time and wait; ``comm``: the wall
time the main thread spent inside torch.distributed calls and halo exchanges); under
``dpro profile`` (or with ``DPRO_TRACE_DIR``) dpro's recorder profiles a window of steps.
The pipeline's micro-batches (``--micro``) and stage cut points (``--cuts``) are what
``dpro oracle`` proposes for the launcher.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent))
from strategies import (  # noqa: E402
    STRATEGIES,
    WEIGHTED,
    ChannelNet,
    FilterNet,
    SpatialNet,
    allreduce_grads,
    balanced_stages,
    build_serial,
    chunk,
    gpipe_step,
    make_batch,
    make_groups,
    stage_of,
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--strategy", default="data",
                   help=f"one of {', '.join(STRATEGIES)}, or several separated by commas (run one after the other)")
    p.add_argument("--batch", type=int, default=32, help="global batch (default 32)")
    p.add_argument("--width", type=int, default=32, help="filters of conv2/conv3 (conv1: half)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--p2", type=int, default=2, help="hybrid strategies: ranks per model-parallel group")
    p.add_argument("--micro", type=int, default=4, help="pipeline: micro-batches")
    p.add_argument("--cuts", default=None, help="pipeline: comma-separated first layer index of stages 1..p-1")
    p.add_argument("--loss-out", default=None, help="write the losses here (rank 0)")
    p.add_argument("--timing-out", default=None, help="write this rank's step times (µs) here ({rank} is replaced)")
    p.add_argument("--timing-skip", type=int, default=4)
    args = p.parse_args()
    todo = args.strategy.split(",")
    bad = [s for s in todo if s not in STRATEGIES]
    if bad:
        p.error(f"unknown strategy {bad[0]!r}; choose from {', '.join(STRATEGIES)}")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {s: run(s, args, rank, world) for s in todo}
    if args.timing_out:
        Path(args.timing_out.format(rank=rank)).write_text(json.dumps(
            {"rank": rank, "world_size": world, "step_us": {s: r[1][args.timing_skip:] for s, r in results.items()},
             "cpu_us": {s: r[2][args.timing_skip:] for s, r in results.items()}}))
    if rank == 0:
        if args.loss_out:
            Path(args.loss_out).write_text(json.dumps({"world_size": world, "loss": {s: r[0] for s, r in results.items()}}))
        for s, (losses, *_) in results.items():
            print(f"{s} x{world}: {args.steps} steps, last loss {losses[-1]:.6f}")
    dist.barrier()
    dist.destroy_process_group()


def _schedstat() -> tuple[float, float, float, float]:
    """(main thread's CPU, its run-queue wait, the other threads' CPU, their wait), µs
    since they started (/proc/<pid>/task/*/schedstat; zeros where the kernel has none)."""
    got = [0.0, 0.0, 0.0, 0.0]
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return tuple(got)
    me = str(os.getpid())
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                cpu, wait = f.read().split()[:2]
        except (OSError, ValueError):
            continue
        k = 0 if t == me else 2
        got[k] += int(cpu) / 1e3
        got[k + 1] += int(wait) / 1e3
    return tuple(got)


class CommClock:
    """The wall time (µs) the main thread spends inside the collectives and point-to-point
    calls the strategies make (``torch.distributed``'s functions and strategies._exchange,
    wrapped while timing); DDP's bucketed all-reduce runs in its reducer, so its wait shows
    in the backward pass instead."""

    NAMES = ("all_reduce", "all_gather", "send", "recv", "broadcast")

    def __init__(self) -> None:
        import strategies

        self.us = 0.0
        self.saved = [(dist, n, getattr(dist, n)) for n in self.NAMES] + [(strategies, "_exchange",
                                                                           strategies._exchange)]
        for mod, name, f in self.saved:
            setattr(mod, name, self._timed(f))

    def _timed(self, f):
        def call(*a, **kw):
            t = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                self.us += (time.perf_counter() - t) * 1e6
        return call

    def close(self) -> None:
        for mod, name, f in self.saved:
            setattr(mod, name, f)


def run(s: str, args: argparse.Namespace, rank: int,
        world: int) -> tuple[list[float], list[float], list[dict[str, float]]]:
    """Train ``args.steps`` steps with strategy ``s``: (the global batch's loss per step, this
    rank's step µs, its CPU split per step: :func:`_schedstat`'s deltas when timing)."""
    serial = build_serial(args.seed, args.width)
    params_scale: list[tuple[list, object, float]] = []  # (params, group, scale) to all-reduce after backward
    if s == "data":
        model = DDP(serial)
    elif s in ("filter", "channel", "spatial"):
        g = make_groups(world)
        model = {"filter": FilterNet, "channel": ChannelNet}[s](serial, g.model, g.model_rank, g.p2) if s != "spatial" \
            else SpatialNet(serial, list(range(world)), g.model, g.model_rank)
        if s == "spatial":
            params_scale.append((model.spatial_parameters(), None, 1.0))
    elif s in ("data+filter", "data+spatial"):
        g = make_groups(args.p2)
        ranks = list(range(g.data_rank * g.p2, (g.data_rank + 1) * g.p2))
        if s == "data+filter":
            model = FilterNet(serial, g.model, g.model_rank, g.p2)
            params_scale.append((list(model.parameters()), g.data, 1.0 / g.p1))
        else:
            model = SpatialNet(serial, ranks, g.model, g.model_rank)
            params_scale.append((model.spatial_parameters(), None, 1.0 / g.p1))
            params_scale.append(([q for n, q in model.named_parameters() if n.startswith("fc.")], g.data, 1.0 / g.p1))
    else:  # pipeline
        layers = list(serial.named_children())
        cuts = [int(c) for c in args.cuts.split(",")] if args.cuts else balanced_stages(
            [float(sum(q.numel() for q in m.parameters())) for _, m in layers], world,
            [i for i, (n, _) in enumerate(layers) if n in WEIGHTED])  # every stage holds weights
        model = stage_of(serial, cuts, rank)
        mb = args.batch // args.micro
        shapes, x = [], torch.zeros(mb, *make_batch(args.seed, 0, 1)[0].shape[1:])
        with torch.no_grad():
            for i, (_, m) in enumerate(layers):
                x = m(x)
                if i + 1 in cuts:
                    shapes.append(tuple(x.shape))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    def no_profile(f):
        return f

    profile = no_profile
    if os.environ.get("DPRO_TRACE_DIR"):  # under `dpro profile`: dpro's recorder, its two lines
        import dpro

        profile = dpro.profile(dpro.Recorder(model))

    @profile
    def train_one_step(i: int) -> float:
        x, y = make_batch(args.seed, i, args.batch)
        opt.zero_grad()
        if s == "pipeline":
            loss = gpipe_step(model, rank, world, x, y, args.micro, shapes)
        else:
            if s in ("data", "data+filter", "data+spatial"):
                d, p1 = (rank, world) if s == "data" else (g.data_rank, g.p1)
                x, y = x[chunk(len(x), p1, d)], y[chunk(len(y), p1, d)]
            out = F.cross_entropy(model(x), y)
            out.backward()
            loss = float(out.detach())
        for params, group, scale in params_scale:
            allreduce_grads(params, group, scale)
        opt.step()
        return loss

    losses, step_us, cpu = [], [], []
    clock = CommClock() if args.timing_out else None
    for i in range(args.steps):
        c0 = _schedstat() if clock else None
        if clock:
            clock.us = 0.0
        t = time.perf_counter()
        losses.append(train_one_step(i))
        step_us.append((time.perf_counter() - t) * 1e6)
        if clock:
            d = [b - a for a, b in zip(c0, _schedstat())]
            cpu.append({"main_cpu": d[0], "main_wait": d[1], "threads_cpu": d[2], "threads_wait": d[3], "comm": clock.us})
    if clock:
        clock.close()
    # the loss of the global batch: data groups average theirs, the pipeline's last stage has it
    lt = torch.tensor(losses)
    if s == "pipeline":
        dist.broadcast(lt, world - 1)
    elif s in ("data", "data+filter", "data+spatial"):
        dist.all_reduce(lt)
        lt /= world
    return lt.tolist(), step_us, cpu


if __name__ == "__main__":
    main()
