"""Horovod (PyTorch, CPU, gloo) training loop: the Horovod twin of ``train_ddp.py``.

Launch with horovodrun (gloo controller, all ranks on this host)::

    horovodrun -np 2 --gloo -H localhost:2 --timeline-filename /tmp/hvd_timeline.json \\
        python examples/pytorch/train_horovod.py --model mlp --steps 20 --warmup 5 \\
        --profile-dir /tmp/trace --timing-out /tmp/timing_rank{rank}.json

(horovodrun's own options go before the command: ``--fusion-threshold-mb``,
``--cycle-time-ms``, ``--timeline-filename``, ``--timeline-mark-cycles``; beware that
horovodrun also parses the script's options and rejects ambiguous prefixes of its own.)

Horovod is built by ``scripts/install_horovod.sh`` (CPU only, gloo). ``horovodrun`` starts
the gloo rendezvous (HTTP) server and sets ``HOROVOD_RANK``, ``HOROVOD_SIZE``,
``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``PORT``, ``HOROVOD_CONTROLLER=gloo`` etc. for each rank.

One step is: ``zero_grad``, forward, loss, backward (``hvd.DistributedOptimizer`` starts
an asynchronous all-reduce per gradient from a hook as soon as the gradient is ready;
Horovod's background thread negotiates them every cycle and fuses ready tensors into one
fused all-reduce), ``optimizer.step()`` (waits for all reductions, then SGD, momentum
0.9). Each rank uses one intra-op thread. Initial weights are broadcast from rank 0 with
``hvd.broadcast_parameters`` (the models are seeded anyway; SGD momentum buffers start
empty on every rank, so no optimizer state is broadcast).

Outputs (same formats as ``train_ddp.py``):

* ``--profile-dir DIR``: ``torch.profiler`` (CPU, shapes recorded) over the ``--active``
  steps right after ``--warmup``; each rank writes ``DIR/rank{rank}.json.gz``.
* ``--timing-out FILE``: per-step wall-clock microseconds (``time.perf_counter()``, one
  step's start to the next one's) for every step after ``--warmup``; ``{rank}`` in FILE
  gives one file per rank, otherwise only rank 0 writes. Extra keys for Horovod:
  ``hvd_init_epoch_us`` (``time.time()`` in µs right after ``hvd.init()``),
  ``step_start_epoch_us`` (the same step boundaries as ``step_us``, on the Unix-epoch
  wall clock, ``len(step_us) + 1`` entries) and the Horovod knobs in effect.
* Horovod timeline: ``horovodrun --timeline-filename FILE`` (or ``HOROVOD_TIMELINE=FILE``
  in every rank's environment; add ``--timeline-mark-cycles`` for CYCLE_START markers).
  Horovod itself writes it, on **rank 0 only** (the coordinator), record by record (the
  file is valid JSON between records, even while the job runs); ``hvd.shutdown()``, called
  at the end, closes it. Besides the gradients (``allreduce.<param>``) it shows the initial
  ``broadcast.<param>`` and the two ``hvd.barrier()`` calls (``barrier.noname``; the last
  one is still open when the file is closed). Its timestamps are
  µs since Horovod's start; the file's first record (``pid`` 0, ``process_name``) carries
  ``start_time_since_epoch_in_micros``, the same Unix-epoch wall clock that
  ``torch.profiler`` uses (``ts + baseTimeNanoseconds / 1000``), so the two line up
  directly (see ``dpro.importers.horovod.timeline``).
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
    p.add_argument("--dpro-strategy", default=None,
                   help="a `dpro optimize -o` directory: use its horovod.json (groups, fusion threshold)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--profile-dir", type=Path, default=None, help="write rank{rank}.json.gz here")
    p.add_argument("--active", type=int, default=5, help="profiled steps (with --profile-dir)")
    p.add_argument("--timing-out", default=None, help="per-step timing JSON ({rank} is substituted)")
    args = p.parse_args(argv)
    if args.batch_size is None:
        args.batch_size = DEFAULT_BATCH_SIZE[args.model]
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


@contextlib.contextmanager
def maybe_profile(args: argparse.Namespace) -> Iterator[Any]:
    """A ``torch.profiler.profile`` covering ``--active`` steps after ``--warmup``, or a no-op.

    Same schedule as ``train_ddp.py``; the caller calls ``.step()`` after every step.
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


