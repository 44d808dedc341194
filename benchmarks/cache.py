"""The trace cache: `dpro replay` of a directory, first (import, cache empty) and second (from the cache).

For each trace set, ``--repeat`` rounds of: empty the cache, run ``dpro replay PATH --json``
(the first replay: imports and stores), run it again (the second: loads from the cache).
Each run is a fresh process running the ``dpro`` console command of this checkout (what a
user waits for, Python start-up included; ``python -c pass`` is timed beside it, the floor of
any process); times are
medians of wall seconds (and of CPU seconds, user + system of the child and its workers,
which the other jobs of a shared machine disturb less), and the ratio first/second is
computed from the medians of the same run. The second replay prints the cached result
(docs/scale.md, "A cache of converted traces"). Also, in this process: the import alone (``open_trace(cache=False)``) against
the load from the cache (``open_trace``), medians of ``--repeat``. The two replays' output
must be identical, byte for byte.

    python benchmarks/cache.py                      # the multi-rank corpus sets
    python benchmarks/cache.py DIR [DIR ...] --repeat 5 --json
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "traces" / "corpus"
DEFAULT = [CORPUS / "param_dlrm_8rank", CORPUS / "tl_mi300_ddp_resnet18", REPO / "examples" / "traces" / "ddp_gloo_2rank_mlp"]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def dpro_command() -> list[str]:
    """The ``dpro`` console command as pip generates it from pyproject.toml's [project.scripts]
    (``from MODULE import FUNC; sys.exit(FUNC())``), run from this checkout (PYTHONPATH), so
    that the figures are those of the code here even where the installed script is older."""
    import tomllib

    target = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["dpro"]
    mod, func = target.split(":")
    return [sys.executable, "-c", f"import sys; from {mod} import {func}; sys.argv[0] = 'dpro'; sys.exit({func}())"]


def _run(cmd: list[str], env: dict) -> tuple[float, float, bytes]:
    """Wall and CPU seconds (user + system, the child and its workers) of ``cmd``, and its stdout."""
    t0, c0 = time.perf_counter(), _cpu()
    out = subprocess.run(cmd, env=env, capture_output=True, check=True).stdout
    return time.perf_counter() - t0, _cpu() - c0, out


def bench(path: Path, repeat: int, cache_dir: Path) -> dict:
    from dpro.gtrace.cache import TraceCache
    from dpro.loader import open_trace

    env = dict(os.environ, DPRO_CACHE_DIR=str(cache_dir), PYTHONPATH=str(REPO))
    env.pop("DPRO_NO_CACHE", None)
    replay = [*dpro_command(), "replay", str(path), "--json"]
    first, second, first_cpu, second_cpu, floor, floor_cpu = [], [], [], [], [], []
    for _ in range(repeat):
        shutil.rmtree(cache_dir, ignore_errors=True)
        t1, c1, r1 = _run(replay, env)
        t2, c2, r2 = _run(replay, env)
        t0, c0, _ = _run([sys.executable, "-c", "pass"], env)  # Python's own start-up, the floor
        if r1 != r2:
            raise SystemExit(f"{path}: the second replay's output differs from the first's")
        first.append(t1)
        second.append(t2)
        first_cpu.append(c1)
        second_cpu.append(c2)
        floor.append(t0)
        floor_cpu.append(c0)
    # in-process: the import alone vs the load from the cache
    os.environ["DPRO_CACHE_DIR"] = str(cache_dir)
    imp, load = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        open_trace(path, cache=False)
        imp.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        open_trace(path, cache=True)
        load.append(time.perf_counter() - t0)
    size = sum(f.stat().st_size for f in (path.iterdir() if path.is_dir() else [path]) if f.is_file())
    entry = sum(f.stat().st_size for f in TraceCache(cache_dir).root.rglob("*") if f.is_file())
    f, s = statistics.median(first), statistics.median(second)
    fc, sc = statistics.median(first_cpu), statistics.median(second_cpu)
    i, lo = statistics.median(imp), statistics.median(load)
    return {"path": str(path), "input_bytes": size, "cache_entry_bytes": entry,
            "first_replay_s": round(f, 3), "second_replay_s": round(s, 3), "ratio": round(f / s, 2),
            "first_runs_s": [round(x, 3) for x in first], "second_runs_s": [round(x, 3) for x in second],
            "first_cpu_s": round(fc, 3), "second_cpu_s": round(sc, 3), "cpu_ratio": round(fc / sc, 2),
            "python_pass_s": round(statistics.median(floor), 3), "python_pass_cpu_s": round(statistics.median(floor_cpu), 3),
            "import_s": round(i, 3), "cached_load_s": round(lo, 3), "import_ratio": round(i / lo, 2)}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON list instead of text")
    a = ap.parse_args(argv)
    # the byte code of dpro's modules, as pip install writes it: under PYTHONDONTWRITEBYTECODE
    # every process would compile them again (~0.2 s of a first replay, ~8 ms of a hit)
    compileall.compile_dir(str(REPO / "dpro"), quiet=1)
    out = []
    with tempfile.TemporaryDirectory(prefix="dpro-cache-bench-") as tmp:
        for p in a.paths:
            if not p.exists():
                print(f"skipped (not here): {p}", file=sys.stderr)
                continue
            r = bench(p, a.repeat, Path(tmp) / "cache")
            out.append(r)
            if not a.json:
                print(f"{Path(r['path']).name}: {r['input_bytes'] / 1e6:.1f} MB in, cache entry "
                      f"{r['cache_entry_bytes'] / 1e6:.1f} MB; dpro replay first {r['first_replay_s']:.2f} s, "
                      f"second {r['second_replay_s']:.2f} s -> {r['ratio']}x (CPU {r['first_cpu_s']:.2f} s vs "
                      f"{r['second_cpu_s']:.2f} s -> {r['cpu_ratio']}x; medians of {a.repeat}; "
                      f"python -c pass {r['python_pass_s']:.3f} s); "
                      f"import {r['import_s']:.2f} s vs cached load {r['cached_load_s']:.2f} s -> {r['import_ratio']}x")
    if a.json:
        print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
