"""Gluon (hybridized) data-parallel training over MXNet's parameter server, profiled by dpro.

Run it with examples/mxnet/launch_local.py (which starts the scheduler and servers), e.g.

    dpro profile -o traces/ -- .venv-mx/bin/python examples/mxnet/launch_local.py -n 2 -s 1 \
        -- examples/mxnet/train_ps.py --model conv

Synthetic data. The two dpro lines are marked. Independently of dpro, every worker times
each step itself (wall clock around the step function, which ends with ``mx.nd.waitall()``
so a step is a whole iteration, communication included) and, with ``--timing-out DIR``,
writes ``DIR/timing_rank<r>.json``: the median step time over the steps dpro profiled and
over the steps after them (not profiled).

``--p3 --slice-bytes N``: P3 (Jayarajan et al., MLSys'19) on stock MXNet, done by this
script: every gradient is re-keyed into slices of at most N bytes (one kvstore key per
slice, the server runs the same SGD on each), pushed with ``priority`` by layer order
(the first layer's slices first) and pulled straight into the weights' slices (the
kvstore copies each pulled slice into its part of the weight: engine ops, so the next
forward's layer i waits only for its own slices). No ``waitall()`` between steps: the sync
point of a step is the wait for its backward (every gradient ready, :func:`P3.step`), just
before its slices are pushed, so a step's wall clock runs from one backward's end to the
next in steady state: the step period, with the pulls overlapping the next forward.
``--losses`` adds each step's mean loss to the timing file (read after the timed step).
``DPRO_P3_STAMPS=1`` (opt-in, ``--p3``) adds per step, in µs of ``time.perf_counter``: the step's
start (forward issued), the backward's end (every gradient ready) and the end of issuing
its slices' copies, pushes and pulls (``p3_stamps``), and the CPU time of the issuing
loop on this thread (``p3_issue_cpu_us``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import dpro


MODELS = ("mlp", "conv", "resnet", "lstm")
#: the slice size of ``--p3`` without ``--slice-bytes`` (bytes)
P3_SLICE_BYTES = 512 << 10
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


class P3:
    """P3's sliced, prioritised push/pull of every gradient, on stock MXNet's kvstore.

    The slices are kvstore keys 0, 1, ... in layer order (the order of
    ``net.collect_params()``: the first layer's parameters first); a slice is a contiguous
    range of the flattened parameter. ``step()`` replaces ``trainer.step`` + ``waitall``."""

    def __init__(self, params: list, kv, batch: int, slice_bytes: int) -> None:
        self.params, self.kv = params, kv
        #: DPRO_P3_STAMPS=1: per step (backward end, issue end, issue CPU) in µs
        self.stamps: list[tuple[float, float, float]] | None = [] if os.environ.get("DPRO_P3_STAMPS") == "1" else None
        #: DPRO_P3_STAMPS=1: per step, pull landed / copied into the weight, of 3 slices (:meth:`_watcher`)
        self.landed: dict[int, list[float]] = {}
        # the optimizer gluon's Trainer sends to the servers (update_on_kvstore), per slice key
        kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.01, momentum=0.9, rescale_grad=1.0 / batch))
        #: (key, priority, flat gradient slice, its copy that is pushed, flat weight slice)
        self.slices: list[tuple[int, int, mx.nd.NDArray, mx.nd.NDArray, mx.nd.NDArray]] = []
        for layer, p in enumerate(params):
            w, g = p.data().reshape(-1), p.grad().reshape(-1)
            per = max(1, slice_bytes // np.dtype(w.dtype).itemsize)
            for a in range(0, w.size, per):
                b = min(w.size, a + per)
                self.slices.append((len(self.slices), -layer, g[a:b], mx.nd.zeros((b - a,), dtype=w.dtype), w[a:b]))
        # every worker starts from the same weights (mx.random.seed(0)); rank 0's go to the servers
        kv.init([s[0] for s in self.slices], [s[4] for s in self.slices])
        mx.nd.waitall()
        if self.stamps is not None:
            import queue
            import threading

            self.watch: queue.Queue[int | None] = queue.Queue()
            self.watcher = threading.Thread(target=self._watcher, daemon=True)
            self.watcher.start()

    def step(self) -> None:
        """Push every slice (first layers first), pull it into the weight. Waits for the
        backward only (the step's sync point): pushes are handed to ps-lite in priority
        order, which stock ps-lite then sends first-in first-out."""
        for p in self.params:
            p.grad().wait_to_read()
        if self.stamps is not None:
            t_bw, c0 = time.perf_counter(), time.thread_time()
        for key, prio, g, buf, w in self.slices:
            # a copy of its own: the kvstore keeps the pushed array as the key's receive
            # buffer, and views of one gradient share one engine variable (serialized pulls)
            g.copyto(buf)
            self.kv.push(key, buf, priority=prio)
            self.kv.pull(key, out=w, priority=prio)
        if self.stamps is not None:
            self.stamps.append((t_bw * 1e6, time.perf_counter() * 1e6, (time.thread_time() - c0) * 1e6))
            self.watch.put(len(self.stamps) - 1)

    def _watcher(self) -> None:
        """DPRO_P3_STAMPS: per step, for the first slice, the first layer's last slice and the
        last slice, when its pull's answer landed in its receive buffer (the kvstore receives
        a key into the array pushed for it, so the buffer's last write is the pull, issued
        after its push is acknowledged) and when it was copied into the weight (a slice of
        a weight shares the weight's engine variable: all of that layer's pending copies),
        in µs of ``time.perf_counter``."""
        lib = mx.base._LIB
        last0 = max(i for i, s in enumerate(self.slices) if s[1] == self.slices[0][1])
        watch = [self.slices[i] for i in (0, last0, len(self.slices) - 1)]
        while True:
            k = self.watch.get()
            if k is None:  # the job's end (a thread blocked in the engine at exit crashes MXNet)
                return
            row = []
            for _, _, _, buf, w in watch:
                lib.MXNDArrayWaitToWrite(buf.handle)
                row.append(time.perf_counter() * 1e6)
                lib.MXNDArrayWaitToRead(w.handle)
                row.append(time.perf_counter() * 1e6)
            self.landed[k] = row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", choices=list(MODELS))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=0, help="total steps (default: warm-up + profiled + 10)")
    ap.add_argument("--kvstore", default="dist_sync")
    ap.add_argument("--timing-out", default=None, help="write timing_rank<r>.json here")
    ap.add_argument("--dpro-strategy", default=None, help="a `dpro optimize -o` directory: use its mxnet.json")
    ap.add_argument("--p3", action="store_true",
                    help="P3: sliced gradients pushed first-layer-first, pulls overlapping the next forward")
    ap.add_argument("--slice-bytes", type=int, default=None,
                    help=f"--p3's slice size in bytes (default {P3_SLICE_BYTES})")
    ap.add_argument("--losses", action="store_true", help="write each step's mean loss to the timing file")
    a = ap.parse_args()
    if a.slice_bytes is not None and not a.p3:
        ap.error("--slice-bytes needs --p3")
    if a.slice_bytes is not None and a.slice_bytes < 4:
        ap.error(f"--slice-bytes {a.slice_bytes}: must be >= 4 (one float32)")
    if a.dpro_strategy:
        from dpro.apply import mxnet_env

        os.environ.update(mxnet_env(a.dpro_strategy))  # read when the kvstore is created

    mx.random.seed(0)
    net, shape = build(a.model)
    net.initialize(mx.init.Xavier())
    # P3: no bulking of the forward's ops, so that a layer waits only for its own weights
    net.hybridize(**({"forward_bulk_size": 1} if a.p3 else {}))
    kv = mx.kv.create(a.kvstore)
    if not a.p3:
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01, "momentum": 0.9}, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = make_batch(a.model, a.batch, shape)
    if a.p3:
        with autograd.record():  # shapes known (deferred initialization done) before slicing
            loss_fn(net(x), y).backward()
        mx.nd.waitall()
        p3 = P3([p for p in net.collect_params().values() if p.grad_req != "null"], kv, a.batch,
                a.slice_bytes or P3_SLICE_BYTES)
    losses: list[float] = []

    recorder = dpro.Recorder(net)                       # dpro line 1

    @dpro.profile(recorder)                             # dpro line 2
    def step() -> None:
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        if a.p3:
            p3.step()  # no waitall: the pulls overlap the next forward
        else:
            trainer.step(a.batch)
            mx.nd.waitall()
        if a.losses:
            last[:] = [loss.mean()]

    last: list = []

    window = recorder.window
    total = a.steps or window.stop + 10
    times: list[float] = []
    starts: list[float] = []
    for _ in range(total):
        t0 = time.perf_counter()
        starts.append(t0 * 1e6)
        step()
        times.append((time.perf_counter() - t0) * 1e6)
        if a.losses:
            losses.append(float(last[0].asscalar()))
    mx.nd.waitall()
    if a.p3 and p3.stamps is not None:
        p3.watch.put(None)
        p3.watcher.join()
    prof = [times[i] for i in window if i < len(times)]
    after = times[window.stop:]
    timing = {"rank": kv.rank, "num_workers": kv.num_workers, "model": a.model, "steps": len(times),
              "profiled_steps": list(window), "step_us": times,
              "median_profiled_us": statistics.median(prof) if prof else None,
              "median_unprofiled_us": statistics.median(after) if after else None}
    if a.p3:
        timing["p3_slice_bytes"] = a.slice_bytes or P3_SLICE_BYTES
        timing["p3_slices"] = len(p3.slices)
        if p3.stamps is not None:
            timing["p3_stamps"] = [[t, b, i] for t, (b, i, _) in zip(starts, p3.stamps)]
            timing["p3_issue_cpu_us"] = [c for _, _, c in p3.stamps]
            timing["p3_landed"] = [p3.landed.get(k) for k in range(len(p3.stamps))]
    if a.losses:
        timing["loss"] = losses
    print(f"worker {kv.rank}: median step {timing['median_profiled_us']} us profiled, "
          f"{timing['median_unprofiled_us']} us unprofiled", flush=True)
    if a.timing_out:
        Path(a.timing_out).mkdir(parents=True, exist_ok=True)
        (Path(a.timing_out) / f"timing_rank{kv.rank}.json").write_text(json.dumps(timing))


if __name__ == "__main__":
    main()
