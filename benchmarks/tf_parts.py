"""What each part of dpro's TF + Horovod recorder adds to a step, within ONE 2-worker job.

benchmarks/overhead.py compares separate runs (on-run against off-run), whose run-to-run
spread on the 2-core VM (3-5 % for the capped TF convnet) is as large as the recorder's
cost there. This job switches the parts on and off itself, in blocks of ``--block`` calls,
every part in every cycle (rotated order), so that each block is compared with the
unrecorded block of the same cycle, in the same processes and network namespaces:

* ``off``: nothing;
* ``tf``: TF's profiler as the recorder starts it for the window (host tracer level 2,
  python and device tracers off) and each call inside the ``dpro_step`` TraceMe;
* ``tl``: Horovod's dynamic timeline (rank 0 writes it), its writer parked in the block as
  in the window (dpro.profiler.horovod.runtime.WindowTimeline);
* ``both``: ``tf`` and ``tl``: the recorder's window (less the throwaway session before it
  and the kept heaps, ``DPRO_TF_PRIME_STEPS``).

Starting and stopping a part happens between blocks; a block's first ``--skip`` calls are
left out (they absorb the other rank's start and stop). Per call and rank: the job's own wall
time, the process's CPU time, minor faults, and from ``/proc/self/task/*/schedstat`` the time
the process's threads ran and waited for a CPU (run queue). Per part: the median over cycles
of its block's median call against the ``off`` block of the same cycle (mean over ranks).

Capped at 200 Mbit/s, each rank in its own namespace, one compute thread per process, rank
``r`` bound to core ``r % cores`` (as overhead.py's ``threads1pin``); root. Time figures go
through benchmarks/measure.sh:

    benchmarks/measure.sh .venv-tf/bin/python benchmarks/tf_parts.py --cycles 8 --json-out parts.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PARTS = ("off", "tf", "tl", "both")


def _schedstat() -> tuple[int, int]:
    """Sum over this process's threads of (ns run on a CPU, ns waited on a run queue)."""
    run = wait = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                a, b, _ = f.read().split()
        except (OSError, ValueError):
            continue
        run += int(a)
        wait += int(b)
    return run, wait


