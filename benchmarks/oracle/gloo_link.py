"""Calibrate what the oracle charges on this machine (run under torchrun); rank 0 writes the samples.

    torchrun --nproc_per_node 2 benchmarks/oracle/gloo_link.py --out samples.json

Collectives, every rank (the world of the run): ``allreduce`` (``dist.all_reduce``),
``allgather`` (``dist.all_gather`` into a list, as examples/parallel/ calls it) and
``exchange`` (each rank posts isend/irecv of one message to each chain neighbour and waits:
the spatial halo exchange, ``strategies._exchange``). Host ops, rank 0 alone while the
others wait (one core; the oracle applies its own core sharing): ``cat`` (torch.cat of p
parts along the channels), ``slice`` (a channel slice made contiguous), ``clone``,
``zeros`` (``zeros_like``), and ``function_us`` (one autograd.Function forward and backward).

Every size is timed ``--reps`` times in each of ``--rounds`` rounds, the sizes in a new
shuffled order per round, after a warm-up (so a slow spell of the shared host hits a few
samples of every size rather than all samples of one); a collective's sample is the mean
over the ranks of one call (after a barrier). Every sample is kept: the oracle fits each
kind by least absolute deviations over all of them (dpro/oracle/calibration.py).

``samples.json``: ``{"world_size": n, "samples": [[bytes, median µs], ...]`` (all-reduce,
as before), ``"raw": {kind: [[bytes, µs], ...]}, "function_us": [...]}``; an all-gather's
bytes are its whole result, an exchange's one message.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

SIZES = (1 << 10, 1 << 12, 1 << 14, 1 << 15, 1 << 16, 1 << 17, 1 << 18, 1 << 19, 1 << 20, 1 << 21)
HOST_SIZES = (1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22)
KINDS = ("allreduce", "allgather", "exchange")


def _collective(kind: str, t: torch.Tensor, parts: list[torch.Tensor], rank: int, n: int) -> None:
    if kind == "allreduce":
        dist.all_reduce(t)
    elif kind == "allgather":
        dist.all_gather(parts, t)
    else:
        reqs = [dist.isend(t, r) for r in (rank - 1, rank + 1) if 0 <= r < n]
        reqs += [dist.irecv(parts[i], r) for i, r in enumerate(x for x in (rank - 1, rank + 1) if 0 <= x < n)]
        for q in reqs:
            q.wait()


def _busy(us: float, a: torch.Tensor) -> None:
    """Compute for ``us`` µs (small matmuls), as a training step does between its collectives."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        torch.mm(a, a)


def collectives(reps: int, rounds: int, warmup: int, seed: int, compute_us: float = 0.0) -> dict[str, list[list[float]]]:
    """Every kind at every size: [[bytes, µs mean over ranks], ...] (all samples); with
    ``compute_us``, every call comes after that much compute (after the barrier)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    bufs = {s: (torch.ones(s // 4), [torch.empty(s // 4) for _ in range(n)]) for s in SIZES}
    order = [(k, s) for k in KINDS for s in SIZES]
    for k, s in order[:: max(1, len(SIZES) // 3)]:  # warm-up: connections, buffers, code paths
        for _ in range(warmup):
            _collective(k, bufs[s][0], bufs[s][1], rank, n)
    rng = random.Random(seed)  # the same order on every rank
    mat = torch.randn(64, 64)
    mine: list[float] = []
    plan: list[tuple[str, int]] = []
    for _ in range(rounds):
        rng.shuffle(order)
        for k, s in order:
            for _ in range(reps):
                dist.barrier()
                if compute_us:
                    _busy(compute_us, mat)
                t0 = time.perf_counter()
                _collective(k, bufs[s][0], bufs[s][1], rank, n)
                mine.append((time.perf_counter() - t0) * 1e6)
                plan.append((k, s))
    every = [torch.empty(len(mine), dtype=torch.float64) for _ in range(n)]
    dist.all_gather(every, torch.tensor(mine, dtype=torch.float64))
    mean = torch.stack(every).mean(0).tolist()
    out: dict[str, list[list[float]]] = {k: [] for k in KINDS}
    for (k, s), t in zip(plan, mean):  # an all-gather's bytes: its whole result, as in the formulas
        out[k].append([s * n if k == "allgather" else s, t])
    return out


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def _timed(f, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def host_ops(reps: int, rounds: int, n: int, seed: int) -> tuple[dict[str, list[list[float]]], list[float]]:
    """The host ops of examples/parallel/ (one core): [[bytes, µs], ...] per op, and the
    µs of one autograd.Function (forward + backward) per sample."""
    p = max(2, n)
    ops = {
        "cat": lambda parts, whole: torch.cat(parts, dim=1),
        "slice": lambda parts, whole: whole[:, : whole.shape[1] // p].contiguous(),
        "clone": lambda parts, whole: whole.clone(),
        "zeros": lambda parts, whole: torch.zeros_like(whole),
    }
    tensors = {}
    for s in HOST_SIZES:  # (batch 8, 16 p channels, rows, 16 columns) floats: s bytes in all
        rows = max(1, s // (4 * 8 * 16 * p * 16))
        whole = torch.randn(8, 16 * p, rows, 16)
        tensors[s] = ([c.contiguous() for c in whole.chunk(p, dim=1)], whole)
    plan = [(k, s) for k in ops for s in HOST_SIZES]
    rng = random.Random(seed)
    raw: dict[str, list[list[float]]] = {k: [] for k in ops}
    for k, s in plan:  # warm-up
        _timed(lambda: ops[k](*tensors[s]), 3)
    fn: list[float] = []
    x = torch.randn(8, 16, requires_grad=True)
    chain = 20
    for _ in range(rounds):
        rng.shuffle(plan)
        for k, s in plan:
            nb = tensors[s][1].numel() * 4 // (p if k == "slice" else 1)
            raw[k] += [[nb, t] for t in _timed(lambda: ops[k](*tensors[s]), reps)]
        # a chain of identity Functions vs none, forward + backward: per Function
        with_fn = _timed(lambda: _chain(x, chain).sum().backward(), reps)
        without = _timed(lambda: _chain(x, 0).sum().backward(), reps)
        fn.append(max(0.0, (statistics.median(with_fn) - statistics.median(without)) / chain))
    return raw, fn


def _chain(x: torch.Tensor, k: int) -> torch.Tensor:
    y = x * 1.0
    for _ in range(k):
        y = _Identity.apply(y)
    return y


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=5, help="calls per size and round")
    p.add_argument("--rounds", type=int, default=6, help="rounds over every size, each in a new order")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-host", action="store_true", help="collectives only")
    p.add_argument("--compute-us", type=float, default=0.0, help="compute before every timed call (µs)")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    raw = collectives(args.reps, args.rounds, args.warmup, args.seed, args.compute_us)
    host, fn = ({}, []) if args.no_host or rank else host_ops(args.reps * 2, args.rounds, n, args.seed)
    dist.barrier()
    if rank == 0:
        ar = raw["allreduce"]
        med = [[s, statistics.median(t for b, t in ar if b == s)] for s in SIZES]
        Path(args.out).write_text(json.dumps({"world_size": n, "samples": med, "raw": raw | host,
                                              "function_us": fn, "reps": args.reps, "rounds": args.rounds}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
