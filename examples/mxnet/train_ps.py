"""Gluon (hybridized) data-parallel training over MXNet's parameter server, profiled by dpro.

Run it with examples/mxnet/launch_local.py (which starts the scheduler and servers), e.g.

    dpro profile -o traces/ -- .venv-mx/bin/python examples/mxnet/launch_local.py -n 2 -s 1 \
        -- examples/mxnet/train_ps.py --model conv

Synthetic data. The two dpro lines are marked. Independently of dpro, every worker times
each step itself (wall clock around the step function, which ends with ``mx.nd.waitall()``
so a step is a whole iteration, communication included) and, with ``--timing-out DIR``,
writes ``DIR/timing_rank<r>.json``: the median step time over the steps dpro profiled and
over the steps after them (not profiled).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import mxnet as mx
from mxnet import autograd, gluon

import dpro


def build(model: str) -> tuple[gluon.HybridBlock, tuple[int, ...]]:
    net = gluon.nn.HybridSequential()
    if model == "mlp":
        net.add(gluon.nn.Dense(1024, activation="relu"), gluon.nn.Dense(1024, activation="relu"),
                gluon.nn.Dense(512, activation="relu"), gluon.nn.Dense(10))
        shape: tuple[int, ...] = (784,)
    elif model == "conv":
        net.add(gluon.nn.Conv2D(32, 3, padding=1, activation="relu"), gluon.nn.MaxPool2D(2),
                gluon.nn.Conv2D(64, 3, padding=1, activation="relu"), gluon.nn.MaxPool2D(2),
                gluon.nn.Flatten(), gluon.nn.Dense(256, activation="relu"), gluon.nn.Dense(10))
        shape = (3, 32, 32)
    else:
        raise SystemExit(f"unknown model {model!r} (mlp, conv)")
    return net, shape


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", choices=["mlp", "conv"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=0, help="total steps (default: warm-up + profiled + 10)")
    ap.add_argument("--kvstore", default="dist_sync")
    ap.add_argument("--timing-out", default=None, help="write timing_rank<r>.json here")
    a = ap.parse_args()

    mx.random.seed(0)
    net, shape = build(a.model)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    kv = mx.kv.create(a.kvstore)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9}, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x = mx.nd.random.uniform(shape=(a.batch, *shape))
    y = mx.nd.random.randint(0, 10, shape=(a.batch,)).astype("float32")

    recorder = dpro.Recorder(net)                       # dpro line 1

    @dpro.profile(recorder)                             # dpro line 2
    def step() -> None:
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(a.batch)
        mx.nd.waitall()

    window = recorder.window
    total = a.steps or window.stop + 10
    times: list[float] = []
    for _ in range(total):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e6)
    prof = [times[i] for i in window if i < len(times)]
    after = times[window.stop:]
    timing = {"rank": kv.rank, "num_workers": kv.num_workers, "model": a.model, "steps": len(times),
              "profiled_steps": list(window), "step_us": times,
              "median_profiled_us": statistics.median(prof) if prof else None,
              "median_unprofiled_us": statistics.median(after) if after else None}
    print(f"worker {kv.rank}: median step {timing['median_profiled_us']} us profiled, "
          f"{timing['median_unprofiled_us']} us unprofiled", flush=True)
    if a.timing_out:
        Path(a.timing_out).mkdir(parents=True, exist_ok=True)
        (Path(a.timing_out) / f"timing_rank{kv.rank}.json").write_text(json.dumps(timing))


if __name__ == "__main__":
    main()