def train(args: argparse.Namespace, hvd: Any) -> tuple[list[float], list[float], dict[str, Any]]:
    """Run the training loop.

    Returns (step start times, profiler bookkeeping time per step, model info); times in s
    (``time.perf_counter()``). ``starts`` has ``steps + 1`` entries.
    """
    rank = hvd.rank()
    model, make_batch, loss_fn = build(args.model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    groups = None
    if args.dpro_strategy:
        from dpro.apply import horovod_groups

        groups = horovod_groups(args.dpro_strategy, model.named_parameters())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), groups=groups)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    batches = [make_batch(args.batch_size) for _ in range(NUM_BATCHES)]
    if rank == 0:
        print(f"[train_horovod] {args.model}: {num_parameters(model):,} params, "
              f"batch {args.batch_size}/rank, {args.steps} steps, world {hvd.size()}", flush=True)
    hvd.barrier()  # start all ranks together (outside the timed steps)
    starts: list[float] = []
    prof_s: list[float] = []
    with maybe_profile(args) as prof:
        for step in range(args.steps):
            starts.append(time.perf_counter())
            x, y = batches[step % NUM_BATCHES]
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            t_prof = time.perf_counter()
            if prof is not None:
                prof.step()
            prof_s.append(time.perf_counter() - t_prof)
        starts.append(time.perf_counter())
    if prof is not None:
        export_trace(prof, args.profile_dir, rank)
    info = {
        "num_parameters": num_parameters(model),
        # Horovod names a gradient's all-reduce "allreduce." + the parameter name.
        "grad_tensor_names": [f"allreduce.{n}" for n, p in model.named_parameters() if p.requires_grad],
        "grad_tensor_bytes": [p.numel() * p.element_size()
                              for _, p in model.named_parameters() if p.requires_grad],
    }
    return starts, prof_s, info


def timing_record(args: argparse.Namespace, hvd: Any, starts: list[float], prof_s: list[float],
                  info: dict[str, Any], epoch_minus_perf_us: float,
                  init_epoch_us: float) -> dict[str, Any]:
    """The JSON written by ``--timing-out``: ``train_ddp.py``'s keys plus Horovod's."""
    import horovod

    w = args.warmup
    step_us = [(b - a) * 1e6 for a, b in zip(starts[w:], starts[w + 1:])]
    profiled = args.profile_dir is not None
    return {
        "rank": hvd.rank(),
        "world_size": hvd.size(),
        "model": args.model,
        "batch_size": args.batch_size,
        **info,
        "steps": args.steps,
        "warmup": w,
        "backend": "gloo",
        "framework": "horovod",
        "horovod_version": horovod.__version__,
        "horovod_timeline": os.environ.get("HOROVOD_TIMELINE"),
        "horovod_fusion_threshold": os.environ.get("HOROVOD_FUSION_THRESHOLD"),
        "horovod_cycle_time_ms": os.environ.get("HOROVOD_CYCLE_TIME"),
        "num_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "host": platform.node(),
        "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME")
        or os.environ.get("HOROVOD_GLOO_IFACE"),
        "profiled": profiled,
        "active_steps": [0, args.active] if profiled else None,
        "step_us": step_us,
        "profiler_us": [s * 1e6 for s in prof_s[w:]],
        # Clock anchors (Unix-epoch wall clock, µs) for lining up with the Horovod timeline.
        "hvd_init_epoch_us": init_epoch_us,
        "step_start_epoch_us": [s * 1e6 + epoch_minus_perf_us for s in starts[w:]],
    }


def write_timing(pattern: str, record: dict[str, Any]) -> None:
    """Write ``record`` to ``pattern`` (``{rank}`` substituted); without ``{rank}`` only rank 0."""
    rank = record["rank"]
    if "{rank}" not in pattern and rank != 0:
        return
    path = Path(pattern.replace("{rank}", str(rank)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")


def epoch_minus_perf_counter_us() -> float:
    """``time.time() - time.perf_counter()`` in µs (best of a few reads, to map perf_counter to epoch)."""
    best: tuple[float, float] | None = None
    for _ in range(5):
        a = time.perf_counter()
        e = time.time()
        b = time.perf_counter()
        if best is None or b - a < best[0]:
            best = (b - a, e - (a + b) / 2)
    assert best is not None
    return best[1] * 1e6


def main(argv: list[str] | None = None) -> None:
    """Entry point (one process per rank)."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    try:
        import horovod.torch as hvd
    except ImportError as e:
        raise SystemExit(f"train_horovod.py: horovod.torch is not importable ({e}); "
                         "run scripts/install_horovod.sh") from e
    if "HOROVOD_RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ:
        print("[train_horovod] warning: no HOROVOD_RANK in the environment; running as a "
              "single process (launch with horovodrun)", file=sys.stderr, flush=True)
    if args.dpro_strategy:
        from dpro.apply import horovod_env

        os.environ.update(horovod_env(args.dpro_strategy))  # read by hvd.init()
    hvd.init()
    init_epoch_us = time.time() * 1e6
    try:
        starts, prof_s, info = train(args, hvd)
        record = timing_record(args, hvd, starts, prof_s, info,
                               epoch_minus_perf_counter_us(), init_epoch_us)
        if args.timing_out:
            write_timing(args.timing_out, record)
        if hvd.rank() == 0:
            steps = sorted(record["step_us"])
            print(f"[train_horovod] world {hvd.size()}: median step {steps[len(steps) // 2] / 1e3:.1f} ms "
                  f"over {len(steps)} steps", flush=True)
        hvd.barrier()
    finally:
        hvd.shutdown()  # flushes and closes the timeline file on rank 0


if __name__ == "__main__":
    main()
