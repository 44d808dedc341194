"""Cost of dpro's NCCL profiler plugin callbacks, in ns per event.

NCCL's proxy thread makes five calls per network step (chunk): startEvent, three
recordEventState and stopEvent; the plugin turns them into one step record. Timing that
from Python measures ctypes (about a microsecond a call), not the plugin, so the figure
comes from ``native/nccl_patch/bench.c``: a C driver that loads the plugin with dlopen and
calls it through the exported ``ncclProfiler_v5`` struct, as NCCL does, in a loop. This
script builds it (``make -C native/nccl_patch``), runs it ``--repeat`` times and prints the
median; ``--python`` also times the same five calls through ctypes, for contrast.

Cases: tracing (every step recorded; the first touch of the record pages included, or not
with ``--prefault``); buffer full (records exhausted, each step counted as dropped); not
tracing (a communicator without a trace directory); the clock read alone
(clock_gettime(CLOCK_REALTIME), 4 per send step record, 5 per receive); and the cost per
record of writing the JSON-lines file at finalize (off the hot path).

    python benchmarks/nccl_plugin_overhead.py
    python benchmarks/nccl_plugin_overhead.py --steps 2000000 --repeat 5 --json
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

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "native" / "nccl_patch"


def build(build_dir: Path) -> tuple[Path, Path]:
    if shutil.which("make") is None or shutil.which("gcc") is None:
        sys.exit("nccl_plugin_overhead: needs gcc and make")
    subprocess.run(["make", "-s", "-C", str(SRC), f"BUILD={build_dir}"], check=True)
    return build_dir / "libnccl-profiler-dpro.so", build_dir / "bench"


def run_bench(bench: Path, lib: Path, steps: int, prefault: bool) -> dict:
    env = dict(os.environ)
    env.pop("DPRO_NCCL_TRACE_DIR", None)
    if prefault:
        env["DPRO_NCCL_TRACE_PREFAULT"] = "1"
    with tempfile.TemporaryDirectory() as out:
        r = subprocess.run([str(bench), str(lib), str(steps), out], capture_output=True, text=True, env=env, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def python_ctypes_ns(lib: Path, steps: int) -> float:
    """The same five calls per step through ctypes (what a Python harness would cost)."""
    sys.path.insert(0, str(REPO / "tests"))
    import ctypes as C

    from test_nccl_plugin import Plugin, StateArgs, coll_descr, op_descr, step_descr  # the test's ctypes ABI

    with tempfile.TemporaryDirectory() as out:
        os.environ["DPRO_NCCL_TRACE_DIR"] = out
        os.environ["DPRO_NCCL_TRACE_EVENTS"] = str(steps + 16)
        p = Plugin(lib)
        ctx, _ = p.init(0, 2)
        hc = p.start(ctx, coll_descr(0, 0, 1 << 20, 1, b"RING"))
        ho = p.start(ctx, op_descr(0, hc, 0, 1, steps, 1 << 19, True))
        start, record, stop = p.v5.startEvent, p.v5.recordEventState, p.v5.stopEvent
        d = step_descr(0, ho, 0)
        a = StateArgs(transSize=1 << 19)
        h = C.c_void_p()
        t0 = time.perf_counter()
        for i in range(steps):
            d.proxyStep.step = i
            start(ctx, C.byref(h), C.byref(d))
            record(h, 8, C.byref(a))
            record(h, 20, C.byref(a))
            record(h, 9, C.byref(a))
            stop(h)
        dt = time.perf_counter() - t0
        p.finalize(ctx)
    return 1e9 * dt / steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=1_000_000, help="step records per run (default 1M)")
    ap.add_argument("--repeat", type=int, default=3, help="runs; the median is printed (default 3)")
    ap.add_argument("--prefault", action="store_true", help="map the record pages at init (DPRO_NCCL_TRACE_PREFAULT=1)")
    ap.add_argument("--python", action="store_true", help="also time the calls through ctypes")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as bd:
        lib, bench = build(Path(bd))
        runs = [run_bench(bench, lib, args.steps, args.prefault) for _ in range(max(1, args.repeat))]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "steps"}
        med["steps"] = args.steps
        med["repeat"] = len(runs)
        med["prefault"] = args.prefault
        if args.python:
            med["python_ctypes_ns_per_step"] = python_ctypes_ns(lib, min(args.steps, 200_000))
    if args.json:
        print(json.dumps(med))
        return 0
    print(f"dpro NCCL plugin, {args.steps} step records per run, median of {len(runs)} run(s)"
          + (" (pages prefaulted)" if args.prefault else ""))
    print(f"  tracing:       {med['ns_per_step']:8.1f} ns per step event (5 callbacks: {med['ns_per_callback']:.1f} ns each)")
    print(f"  buffer full:   {med['ns_per_step_full']:8.1f} ns per step event (counted as dropped)")
    print(f"  not tracing:   {med['ns_per_step_off']:8.1f} ns per step event")
    print(f"  clock read:    {med['ns_per_clock_read']:8.1f} ns per clock_gettime(CLOCK_REALTIME)")
    print(f"  file writing:  {med['ns_per_record_written']:8.1f} ns per record at finalize (off the hot path)")
    if "python_ctypes_ns_per_step" in med:
        print(f"  via ctypes:    {med['python_ctypes_ns_per_step']:8.1f} ns per step event (Python call overhead)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
