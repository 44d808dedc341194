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
import os
import statistics
import time
from pathlib import Path

import mxnet as mx
from mxnet import autograd, gluon

import dpro


MODELS = ("mlp", "conv", "resnet", "lstm")
VOCAB = 1000


class ResBlock(gluon.HybridBlock):
    """conv-BN-relu-conv-BN plus the identity, then relu."""

    def __init__(self, channels: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.body = gluon.nn.HybridSequential()
        self.body.add(gluon.nn.Conv2D(channels, 3, padding=1, use_bias=False), gluon.nn.BatchNorm(),
                      gluon.nn.Activation("relu"), gluon.nn.Conv2D(channels, 3, padding=1, use_bias=False),
                      gluon.nn.BatchNorm())

    def hybrid_forward(self, F, x):  # noqa: N803 - Gluon's signature
        return F.Activation(self.body(x) + x, act_type="relu")


def build(model: str) -> tuple[gluon.HybridBlock, tuple[int, ...]]:
    """The model and one sample's shape (``lstm``: token ids, see :func:`make_batch`)."""
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
    elif model == "resnet":
        net.add(gluon.nn.Conv2D(32, 3, padding=1, use_bias=False), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
                ResBlock(32), ResBlock(32), gluon.nn.MaxPool2D(2), gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(10))
        shape = (3, 32, 32)
    elif model == "lstm":
        net.add(gluon.nn.Embedding(VOCAB, 128), gluon.rnn.LSTM(256, num_layers=2, layout="NTC"), gluon.nn.Dense(10))
        shape = (35,)
    else:
        raise SystemExit(f"unknown model {model!r} ({', '.join(MODELS)})")
    return net, shape


def make_batch(model: str, batch: int, shape: tuple[int, ...]) -> tuple[mx.nd.NDArray, mx.nd.NDArray]:
    """A synthetic batch: inputs (token ids for ``lstm``) and class labels."""
    if model == "lstm":
        x = mx.nd.random.randint(0, VOCAB, shape=(batch, *shape)).astype("float32")
    else:
        x = mx.nd.random.uniform(shape=(batch, *shape))
    return x, mx.nd.random.randint(0, 10, shape=(batch,)).astype("float32")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", choices=list(MODELS))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=0, help="total steps (default: warm-up + profiled + 10)")
    ap.add_argument("--kvstore", default="dist_sync")
    ap.add_argument("--timing-out", default=None, help="write timing_rank<r>.json here")
    ap.add_argument("--dpro-strategy", default=None, help="a `dpro optimize -o` directory: use its mxnet.json")
    a = ap.parse_args()
    if a.dpro_strategy:
        from dpro.apply import mxnet_env

        os.environ.update(mxnet_env(a.dpro_strategy))  # read when the kvstore is created

    mx.random.seed(0)
    net, shape = build(a.model)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    kv = mx.kv.create(a.kvstore)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9}, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = make_batch(a.model, a.batch, shape)

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