def rank_main(a: argparse.Namespace) -> None:
    import resource

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod.tensorflow as hvd
    import tensorflow as tf

    sys.path.insert(0, str(REPO / "examples" / "tensorflow"))
    from models import build

    from dpro.profiler.horovod.runtime import WindowTimeline

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    model, ds, loss_fn = build(a.model, None, seed=hvd.rank())
    opt = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    for v in model.variables:
        v.assign(hvd.broadcast(v, root_rank=0))
    it = iter(ds)

    @tf.function
    def train_step(it):
        x, y = next(it)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = [hvd.allreduce(tf.convert_to_tensor(g), op=hvd.Average)
                 for g in tape.gradient(loss, model.trainable_variables)]
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    timeline = WindowTimeline("horovod.tensorflow")  # rank 0: finds the writer, idles and parks it
    tmp = Path(tempfile.mkdtemp(prefix="dpro-tf-parts-"))
    opts = tf.profiler.experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=0, device_tracer_level=0)
    calls: list[dict] = []

    def call(part: str, cycle: int, j: int) -> None:
        timeline.keep_parked()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        r0, w0 = _schedstat()
        c0, t0 = time.process_time(), time.perf_counter()
        if part in ("tf", "both"):
            with tf.profiler.experimental.Trace("dpro_step", step_num=len(calls), _r=1):
                float(train_step(it))
        else:
            float(train_step(it))
        t1, c1 = time.perf_counter(), time.process_time()
        r1, w1 = _schedstat()
        calls.append({"part": part, "cycle": cycle, "j": j, "wall_us": (t1 - t0) * 1e6, "cpu_us": (c1 - c0) * 1e6,
                      "run_us": (r1 - r0) / 1e3, "runq_us": (w1 - w0) / 1e3,
                      "minflt": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0})

    try:
        for i in range(a.warmup):
            call("warmup", -1, i)
        for c in range(a.cycles):
            order = PARTS[c % len(PARTS):] + PARTS[:c % len(PARTS)]
            for part in order:
                if part in ("tf", "both"):
                    tf.profiler.experimental.start(str(tmp / f"{part}{c}"), options=opts)
                if part in ("tl", "both"):
                    timeline.start(tmp / f"tl{c}", a.block, len(model.trainable_variables), hvd.size())
                for j in range(a.block):
                    call(part, c, j)
                if part in ("tf", "both"):
                    tf.profiler.experimental.stop()
                if part in ("tl", "both"):
                    timeline.stop()
                shutil.rmtree(tmp / f"{part}{c}", ignore_errors=True)
        Path(f"{a.out}.{hvd.rank()}.json").write_text(json.dumps({"rank": hvd.rank(), "calls": calls}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        hvd.shutdown()


def summarise(prefix: Path, skip: int) -> dict:
    per_rank = [json.loads(p.read_text())["calls"] for p in sorted(prefix.parent.glob(prefix.name + ".*.json"))]
    if len(per_rank) < 2:
        raise SystemExit(f"tf_parts.py: {len(per_rank)} rank file(s) under {prefix}*")
    keys = ("wall_us", "cpu_us", "run_us", "runq_us", "minflt")
    # block medians per (rank, part, cycle)
    blocks: dict[tuple[int, str, int], dict[str, float]] = {}
    for r, calls in enumerate(per_rank):
        for part in PARTS:
            for c in sorted({x["cycle"] for x in calls if x["part"] == part}):
                xs = [x for x in calls if x["part"] == part and x["cycle"] == c and x["j"] >= skip]
                blocks[(r, part, c)] = {k: statistics.median(x[k] for x in xs) for k in keys}
    cycles = sorted({c for (_, p, c) in blocks if p == "off"})
    out: dict = {"cycles": len(cycles), "ranks": len(per_rank), "parts": {}}
    for part in PARTS:
        wall = [statistics.mean(blocks[(r, part, c)]["wall_us"] for r in range(len(per_rank))) for c in cycles]
        off = [statistics.mean(blocks[(r, "off", c)]["wall_us"] for r in range(len(per_rank))) for c in cycles]
        pct = sorted(100 * (w / o - 1) for w, o in zip(wall, off))
        row = {"wall_ms": statistics.median(wall) / 1e3, "vs_off_pct": statistics.median(pct),
               "vs_off_min_pct": pct[0], "vs_off_max_pct": pct[-1]}
        for r in range(len(per_rank)):
            for k in keys[1:]:
                v = statistics.median(blocks[(r, part, c)][k] for c in cycles)
                row[f"r{r}_{k.replace('_us', '_ms')}"] = v / 1e3 if k.endswith("_us") else v
            row[f"r{r}_wall_ms"] = statistics.median(blocks[(r, part, c)]["wall_us"] for c in cycles) / 1e3
        out["parts"][part] = row
    # noise: the off block of each cycle against the next cycle's off block
    offs = [statistics.mean(blocks[(r, "off", c)]["wall_us"] for r in range(len(per_rank))) for c in cycles]
    if len(offs) > 1:
        out["noise_pct"] = statistics.median(abs(100 * (b / a - 1)) for a, b in zip(offs, offs[1:]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="convnet")
    ap.add_argument("--cycles", type=int, default=8)
    ap.add_argument("--block", type=int, default=6, help="calls per part and cycle")
    ap.add_argument("--skip", type=int, default=1, help="first calls of each block left out")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rate-mbit", type=float, default=200.0, help="0: loopback (horovodrun), no namespaces")
    ap.add_argument("--json-out", type=Path, default=None)
    a = ap.parse_args()
    if a.rank:
        rank_main(a)
        return
    if a.rate_mbit > 0 and os.geteuid() != 0:
        raise SystemExit("tf_parts.py: network namespaces need root")
    py = REPO / ".venv-tf" / "bin" / "python"
    with tempfile.TemporaryDirectory(prefix="dpro-tf-parts-") as tmp:
        prefix = Path(tmp) / "calls"
        env = {**os.environ, "HOROVOD_TIMELINE": "DYNAMIC", "PYTHONPATH": str(REPO),
               **{k: "1" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                   "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")}}
        env.pop("DPRO_DISABLE", None)
        launcher = ([str(py), str(HERE / "fidelity" / "hvd_netns.py"), "--np", "2", "--rate-mbit", f"{a.rate_mbit:g}"]
                    if a.rate_mbit > 0 else [str(REPO / ".venv-tf" / "bin" / "horovodrun"), "-np", "2", "--gloo", "-H",
                                             "localhost:2"])
        cmd = [*launcher, *(["--"] if a.rate_mbit > 0 else []), str(py), str(HERE / "pinned.py"), str(Path(__file__).resolve()), "--rank", "--out", str(prefix),
               "--model", a.model, "--cycles", str(a.cycles), "--block", str(a.block), "--warmup", str(a.warmup)]
        t0 = time.time()
        r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        if r.returncode:
            raise SystemExit(f"tf_parts.py: the job failed ({r.returncode}): {r.stderr[-2000:]}")
        res = {**summarise(prefix, a.skip), "model": a.model, "rate_mbit": a.rate_mbit, "block": a.block,
               "skip": a.skip, "job_s": time.time() - t0}
    print(f"# tf_parts: {a.model}, 2 workers, {a.rate_mbit:g} Mbit/s, {res['cycles']} cycles x {a.block} calls "
          f"(first {a.skip} left out); off-vs-next-off {res.get('noise_pct', float('nan')):.1f} %")
    print("part   ms/call  vs off (min..max)        | rank0 cpu run runq faults | rank1 cpu run runq faults")
    for part, f in res["parts"].items():
        print(f"{part:5} {f['wall_ms']:8.1f} {f['vs_off_pct']:+6.1f}% ({f['vs_off_min_pct']:+.1f}..{f['vs_off_max_pct']:+.1f})"
              + "".join(f" | {f[f'r{r}_cpu_ms']:5.1f} {f[f'r{r}_run_ms']:5.1f} {f[f'r{r}_runq_ms']:5.1f} "
                        f"{f[f'r{r}_minflt']:5.0f}" for r in range(res["ranks"])))
    if a.json_out:
        a.json_out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
