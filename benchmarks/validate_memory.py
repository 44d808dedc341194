"""Peak memory of `dpro validate` against the size of the trace it reads (issue #32: the
goal is a peak of at most 2x the JSON size on a 500 MB trace).

A trace of about SIZE_MB of plain JSON is made by repeating the steps of the bundled real
2-rank DDP recording (examples/traces/ddp_gloo_2rank_mlp): each copy shifted in time by the
recording's span and its ProfilerStep numbers shifted past the previous copy's. Then
`python -m dpro.cli validate` runs on it in a child process; its peak RSS (ru_maxrss) and
wall time are printed with the ratio to the JSON size.

Usage: python benchmarks/validate_memory.py [SIZE_MB ...] [--work /tmp/dpro-valmem]
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "examples" / "traces" / "ddp_gloo_2rank_mlp"
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def make_trace(out: Path, size_mb: float) -> int:
    """Write rank0.json, rank1.json of about ``size_mb`` MB in all; returns the bytes."""
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for src in sorted(SRC.glob("rank*.json.gz")):
        d = orjson.loads(gzip.decompress(src.read_bytes()))
        evs = d["traceEvents"]
        xs = [e for e in evs if e.get("ph") == "X"]
        t0 = min(e["ts"] for e in xs)
        span = max(e["ts"] + e.get("dur", 0) for e in xs) - t0 + 1000.0
        steps = [int(m.group(1)) for e in xs if (m := _STEP.match(str(e.get("name", ""))))]
        nsteps = max(steps) + 1 if steps else 1
        one = len(orjson.dumps(xs))
        copies = max(1, int(size_mb * 1e6 / 2 / one))
        dst = out / src.name.removesuffix(".gz")
        with dst.open("wb") as f:
            head = {k: v for k, v in d.items() if k != "traceEvents"}
            f.write(orjson.dumps(head)[:-1] + b', "traceEvents": [')
            f.write(b",".join(orjson.dumps(e) for e in evs if e.get("ph") != "X"))
            for c in range(copies):
                chunk = []
                for e in xs:
                    e2 = dict(e, ts=e["ts"] + c * span)
                    m = _STEP.match(str(e.get("name", "")))
                    if m:
                        e2["name"] = f"ProfilerStep#{int(m.group(1)) + c * nsteps}"
                    chunk.append(orjson.dumps(e2))
                f.write(b"," + b",".join(chunk))
            f.write(b"]}")
        total += dst.stat().st_size
    return total


def measure(path: Path) -> tuple[int, float, int, str]:
    """(peak RSS bytes, wall s, exit code, last line) of `dpro validate path` in a child."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "dpro.cli", "--max-input-bytes", "8GiB", "validate", str(path)],
                       capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux; max over children so far
    last = (r.stdout.strip() or r.stderr.strip()).splitlines()[-1][:160] if (r.stdout or r.stderr) else ""
    return peak, wall, r.returncode, last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sizes", nargs="*", type=float, default=[50.0], help="JSON sizes in MB, in increasing order")
    ap.add_argument("--work", default="/tmp/dpro-valmem")
    a = ap.parse_args()
    print(f"{'JSON MB':>8} {'peak RSS MB':>12} {'peak/JSON':>10} {'wall s':>7}  result")
    for size in sorted(a.sizes):  # increasing: ru_maxrss of the children is a running maximum
        work = Path(a.work) / f"{size:g}MB"
        shutil.rmtree(work, ignore_errors=True)
        nbytes = make_trace(work, size)
        peak, wall, code, last = measure(work)
        print(f"{nbytes / 1e6:8.1f} {peak / 1e6:12.1f} {peak / nbytes:10.2f} {wall:7.1f}  exit {code}: {last}")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
