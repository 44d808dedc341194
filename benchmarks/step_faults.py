"""Page faults per training step, dpro on and off: what the recorder does to the job's memory allocator.

A count, not a time: it does not depend on the machine's load, so this runs at ``nice 19``
outside benchmarks/measure.sh. Each rank counts its minor page faults
(``getrusage(RUSAGE_SELF).ru_minflt``) around every call of the step function that
``dpro.profile`` wraps (the wrapper is patched in before the training script runs; it is
the same on- and off-runs), and writes them to ``OUT/faults_rank<r>.json``; the driver
prints, per variant, the mean faults per step of each phase (warm-up without its first
call, the window, the calls after it), averaged over ranks and runs.

With ``--cpu`` it also prints, per step, each rank's CPU time (µs, user + system) split into
the main thread (``RUSAGE_THREAD``) and the process's other threads (gloo's, the profiler's:
``RUSAGE_SELF`` minus the main thread), and the main thread's voluntary and involuntary
context switches: where a window's extra time goes when ranks share cores. CPU time is not a
count: run it through benchmarks/measure.sh.

Variants: ``on`` (`dpro profile`), ``off`` (``DPRO_DISABLE=1``), ``nodefer`` (`dpro profile`
with ``DPRO_DEFER_WRITE=0``: the trace is exported in the window's last call, so the
profiler's memory is freed before the calls after the window), ``offnotrim`` (off, with
glibc's trim and mmap thresholds at 1 GB: freed memory is never handed back to the kernel),
``ontoppad`` (on, with glibc's ``M_TOP_PAD`` at 64 MiB for the whole run: no heap shrunk),
``onheap`` / ``offheap`` (on / off with ``jobenv.HEAP_ENV``: glibc's mmap threshold fixed).

    nice -n 19 .venv/bin/python benchmarks/step_faults.py --path hvd --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import jobenv  # noqa: E402

WARMUP, STEPS, AFTER = 5, 5, 20
SCRIPTS = {"hvd": REPO / "examples" / "pytorch" / "hvd_recorder.py",
           "ddp": REPO / "examples" / "pytorch" / "ddp_recorder.py"}
VARIANTS = {
    "on": (True, {}),
    "off": (False, {}),
    "nodefer": (True, {"DPRO_DEFER_WRITE": "0"}),
    "ontoppad": (True, {"MALLOC_TOP_PAD_": str(64 << 20)}),  # on, glibc's heaps kept all run
    "offnotrim": (False, {"MALLOC_TRIM_THRESHOLD_": "1000000000", "MALLOC_MMAP_THRESHOLD_": "1000000000"}),
    # on / off with glibc's mmap threshold fixed (jobenv.HEAP_ENV): profiled and unprofiled runs alike
    "onheap": (True, dict([jobenv.HEAP_ENV])),
    "offheap": (False, dict([jobenv.HEAP_ENV])),
    "nodeferheap": (True, {"DPRO_DEFER_WRITE": "0", **dict([jobenv.HEAP_ENV])}),
}


def wrap_main(out: str, argv: list[str]) -> None:
    """In a rank: count faults around every call of the step function, then run ``argv``."""
    import dpro.profiler.recorder as rec

    faults: list[int] = []
    cpu: dict[str, list[float]] = {"wall_us": [], "main_us": [], "other_us": [], "nvcsw": [], "nivcsw": []}
    orig = rec.Recorder.wrap

    def wrap(self, fn):  # type: ignore[no-untyped-def]
        inner = orig(self, fn)

        def step(*a, **k):  # type: ignore[no-untyped-def]
            p0, t0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_THREAD)
            w0 = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                wall = (time.perf_counter() - w0) * 1e6
                p1, t1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_THREAD)
                cpu["wall_us"].append(wall)
                faults.append(p1.ru_minflt - p0.ru_minflt)
                main = (t1.ru_utime + t1.ru_stime - t0.ru_utime - t0.ru_stime) * 1e6
                cpu["main_us"].append(main)
                cpu["other_us"].append((p1.ru_utime + p1.ru_stime - p0.ru_utime - p0.ru_stime) * 1e6 - main)
                cpu["nvcsw"].append(t1.ru_nvcsw - t0.ru_nvcsw)
                cpu["nivcsw"].append(t1.ru_nivcsw - t0.ru_nivcsw)
        return step

    rec.Recorder.wrap = wrap  # type: ignore[method-assign]
    rank = next((os.environ[k] for k in ("RANK", "HOROVOD_RANK") if os.environ.get(k, "").isdigit()), "0")
    try:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
    finally:
        Path(out, f"faults_rank{rank}.json").write_text(json.dumps({"rank": int(rank), "minflt": faults, **cpu}))


def command(path: str, variant: str, run_dir: Path, port: int, workers: int = 2) -> tuple[list[str], dict[str, str]]:
    on, extra = VARIANTS[variant]
    py = str(REPO / ".venv" / "bin" / "python")
    settings = jobenv.default_for(path)
    rank_cmd = [py, str(Path(__file__).resolve()), "--wrap", str(run_dir), *settings.script(SCRIPTS[path]),
                "--model", "mlp" if path == "hvd" else "transformer", "--steps", str(WARMUP + STEPS + AFTER)]
    if path == "hvd":
        cmd = [str(REPO / ".venv" / "bin" / "horovodrun"), "-np", str(workers), "--gloo", "-H", f"localhost:{workers}", *rank_cmd]
    else:
        cmd = [str(REPO / ".venv" / "bin" / "torchrun"), "--nproc_per_node", str(workers), "--master_addr", "127.0.0.1",
               "--master_port", str(port), *rank_cmd[1:]]
    if on:
        cmd = [py, "-m", "dpro.cli", "profile", "-o", str(run_dir / "trace"), "--force", "--warmup", str(WARMUP),
               "--steps", str(STEPS), "--", *cmd]
    env = {**os.environ, **settings.env(), **extra}
    if not on:
        env["DPRO_DISABLE"] = "1"
    return cmd, env


def phases(faults: list[float]) -> dict[str, float]:
    spans = {"warm-up": (1, WARMUP), "window": (WARMUP, WARMUP + STEPS), "after": (WARMUP + STEPS, None)}
    return {k: statistics.mean(faults[a:b]) for k, (a, b) in spans.items()}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--wrap":
        wrap_main(sys.argv[2], sys.argv[3:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", default="hvd", choices=sorted(SCRIPTS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cpu", action="store_true", help="also CPU time per step: main thread, other threads, "
                    "context switches (a time: run through benchmarks/measure.sh)")
    a = ap.parse_args()
    names = [v for v in a.variants.split(",") if v]
    keys = ["minflt", *(["wall_us", "main_us", "other_us", "nvcsw", "nivcsw"] if a.cpu else [])]
    per: dict[str, dict[str, list[dict[str, float]]]] = {v: {k: [] for k in keys} for v in names}
    with tempfile.TemporaryDirectory(prefix="dpro-faults-") as tmp:
        for i in range(a.rounds):
            for v in names:
                run_dir = Path(tmp) / f"{v}{i}"
                run_dir.mkdir()
                cmd, env = command(a.path, v, run_dir, 29900 + i * len(names) + names.index(v), a.workers)
                rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    timeout=900).returncode
                files = sorted(run_dir.glob("faults_rank*.json"))
                if rc or len(files) != a.workers:
                    print(f"# {v} round {i}: exit code {rc}, {len(files)} rank files", flush=True)
                    continue
                for f in files:
                    d = json.loads(f.read_text())
                    for k in keys:
                        per[v][k].append(phases(d[k]))
    print(f"# {a.path}, {a.workers} ranks, loopback, {a.rounds} rounds: per step, mean over ranks and runs: "
          f"{', '.join(keys)}")
    for k in keys:
        for v, by in per.items():
            if by[k]:
                print(f"{k:<9}{v:<10} " + "  ".join(f"{p} {statistics.mean(r[p] for r in by[k]):9.0f}"
                                                   for p in by[k][0]), flush=True)


if __name__ == "__main__":
    main()
