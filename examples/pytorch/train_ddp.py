"""Plain PyTorch DDP (gloo) training loop used by the dpro examples and fidelity harness.

Launch with torchrun::

    torchrun --nproc_per_node 2 examples/pytorch/train_ddp.py --model mlp --steps 20 \\
        --warmup 5 --profile-dir /tmp/trace --timing-out /tmp/timing_rank{rank}.json

or start each rank yourself with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``
(and optionally ``LOCAL_RANK``, ``GLOO_SOCKET_IFNAME``) set in the environment; torchrun is
not required (the fidelity harness runs ranks in network namespaces this way).

One step is: ``zero_grad``, forward, loss, backward (DDP all-reduces gradients in buckets),
``optimizer.step()`` (SGD, momentum 0.9). Nothing synchronises inside a step beyond what
DDP does. Each rank uses one intra-op thread.

Outputs:

* ``--profile-dir DIR``: the ``--active`` steps right after ``--warmup`` are profiled with
  ``torch.profiler`` (CPU activity, shapes recorded); each rank writes its Chrome trace to
  ``DIR/rank{rank}.json.gz``. The trace is exported after the training loop has finished,
  so exporting costs no step time. Stopping the profiler (collecting the events) happens in
  ``prof.step()`` at the end of the last active step and is part of that step's time;
  ``profiler_us`` in the timing file says how long it took.
* ``--timing-out FILE``: per-step wall-clock durations in microseconds, measured with
  ``time.perf_counter()`` from one step's start to the next step's start, for every step
  after ``--warmup``. If FILE contains ``{rank}`` every rank writes its own file, otherwise
  only rank 0 writes.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import DEFAULT_BATCH_SIZE, MODEL_NAMES, build, num_parameters  # noqa: E402

NUM_BATCHES = 4  # distinct pre-generated batches, cycled through (keeps data gen out of steps)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", choices=MODEL_NAMES, default="mlp")
    p.add_argument("--batch-size", type=int, default=None, help="per-rank batch (default: per model)")
    p.add_argument("--steps", type=int, default=20, help="total steps, warm-up included")
    p.add_argument("--warmup", type=int, default=5, help="steps before timing/profiling starts")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP gradient bucket size in MiB (default: DDP's, 25 MiB with a 1 MiB first bucket)")
    p.add_argument("--dpro-strategy", default=None,
                   help="a `dpro optimize -o` directory: take bucket_cap_mb from its ddp.json")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--profile-dir", type=Path, default=None, help="write rank{rank}.json.gz here")
    p.add_argument("--active", type=int, default=5, help="profiled steps (with --profile-dir)")
    p.add_argument("--timing-out", default=None, help="per-step timing JSON ({rank} is substituted)")
    args = p.parse_args(argv)
    if args.batch_size is None:
        args.batch_size = DEFAULT_BATCH_SIZE[args.model]
    if args.dpro_strategy:
        from dpro.apply import ddp_kwargs

        args.bucket_cap_mb = ddp_kwargs(args.dpro_strategy).get("bucket_cap_mb")  # None: DDP's default
    _check_args(p, args)
    return args


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject inconsistent step counts."""
    if args.warmup < 0 or args.steps <= args.warmup:
        p.error("need 0 <= --warmup < --steps")
    if args.profile_dir is not None:
        if args.warmup < 1:
            p.error("--profile-dir needs --warmup >= 1 (one profiler warm-up step)")
        if args.active < 1 or args.warmup + args.active > args.steps:
            p.error("need 1 <= --active and --warmup + --active <= --steps")


def init_distributed() -> tuple[int, int]:
    """Join the gloo process group described by the env vars torchrun sets; return (rank, world)."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise SystemExit(f"train_ddp.py: missing env vars {missing} (launch with torchrun)")
    dist.init_process_group(backend="gloo", init_method="env://")
    return dist.get_rank(), dist.get_world_size()


@contextlib.contextmanager
def maybe_profile(args: argparse.Namespace) -> Iterator[Any]:
    """A ``torch.profiler.profile`` covering ``--active`` steps after ``--warmup``, or a no-op.

    Schedule: steps ``0..warmup-2`` skipped, step ``warmup-1`` is the profiler's warm-up,
    steps ``warmup..warmup+active-1`` recorded. The caller must call ``.step()`` after
    every training step.
    """
    if args.profile_dir is None:
        yield None
        return
    from torch.profiler import ProfilerActivity, profile, schedule

    sched = schedule(skip_first=args.warmup - 1, wait=0, warmup=1, active=args.active, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=sched) as prof:
        yield prof


def export_trace(prof: Any, profile_dir: Path, rank: int) -> Path:
    """Write the profiler's Chrome trace to ``profile_dir/rank{rank}.json.gz`` (via a temp file)."""
    profile_dir.mkdir(parents=True, exist_ok=True)
    dest = profile_dir / f"rank{rank}.json.gz"
    with tempfile.TemporaryDirectory(prefix="dpro-trace-") as tmp:
        raw = Path(tmp) / f"rank{rank}.json"
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as fin, gzip.open(dest, "wb", compresslevel=9) as fout:
            shutil.copyfileobj(fin, fout)
    return dest


