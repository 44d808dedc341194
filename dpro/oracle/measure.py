"""Measure the oracle's calibration on this machine (``dpro calibrate --oracle``).

Run in every rank of an initialised ``torch.distributed`` group (:func:`rank_samples`:
under torchrun, benchmarks/oracle/netns_launch.py, or :func:`measure`'s local processes);
rank 0 gets the samples that dpro/oracle/calibration.py fits.

Collectives, every rank: ``allreduce`` (``dist.all_reduce``), ``allgather``
(``dist.all_gather`` into a list, as examples/parallel/ calls it) and ``exchange`` (each rank
posts isend/irecv of one message to each chain neighbour and waits: the spatial halo
exchange, ``strategies._exchange``). From 4 processes also ``pair`` (ranks 0 and 1
all-reduce while the others wait) and ``concurrent`` (0-1 and 2-3 all-reduce at once): the
ratio says whether two collectives of disjoint ranks share a link (loopback, one NIC) or
each rank has its own (calibration.topology_of). Host ops, rank 0 alone while the others
wait (one core; the oracle applies its own core sharing): ``cat`` (torch.cat of p parts
along the channels), ``slice`` (a channel slice made contiguous), ``clone``, ``zeros``
(``zeros_like``), and ``function_us`` (one autograd.Function forward and backward).

Every size is timed ``reps`` times in each of ``rounds`` rounds, the sizes in a new
shuffled order per round, after a warm-up (a slow spell of the shared host hits a few
samples of every size rather than all samples of one). Before every timed call the ranks
stay idle ``idle_us`` (a token bucket on the link refills, as it does during a training
step's compute: calibration.fit_collectives then sees its burst), then meet at a barrier
(idle after it, each rank's own wake-up would be in the call's time);
a collective's sample is the mean over the ranks taking part of one call.

**Back-to-back calls** (``stream_calls`` > 0, the ``stream_*`` samples): a training step
pays its halo exchanges and pipeline sends one after another, without a barrier between
them. Such a sample is ``stream_calls`` calls in a row after the same idle and barrier,
divided by ``stream_calls``, for ``stream_p2p`` (blocking send/recv pairs 0→1, 2→3, ...:
the pipeline's ``dist.send`` / ``dist.recv``, the blocking forms of isend/irecv),
``stream_exchange`` (the halo exchange) and ``stream_allreduce`` (a collective, for
comparison), at :data:`STREAM_SIZES`. They are items of the same shuffled rounds as the
isolated calls, so that they sample the host over the whole calibration (the shared VM
has slow and fast spells of seconds: samples taken in one block of 2 s moved 2-3x between
launches); calibration.fit_stream takes the median over the rounds.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from dpro.ports import free_port

#: message sizes (bytes): both sides of a 128 KiB token-bucket burst (netns caps) with room to fit its knee
SIZES = (1 << 10, 1 << 14, 1 << 15, 1 << 16, 3 << 15, 1 << 17, 3 << 16, 1 << 18, 1 << 19, 1 << 20, 1 << 21)
HOST_SIZES = (1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22)
KINDS = ("allreduce", "allgather", "exchange")
#: the topology probe's sizes: large, so that the wire (not the per-call overhead) decides
PAIR_SIZES = (1 << 19, 1 << 20, 1 << 21)
#: back-to-back calls (``stream_calls``): the sizes of halo rows and pipeline activations (bytes)
STREAM_SIZES = (1 << 10, 1 << 13, 1 << 15, 1 << 17)
STREAM_KINDS = ("p2p", "exchange", "allreduce")


def _collective(kind: str, t: Any, parts: list, rank: int, n: int, groups: tuple) -> bool:
    """Run one call of ``kind``; False when this rank takes no part in it."""
    import torch.distributed as dist

    if kind == "allreduce":
        dist.all_reduce(t)
    elif kind == "allgather":
        dist.all_gather(parts, t)
    elif kind == "exchange":
        peers = [r for r in (rank - 1, rank + 1) if 0 <= r < n]
        reqs = [dist.isend(t, r) for r in peers] + [dist.irecv(parts[i], r) for i, r in enumerate(peers)]
        for q in reqs:
            q.wait()
    else:  # "pair": group 0-1 alone; "concurrent": 0-1 and 2-3 at once
        mine = 0 if rank < 2 else 1 if rank < 4 else None
        if mine is None or (kind == "pair" and mine):
            return False
        dist.all_reduce(t, group=groups[mine])
    return True


def _stream_call(kind: str, t: Any, parts: list, rank: int, n: int) -> bool:
    """One call of a back-to-back stream; False when this rank takes no part."""
    import torch.distributed as dist

    if kind == "p2p":  # pairs 0->1, 2->3, ...: the pipeline's blocking send / recv
        if rank % 2 == 0 and rank + 1 < n:
            dist.send(t, rank + 1)
        elif rank % 2:
            dist.recv(parts[0], rank - 1)
        else:
            return False
        return True
    return _collective(kind, t, parts, rank, n, ())


def _busy(us: float, a: Any) -> None:
    """Compute for ``us`` µs (small matmuls), as a training step does between its collectives."""
    import torch

    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        torch.mm(a, a)


def collectives(reps: int, rounds: int, warmup: int, seed: int, *, compute_us: float = 0.0, idle_us: float = 0.0,
                sizes: tuple[int, ...] = SIZES, stream_calls: int = 0,
                stream_sizes: tuple[int, ...] = STREAM_SIZES) -> dict[str, list[list[float]]] | None:
    """Every kind at every size: on rank 0 ``{kind: [[bytes, µs mean over the ranks taking
    part], ...]}`` (all samples; an all-gather's bytes its whole result), with
    ``stream_calls`` also ``{"stream_" + kind: [[round, bytes of one message, µs per call],
    ...]}`` (:data:`STREAM_KINDS`, ``stream_calls`` calls in a row), None elsewhere."""
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    groups = (dist.new_group([0, 1]), dist.new_group([2, 3])) if n >= 4 else ()
    kinds = KINDS + (("pair", "concurrent") if groups else ())
    every_size = sorted(set(sizes) | (set(PAIR_SIZES) if groups else set()))
    every_size = sorted(set(every_size) | (set(stream_sizes) if stream_calls else set()))
    bufs = {s: (torch.ones(s // 4), [torch.empty(s // 4) for _ in range(n)]) for s in every_size}
    order = [(k, s) for k in KINDS for s in sizes] + [(k, s) for k in kinds[len(KINDS):] for s in PAIR_SIZES]
    for k, s in order[:: max(1, len(sizes) // 3)]:  # warm-up: connections, buffers, code paths
        for _ in range(warmup):
            dist.barrier()
            _collective(k, bufs[s][0], bufs[s][1], rank, n, groups)
    if stream_calls:
        order += [(f"stream_{k}", s) for k in STREAM_KINDS for s in stream_sizes]
        for s in stream_sizes:
            dist.barrier()
            for _ in range(warmup):
                _stream_call("p2p", bufs[s][0], bufs[s][1], rank, n)
    rng = random.Random(seed)  # the same order on every rank
    mat = torch.randn(64, 64)
    mine: list[float] = []
    plan: list[tuple[int, str, int]] = []
    for r in range(rounds):
        rng.shuffle(order)
        for k, s in order:
            for _ in range(reps):
                if idle_us:  # before the barrier: the ranks leave it together, not as each wakes up
                    time.sleep(idle_us * 1e-6)
                dist.barrier()
                if compute_us:
                    _busy(compute_us, mat)
                t0 = time.perf_counter()
                if k.startswith("stream_"):  # back to back: the time per call
                    took = all([_stream_call(k[7:], bufs[s][0], bufs[s][1], rank, n) for _ in range(stream_calls)])
                    mine.append((time.perf_counter() - t0) * 1e6 / stream_calls if took else float("nan"))
                else:
                    took = _collective(k, bufs[s][0], bufs[s][1], rank, n, groups)
                    mine.append((time.perf_counter() - t0) * 1e6 if took else float("nan"))
                plan.append((r, k, s))
    every = [torch.empty(len(mine), dtype=torch.float64) for _ in range(n)]
    dist.all_gather(every, torch.tensor(mine, dtype=torch.float64))
    if rank:
        return None
    mean = torch.nanmean(torch.stack(every), 0).tolist()
    out: dict[str, list[list[float]]] = {k: [] for k in kinds}
    for (r, k, s), t in zip(plan, mean):
        if k.startswith("stream_"):
            out.setdefault(k, []).append([r, s, t])
        else:
            out[k].append([s * n if k == "allgather" else s, t])
    return out


def _timed(f: Any, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def host_ops(reps: int, rounds: int, n: int, seed: int,
             sizes: tuple[int, ...] = HOST_SIZES) -> tuple[dict[str, list[list[float]]], list[float]]:
    """The host ops of examples/parallel/ (one core): [[bytes, µs], ...] per op, and the
    µs of one autograd.Function (forward + backward) per round."""
    import torch

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return g

    def chain(x: Any, k: int) -> Any:
        y = x * 1.0
        for _ in range(k):
            y = Identity.apply(y)
        return y

    p = max(2, n)
    ops = {
        "cat": lambda parts, whole: torch.cat(parts, dim=1),
        "slice": lambda parts, whole: whole[:, : whole.shape[1] // p].contiguous(),
        "clone": lambda parts, whole: whole.clone(),
        "zeros": lambda parts, whole: torch.zeros_like(whole),
    }
    tensors = {}
    for s in sizes:  # (batch 8, 16 p channels, rows, 16 columns) floats: s bytes in all
        rows = max(1, s // (4 * 8 * 16 * p * 16))
        whole = torch.randn(8, 16 * p, rows, 16)
        tensors[s] = ([c.contiguous() for c in whole.chunk(p, dim=1)], whole)
    plan = [(k, s) for k in ops for s in sizes]
    rng = random.Random(seed)
    raw: dict[str, list[list[float]]] = {k: [] for k in ops}
    for k, s in plan:  # warm-up
        _timed(lambda: ops[k](*tensors[s]), 3)
    fn: list[float] = []
    x = torch.randn(8, 16, requires_grad=True)
    links = 20
    for _ in range(rounds):
        rng.shuffle(plan)
        for k, s in plan:
            nb = tensors[s][1].numel() * 4 // (p if k == "slice" else 1)
            raw[k] += [[nb, t] for t in _timed(lambda: ops[k](*tensors[s]), reps)]
        # a chain of identity Functions vs none, forward + backward: per Function
        with_fn = _timed(lambda: chain(x, links).sum().backward(), reps)
        without = _timed(lambda: chain(x, 0).sum().backward(), reps)
        fn.append(max(0.0, (statistics.median(with_fn) - statistics.median(without)) / links))
    return raw, fn


def rank_samples(*, reps: int = 5, rounds: int = 6, warmup: int = 5, seed: int = 0, compute_us: float = 0.0,
                 idle_us: float = 0.0, host: bool = True, sizes: tuple[int, ...] = SIZES,
                 host_sizes: tuple[int, ...] = HOST_SIZES, stream_calls: int = 8,
                 stream_sizes: tuple[int, ...] = STREAM_SIZES) -> dict | None:
    """The calibration's samples, in every rank of the default group; rank 0 gets
    ``{"world_size", "raw": {kind: [[bytes, µs], ...], "stream_" + kind: [[round, bytes, µs], ...]},
    "function_us": [...], ...}``, others None. ``stream_calls`` 0: no back-to-back samples."""
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    raw = collectives(reps, rounds, warmup, seed, compute_us=compute_us, idle_us=idle_us, sizes=sizes,
                      stream_calls=stream_calls, stream_sizes=stream_sizes)
    hraw, fn = host_ops(reps * 2, rounds, n, seed, host_sizes) if host and rank == 0 else ({}, [])
    dist.barrier()
    if raw is None:
        return None
    return {"world_size": n, "raw": raw | hraw, "function_us": fn, "reps": reps, "rounds": rounds,
            "idle_us": idle_us, "compute_us": compute_us,
            "stream_calls": stream_calls}


def _spawned(rank: int, world: int, port: int, kw: dict, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        got = rank_samples(**kw)
    finally:
        dist.destroy_process_group()
    if got is not None:
        Path(out).write_text(json.dumps(got))



def measure(world: int, **kw: Any) -> dict:
    """:func:`rank_samples` in ``world`` local processes over gloo (loopback); rank 0's samples."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="dpro-oracle-calibrate-") as tmp:
        out = os.path.join(tmp, "samples.json")
        # fork: the ranks inherit the imported torch (spawn re-imports it in each, seconds on a busy host)
        mp.start_processes(_spawned, args=(world, free_port(), kw, out), nprocs=world, join=True, start_method="fork")
        return json.loads(Path(out).read_text())


def parse_nprocs(text: str, rounds: int = 1, idle_us: float = 0.0) -> list[int]:
    """``--nprocs 2,4`` as a sorted list (DproInputError: a count below 2, ``rounds`` < 1, ``idle_us`` < 0)."""
    from dpro.errors import DproInputError

    try:
        counts = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise DproInputError(None, f"--nprocs {text!r}: process counts, e.g. 2,4") from None
    if not counts or counts[0] < 2:
        raise DproInputError(None, f"--nprocs {text!r}: every process count must be >= 2")
    if rounds < 1 or idle_us < 0:
        raise DproInputError(None, f"--rounds {rounds} / --idle-us {idle_us:g}: at least 1 round, idle >= 0")
    return counts


def calibrate_oracle(nprocs: list[int], *, topology: str = "measure", tick: Any = None, **kw: Any) -> dict:
    """Measure at every process count of ``nprocs`` on this machine (the host costs at the
    first) and return the platform file (calibration.platform_from_samples)."""
    from dpro.oracle.calibration import platform_from_samples

    got = {}
    for i, n in enumerate(nprocs):
        got[n] = measure(n, **kw, host=i == 0)
        if tick is not None:
            tick(f"{n} processes")
    return platform_from_samples(got, cores=os.cpu_count(), topology=topology)
