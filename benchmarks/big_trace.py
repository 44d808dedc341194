"""Import + replay of big traces (issue #27): time and peak memory of `dpro replay --no-cache`.

    python benchmarks/big_trace.py one  --mb 1000 [--baseline /path/to/other/checkout]
    python benchmarks/big_trace.py many --ranks 64 --mb 100

``one``: a one-rank trace of about MB megabytes of plain JSON made by
benchmarks/gen_big_trace.py from a real recording (default: the corpus's
tl_h100_timesformer, an H100 trace with shapes and Python stacks). ``many``: RANKS rank
files (rank0.json ...) of about MB each; a one-rank source has no collectives to repeat
across ranks, so the ranks are hard links to one generated file (the same bytes read
RANKS times: the reading is real, the page cache makes the disk free). The import runs
its ranks in its default local process pool.

For each, `python -m dpro.cli replay --no-cache --json` runs in a child; the peak of the RSS
summed over its process tree (workers included, sampled from /proc) and the wall time are
printed (and the CPU seconds, user + system, which the other jobs of a shared machine
disturb less), with ``--baseline`` the same for another checkout's dpro on the same files.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import proctree  # noqa: E402

CORPUS = REPO.parent / "shared" / "traces" / "corpus" / "tl_h100_timesformer"


def _gen(src: Path, out: Path, mb: float) -> Path:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_big_trace", REPO / "benchmarks" / "gen_big_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    if not out.exists():
        mod.generate(src, out, mb=mb)
    return out


def _run(name: str, repo: Path, path: Path, nbytes: int) -> None:
    env = dict(os.environ, PYTHONPATH=str(repo))
    r = proctree.run([sys.executable, "-m", "dpro.cli", "--max-input-bytes", "8GiB", "replay", "--no-cache", "--json",
                      str(path)], env=env, cwd=repo)
    status = "ok" if r.returncode == 0 else f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1][:160]}"
    print(f"{name:>8} {nbytes / 1e6:9.1f} {r.wall_s:8.1f} {r.cpu_s:7.1f} {r.peak_tree_bytes / 1e6:12.1f} "
          f"{r.peak_tree_bytes / nbytes:10.2f} {r.processes:5d}  {status}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=["one", "many"])
    ap.add_argument("--mb", type=float, default=1000.0, help="MB of JSON per rank file")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--src", type=Path, default=CORPUS)
    ap.add_argument("--work", type=Path, default=Path("/tmp/dpro-big"))
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout to run on the same files")
    ap.add_argument("--only-baseline", action="store_true", help="run the baseline only")
    a = ap.parse_args()
    one = _gen(a.src, a.work / f"one-{a.mb:g}MB", a.mb)
    if a.shape == "one":
        path = one
    else:
        path = a.work / f"many-{a.ranks}x{a.mb:g}MB"
        path.mkdir(parents=True, exist_ok=True)
        (f,) = sorted(one.iterdir())
        for r in range(a.ranks):
            dst = path / f"rank{r}.json"
            if not dst.exists():
                os.link(f, dst)
    nbytes = sum(p.stat().st_size for p in path.iterdir())
    print(f"{'code':>8} {'JSON MB':>9} {'wall s':>8} {'CPU s':>7} {'peak RSS MB':>12} {'peak/JSON':>10} {'procs':>5}  result")
    runs = ([] if a.only_baseline else [("this", REPO)]) + ([("baseline", a.baseline)] if a.baseline else [])
    for name, repo in runs:
        _run(name, repo.resolve(), path, nbytes)


if __name__ == "__main__":
    main()
