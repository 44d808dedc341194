"""PyTorch Horovod (CPU, gloo) training with dpro's two-line recorder.

    dpro profile -o traces/ -- horovodrun -np 2 --gloo -H localhost:2 python examples/pytorch/hvd_recorder.py --model mlp
    dpro replay traces/
    dpro report traces/ -o report.html       # the HTML report (docs/report.md)

The two dpro lines are marked below; everything else is a plain Horovod training loop
(``hvd.DistributedOptimizer`` with named parameters, so that Horovod's timeline names each
gradient's all-reduce ``allreduce.<parameter name>``). ``dpro profile`` sets
``HOROVOD_TIMELINE`` for the job (horovodrun passes the environment to every rank); rank 0
writes the timeline, and dpro turns it into the communication ops of every rank.

horovodrun parses the script's options too and rejects ambiguous prefixes of its own
(``--timeline``, ``--cycle``, ...); Horovod's knobs go before the command
(``horovodrun --fusion-threshold-mb 8 --cycle-time-ms 2 ...``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

import dpro

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import DEFAULT_BATCH_SIZE, MODEL_NAMES, build  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", choices=MODEL_NAMES, default="mlp")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--crash-at", type=int, default=None, help="raise in this step (to test failures)")
    p.add_argument("--dpro-strategy", default=None, help="a `dpro optimize -o` directory: use its horovod.json")
    p.add_argument("--timing-out", default=None,
                   help="write this rank's step times (µs) to this path ({rank} is replaced): an independent clock")
    p.add_argument("--timing-skip", type=int, default=5, help="first steps left out of --timing-out")
    args = p.parse_args()
    torch.set_num_threads(1)
    try:
        import horovod.torch as hvd
    except ImportError as e:
        raise SystemExit(f"hvd_recorder.py: horovod.torch is not importable ({e}); run scripts/install_horovod.sh")
    groups = None
    if args.dpro_strategy:
        from dpro.apply import horovod_env

        os.environ.update(horovod_env(args.dpro_strategy))  # read by hvd.init()
    hvd.init()
    model, make_batch, loss_fn = build(args.model)
    if args.dpro_strategy:
        from dpro.apply import horovod_groups

        groups = horovod_groups(args.dpro_strategy, model.named_parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), groups=groups)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    batch = make_batch(args.batch_size or DEFAULT_BATCH_SIZE[args.model])

    recorder = dpro.Recorder(model)  # dpro line 1

    @dpro.profile(recorder)  # dpro line 2
    def train_one_step(i: int) -> float:
        if args.crash_at == i:
            raise RuntimeError(f"crash requested at step {i}")
        opt.zero_grad()
        loss = loss_fn(model(batch[0]), batch[1])
        loss.backward()
        opt.step()
        return float(loss.detach())

    t0 = time.perf_counter()
    step_us = []
    try:
        for i in range(args.steps):
            t1 = time.perf_counter()
            loss = train_one_step(i)
            step_us.append((time.perf_counter() - t1) * 1e6)
        if args.timing_out:
            timed = step_us[args.timing_skip:]
            Path(args.timing_out.format(rank=hvd.rank())).write_text(json.dumps(
                {"rank": hvd.rank(), "world_size": hvd.size(), "model": args.model,
                 "step_us": timed, "profiler_us": [0.0] * len(timed)}))
        if hvd.rank() == 0:
            print(f"{args.steps} steps in {time.perf_counter() - t0:.2f} s, last loss {loss:.4f}", flush=True)
    finally:
        hvd.shutdown()  # closes the timeline on rank 0


if __name__ == "__main__":
    main()
