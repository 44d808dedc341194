"""TensorFlow 2 + Horovod (CPU, gloo) training with dpro's two-line recorder.

    dpro profile -o traces/ -- horovodrun -np 2 --gloo -H localhost:2 \\
        .venv-tf/bin/python examples/tensorflow/hvd_recorder.py --model convnet
    dpro replay traces/
    dpro report traces/ -o report.html       # the HTML report (docs/report.md)

A plain Horovod loop: a ``tf.function`` step that computes the gradients with a
``GradientTape``, all-reduces each one with ``hvd.allreduce`` (Horovod names it after the
graph op, ``HorovodAllreduce_<gradient>``; dpro joins the timeline to the graph by that
name) and applies them. (Keras 3 variables break ``hvd.DistributedGradientTape`` and
``hvd.broadcast_variables`` in Horovod 0.28.1, so the step calls ``hvd.allreduce`` and
the start-up ``hvd.broadcast`` directly.) The two dpro lines are marked below.

``--dpro-strategy DIR`` applies a `dpro optimize -o DIR` strategy: Horovod's fusion
threshold and cycle time (``horovod.env``), dpro's tensor groups (``horovod.json``),
each reduced as one ``hvd.grouped_allreduce``, and XLA (``compile.json``): the loss and
gradients computed in a ``tf.function(jit_compile=True)``, reduced and applied outside it.
``--xla`` compiles it so without a strategy (the XLA baseline).

The script measures its own step time, independently of dpro: the wall time of each call
of the compiled step (``--steps`` calls; the first ``--skip`` are compile/warm-up and are
not counted), reported as the median over the calls dpro profiled and over the calls it
did not (``dpro-timing {...}`` on stdout, one JSON line per rank, and ``--timing-out``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import dpro  # noqa: E402
from dpro.apply import xla_jit_compile  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import MODEL_NAMES, build  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", choices=MODEL_NAMES, default="convnet")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--steps", type=int, default=20, help="calls of the step function in all")
    p.add_argument("--skip", type=int, default=3, help="first calls left out of the unprofiled median")
    p.add_argument("--threads", type=int, default=0,
                   help="TF intra- and inter-op threads per worker (default: cores / local workers)")
    p.add_argument("--timing-out", default=None, help="write this rank's timing JSON to PATH.<rank>.json")
    p.add_argument("--dpro-strategy", default=None,
                   help="a `dpro optimize -o` directory: Horovod's fusion settings and tensor groups (horovod.json)")
    p.add_argument("--xla", action="store_true", help="compute the loss and gradients under tf.function(jit_compile=True)")
    args = p.parse_args()
    if args.dpro_strategy:
        from dpro.apply import horovod_env

        os.environ.update(horovod_env(args.dpro_strategy))  # fusion threshold, cycle time: before hvd.init()
    try:
        import horovod.tensorflow as hvd
    except ImportError as e:
        raise SystemExit(f"hvd_recorder.py: horovod.tensorflow is not importable ({e}); run scripts/setup_tf.sh")
    hvd.init()
    threads = args.threads or max(1, (os.cpu_count() or 1) // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)

    model, ds, loss_fn = build(args.model, args.batch_size, seed=hvd.rank())
    opt = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    for v in model.variables:  # same initial weights everywhere
        v.assign(hvd.broadcast(v, root_rank=0))
    it = iter(ds)

    # dpro's tensor groups: each is all-reduced as one (hvd.grouped_allreduce); None: Horovod's own fusion
    groups: list[list[int]] = []
    if args.dpro_strategy:
        from dpro.apply import horovod_groups

        index = {id(v): i for i, v in enumerate(model.trainable_variables)}
        named = [(v.path, v) for v in model.trainable_variables]
        groups = [[index[id(v)] for v in g] for g in horovod_groups(args.dpro_strategy, named) or []]

    def allreduce(grads: list) -> list:
        # dense all-reduces (like sparse_as_dense=True): an embedding's IndexedSlices would be all-gathered
        grads = [tf.convert_to_tensor(g) for g in grads]
        out = list(grads)
        for g in groups:
            for i, r in zip(g, hvd.grouped_allreduce([grads[i] for i in g], op=hvd.Average)):
                out[i] = r
        grouped = {i for g in groups for i in g}
        return [r if i in grouped else hvd.allreduce(r, op=hvd.Average) for i, r in enumerate(out)]

    recorder = dpro.Recorder(model)  # dpro line 1

    def loss_and_grads(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return loss, tape.gradient(loss, model.trainable_variables)

    xla = bool(args.xla or (args.dpro_strategy and xla_jit_compile(args.dpro_strategy)))
    if xla:
        loss_and_grads = tf.function(loss_and_grads, jit_compile=True)  # Horovod's ops stay outside XLA

    @tf.function
    def train_step(it):
        x, y = next(it)
        loss, grads = loss_and_grads(x, y)
        grads = allreduce(grads)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    times: list[float] = []

    @dpro.profile(recorder)  # dpro line 2
    def step() -> float:
        t0 = time.perf_counter()
        loss = train_step(it)
        times.append(time.perf_counter() - t0)
        return float(loss)

    try:
        losses, call_us, cpu_us, minflt = [], [], [], []
        for _ in range(args.steps):  # call_us: each call timed from outside, the recorder's own work included
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0, c0 = time.perf_counter(), time.process_time()
            losses.append(step())
            call_us.append((time.perf_counter() - t0) * 1e6)
            cpu_us.append((time.process_time() - c0) * 1e6)  # the process's CPU (all threads) over the call
            minflt.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)  # minor page faults of the call
        loss = losses[-1]
        window = recorder.window if recorder.config.enabled else range(0)
        prof = [times[i] for i in window if i < len(times)]
        unprof = [t for i, t in enumerate(times) if i >= args.skip and i not in window]
        med = lambda xs: statistics.median(xs) * 1e6 if xs else None  # noqa: E731
        timing = {"rank": hvd.rank(), "size": hvd.size(), "model": args.model, "threads": threads,
                  "xla": xla,
                  "profiled_steps": list(window), "median_step_us_profiled": med(prof),
                  "median_step_us_unprofiled": med(unprof), "unprofiled_steps": len(unprof),
                  "step_us": [t * 1e6 for t in times], "call_us": call_us, "cpu_us": cpu_us, "minflt": minflt,
                  "first_loss": losses[0], "last_loss": loss}
        print("dpro-timing " + json.dumps({k: v for k, v in timing.items() if k not in ("step_us", "call_us", "cpu_us", "minflt")}), flush=True)
        if args.timing_out:
            Path(f"{args.timing_out}.{hvd.rank()}.json").write_text(json.dumps(timing))
    finally:
        hvd.shutdown()  # closes the timeline on rank 0


if __name__ == "__main__":
    main()
