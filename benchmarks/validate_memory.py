"""Peak memory of `dpro validate` against the size of the trace it reads (issue #32: the
goal is a peak of at most 2x the JSON size on a 500 MB trace).

A trace of about SIZE_MB of plain JSON is made by repeating the steps of the bundled real
2-rank DDP recording (examples/traces/ddp_gloo_2rank_mlp): each copy shifted in time by the
recording's span and its ProfilerStep numbers shifted past the previous copy's. Then
`python -m dpro.cli validate` runs on it in a child process; the peak of the RSS summed over
its process tree (the import's worker processes included, sampled from /proc) and the wall
time are printed with the ratio to the JSON size.

Usage: python benchmarks/validate_memory.py [SIZE_MB ...] [--work /tmp/dpro-valmem]
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proctree  # noqa: E402

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


def measure(path: Path, repo: Path = REPO) -> tuple[int, float, int, str, int]:
    """(peak RSS bytes summed over the process tree, wall s, exit code, last line, most
    processes at once) of `dpro validate path` (the dpro of ``repo``) in a child; the
    trace cache goes to a folder beside the trace (written, as a user's run does)."""
    env = dict(os.environ, PYTHONPATH=str(repo), DPRO_CACHE_DIR=str(path.parent / f"cache-{repo.name}"))
    r = proctree.run([sys.executable, "-m", "dpro.cli", "--max-input-bytes", "8GiB", "validate", str(path)], env=env,
                     cwd=repo)
    last = (r.stdout.strip() or r.stderr.strip()).splitlines()[-1][:160] if (r.stdout or r.stderr) else ""
    return r.peak_tree_bytes, r.wall_s, r.returncode, last, r.processes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sizes", nargs="*", type=float, default=[50.0], help="JSON sizes in MB, in increasing order")
    ap.add_argument("--work", default="/tmp/dpro-valmem")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="Also run the dpro of this checkout (e.g. the main branch) on the same trace.")
    a = ap.parse_args()
    print(f"{'code':>8} {'JSON MB':>8} {'peak RSS MB':>12} {'peak/JSON':>10} {'wall s':>7} {'procs':>5}  result")
    for size in sorted(a.sizes):
        work = Path(a.work) / f"{size:g}MB"
        shutil.rmtree(work, ignore_errors=True)
        nbytes = make_trace(work / "trace", size)
        for name, repo in [("this", REPO)] + ([("baseline", a.baseline)] if a.baseline else []):
            peak, wall, code, last, procs = measure(work / "trace", repo)
            print(f"{name:>8} {nbytes / 1e6:8.1f} {peak / 1e6:12.1f} {peak / nbytes:10.2f} {wall:7.1f} {procs:5d}  "
                  f"exit {code}: {last}", flush=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
