"""Wall and CPU time per step of the TF convnet with TF's profiler off and on, in one process.

What dpro's TF window adds to a step, without Horovod or a second rank: the same
``tf.function`` step as examples/tensorflow/hvd_recorder.py (GradientTape, SGD with momentum,
a ``tf.data`` iterator) less the all-reduce, one TF thread per pool, the process bound to one
core; the settings interleaved in every round (a round runs each setting for ``--steps``
calls, in a shuffled order), the profiler started before a setting's calls and stopped after
them (its start and stop are not timed). Per setting: the median over the rounds of each
round's median call. Settings (``--settings``, comma-separated):

* ``off``: no profiler;
* ``l2``, ``l1``: ``tf.profiler.experimental`` with host tracer level 2 (dpro's default) / 1,
  python and device tracers off (dpro on a CPU-only host);
* ``l2step``: ``l2`` and each call inside the recorder's ``dpro_step`` TraceMe;
* ``trace``: no profiler, each call inside the ``dpro_step`` TraceMe (inactive: its cost alone).

Also per setting: minor page faults per call (a count, unaffected by the machine's load; ``-v``
prints every call's). Found with it (#31): in about half of the profiler sessions the step
starts faulting ~6900 pages (27 MB) per call, +20-25 % CPU, until the session stops; glibc
unmaps and maps a 64 MiB heap every step (strace). ``--top-pad-mb 64`` keeps glibc's heaps
while a session runs: later sessions then stop faulting, but a session's first steps still
touch new memory, and in the 2-worker job (one profiler session, the window) it did not help.

Time figures: run it through benchmarks/measure.sh (docs/fidelity.md "Profiling overhead").

    benchmarks/measure.sh .venv-tf/bin/python benchmarks/tf_window_cpu.py --rounds 8
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETTINGS = ("off", "l2", "l1", "l2step", "trace")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6, help="timed calls per setting and round")
    ap.add_argument("--model", default="convnet")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--top-pad-mb", type=int, default=0,
                    help="glibc's M_TOP_PAD (MiB) while each profiler session runs (128 KiB, glibc's "
                         "default, after it): heaps are then kept, not unmapped when a step frees them")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every call's CPU ms")
    a = ap.parse_args()
    settings = [s for s in a.settings.split(",") if s]
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise SystemExit(f"tf_window_cpu.py: unknown settings {sorted(unknown)} (known: {', '.join(SETTINGS)})")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import tensorflow as tf

    sys.path.insert(0, str(REPO / "examples" / "tensorflow"))
    from models import build

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    model, ds, loss_fn = build(a.model)
    opt = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    it = iter(ds)

    @tf.function
    def train_step(it):
        x, y = next(it)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for _ in range(5):
        train_step(it)
    import ctypes

    libc = ctypes.CDLL(None)
    rng = random.Random(0)
    walls: dict[str, list[float]] = {s: [] for s in settings}
    cpus: dict[str, list[float]] = {s: [] for s in settings}
    #: every call's CPU ms, per setting and round (where in a session a slow call falls)
    calls: dict[str, list[list[float]]] = {s: [] for s in settings}
    #: minor page faults of each call (a count: unaffected by the machine's load)
    faults: dict[str, list[list[int]]] = {s: [] for s in settings}
    step = 0
    for r in range(a.rounds):
        order = list(settings)
        rng.shuffle(order)
        for s in order:
            logdir = tempfile.mkdtemp(prefix="dpro-tfcpu-")
            if s.startswith("l"):
                level = int(s[1])
                opts = tf.profiler.experimental.ProfilerOptions(host_tracer_level=level, python_tracer_level=0,
                                                                device_tracer_level=0)
                if a.top_pad_mb:
                    libc.mallopt(-2, a.top_pad_mb << 20)  # M_TOP_PAD
                tf.profiler.experimental.start(logdir, options=opts)
            w, c, f = [], [], []
            for _ in range(a.steps):
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t0, c0 = time.perf_counter(), time.process_time()
                if s in ("l2step", "trace"):
                    with tf.profiler.experimental.Trace("dpro_step", step_num=step, _r=1):
                        float(train_step(it))
                else:
                    float(train_step(it))
                w.append((time.perf_counter() - t0) * 1e3)
                c.append((time.process_time() - c0) * 1e3)
                f.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
                step += 1
            if s.startswith("l"):
                tf.profiler.experimental.stop()
                if a.top_pad_mb:
                    libc.mallopt(-2, 128 << 10)
            walls[s].append(statistics.median(w))
            cpus[s].append(statistics.median(c))
            calls[s].append(c)
            faults[s].append(f)
            import shutil

            shutil.rmtree(logdir, ignore_errors=True)
        if a.verbose:
            for s in settings:
                print(f"    {s:<7} " + " ".join(f"{x:6.1f}" for x in calls[s][-1]) + "   faults "
                      + " ".join(str(x) for x in faults[s][-1]), flush=True)
        print(f"round {r}: " + "  ".join(f"{s} {walls[s][-1]:.1f}/{cpus[s][-1]:.1f}" for s in settings), flush=True)
    base = statistics.median(walls[settings[0]])
    print(f"# {a.model}, {a.rounds} rounds x {a.steps} calls; ms per call, median over rounds (wall / CPU); "
          f"vs {settings[0]}, per round paired", flush=True)
    out = {}
    for s in settings:
        paired = [100 * (x / y - 1) for x, y in zip(walls[s], walls[settings[0]])]
        out[s] = {"wall_ms": statistics.median(walls[s]), "cpu_ms": statistics.median(cpus[s]),
                  "paired_wall_pct": statistics.median(paired), "rounds_wall_ms": walls[s], "rounds_cpu_ms": cpus[s],
                  "calls_cpu_ms": calls[s], "calls_minflt": faults[s],
                  "minflt": statistics.median(x for r in faults[s] for x in r)}
        print(f"  {s:<7} wall {out[s]['wall_ms']:7.1f}  cpu {out[s]['cpu_ms']:7.1f}  "
              f"vs {settings[0]}: {100 * (out[s]['wall_ms'] / base - 1):+5.1f}% (paired median {out[s]['paired_wall_pct']:+5.1f}%)"
              f"  minor faults/call {out[s]['minflt']:.0f}",
              flush=True)
    if a.json_out:
        a.json_out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