def bucket_bytes(ddp: DDP) -> list[int] | None:
    """Sizes of DDP's gradient buckets after its first-iteration rebuild (private API: may be None)."""
    try:
        info = ddp._get_ddp_logging_data()
        sizes = info.get("rebuilt_bucket_sizes") or info.get("bucket_sizes")
        return [int(x) for x in str(sizes).split(",")]
    except Exception:  # noqa: BLE001 - purely informational
        return None


def train(args: argparse.Namespace, rank: int) -> tuple[list[float], list[float], dict[str, Any]]:
    """Run the training loop.

    Returns (step start times, profiler bookkeeping time per step, model info); times in s.
    ``starts`` has ``steps + 1`` entries: each step's start and the end of the last step.
    """
    model, make_batch, loss_fn = build(args.model)
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    batches = [make_batch(args.batch_size) for _ in range(NUM_BATCHES)]
    if rank == 0:
        print(f"[train_ddp] {args.model}: {num_parameters(model):,} params, "
              f"batch {args.batch_size}/rank, {args.steps} steps", flush=True)
    dist.barrier()  # start all ranks together (outside the timed steps)
    starts: list[float] = []
    prof_s: list[float] = []
    with maybe_profile(args) as prof:
        for step in range(args.steps):
            starts.append(time.perf_counter())
            x, y = batches[step % NUM_BATCHES]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            t_prof = time.perf_counter()
            if prof is not None:
                prof.step()
            prof_s.append(time.perf_counter() - t_prof)
        starts.append(time.perf_counter())
    if prof is not None:
        export_trace(prof, args.profile_dir, rank)
    info = {"num_parameters": num_parameters(model), "ddp_bucket_bytes": bucket_bytes(ddp)}
    return starts, prof_s, info


def timing_record(args: argparse.Namespace, rank: int, world: int, starts: list[float],
                  prof_s: list[float], info: dict[str, Any]) -> dict[str, Any]:
    """The JSON written by ``--timing-out``: per-step microseconds after warm-up plus metadata."""
    w = args.warmup
    step_us = [(b - a) * 1e6 for a, b in zip(starts[w:], starts[w + 1:])]
    profiled = args.profile_dir is not None
    return {
        "rank": rank,
        "world_size": world,
        "model": args.model,
        "batch_size": args.batch_size,
        "bucket_cap_mb": args.bucket_cap_mb,
        **info,
        "steps": args.steps,
        "warmup": w,
        "backend": "gloo",
        "num_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "host": platform.node(),
        "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
        "profiled": profiled,
        # Index range [start, end) into step_us of the steps captured in the trace.
        "active_steps": [0, args.active] if profiled else None,
        "step_us": step_us,
        # wall clock (time.time(), s) when the first timed step started: lines the steps up with
        # other records of the machine (benchmarks/machine_drift.py)
        "first_step_unix_s": time.time() - (time.perf_counter() - starts[w]) if len(starts) > w else None,
        "profiler_us": [s * 1e6 for s in prof_s[w:]],
    }


def write_timing(pattern: str, record: dict[str, Any]) -> None:
    """Write ``record`` to ``pattern`` (``{rank}`` substituted); without ``{rank}`` only rank 0."""
    rank = record["rank"]
    if "{rank}" not in pattern and rank != 0:
        return
    path = Path(pattern.replace("{rank}", str(rank)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    """Entry point (one process per rank)."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    rank, world = init_distributed()
    try:
        starts, prof_s, info = train(args, rank)
        record = timing_record(args, rank, world, starts, prof_s, info)
        if args.timing_out:
            write_timing(args.timing_out, record)
        if rank == 0:
            steps = sorted(record["step_us"])
            print(f"[train_ddp] world {world}: median step {steps[len(steps) // 2] / 1e3:.1f} ms "
                  f"over {len(steps)} steps", flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
