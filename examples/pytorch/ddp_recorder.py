"""PyTorch DDP (gloo) training with dpro's two-line recorder.

    dpro profile -o traces/ -- torchrun --nproc_per_node 2 examples/pytorch/ddp_recorder.py --model mlp
    dpro replay traces/
    dpro report traces/ -o report.html       # the HTML report (docs/report.md)

The two dpro lines are marked below; everything else is a plain DDP training loop.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dpro

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import DEFAULT_BATCH_SIZE, MODEL_NAMES, build  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", choices=MODEL_NAMES, default="mlp")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--crash-at", type=int, default=None, help="raise in this step (to test failures)")
    p.add_argument("--timing-out", default=None,
                   help="write this rank's step times (µs) to this path ({rank} is replaced): an independent clock")
    p.add_argument("--timing-skip", type=int, default=5, help="first steps left out of --timing-out")
    p.add_argument("--dpro-strategy", default=None,
                   help="a `dpro optimize -o` directory: use its ddp.json, memory.json, amp.json, compile.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model, make_batch, loss_fn = build(args.model)
    ddp_args = {"bucket_cap_mb": args.bucket_cap_mb}
    micro, amp = 1, False
    if args.dpro_strategy:
        from dpro.apply import autocast_enabled, checkpoint_modules, compile_modules, ddp_kwargs, memory_settings

        ddp_args = ddp_kwargs(args.dpro_strategy)
        mem = memory_settings(args.dpro_strategy)
        checkpoint_modules(model, mem.checkpoint_modules)  # recomputation
        micro = mem.accumulation_steps  # gradient accumulation
        amp = autocast_enabled(args.dpro_strategy)  # mixed precision
        compile_modules(model, args.dpro_strategy)  # op fusion (compile.json)
    ddp = DDP(model, **ddp_args)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    batch = make_batch(args.batch_size or DEFAULT_BATCH_SIZE[args.model])

    recorder = dpro.Recorder(ddp)  # dpro line 1

    @dpro.profile(recorder)  # dpro line 2
    def train_one_step(i: int) -> float:
        if args.crash_at == i:
            raise RuntimeError(f"crash requested at step {i}")
        opt.zero_grad()
        total = 0.0
        for j, (x, y) in enumerate(zip(batch[0].split(len(batch[0]) // micro), batch[1].split(len(batch[1]) // micro))):
            # the first micro-1 micro-batches accumulate locally; the last one synchronises
            with ddp.no_sync() if j < micro - 1 else contextlib.nullcontext():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    loss = loss_fn(ddp(x), y) / micro
                loss.backward()
            total += float(loss)
        opt.step()
        return total

    t0 = time.perf_counter()
    step_us = []
    for i in range(args.steps):
        t1 = time.perf_counter()
        loss = train_one_step(i)
        step_us.append((time.perf_counter() - t1) * 1e6)
    if args.timing_out:
        timed = step_us[args.timing_skip:]
        Path(args.timing_out.format(rank=dist.get_rank())).write_text(json.dumps(
            {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "model": args.model,
             "step_us": timed, "profiler_us": [0.0] * len(timed)}))
    if dist.get_rank() == 0:
        print(f"{args.steps} steps in {time.perf_counter() - t0:.2f} s, last loss {loss:.4f}")
    dist.barrier()  # no rank tears gloo down while a peer still talks to it (seen: SIGABRT at exit)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
