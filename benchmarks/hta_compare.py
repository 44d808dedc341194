"""dpro's import + replay against HTA's parser alone, on the same torch.profiler trace sets.

For each trace set, ``--repeat`` rounds, the two interleaved (their order alternates from
round to round), each in a fresh child process (Python start-up included):

* **HTA**: ``hta.trace_analysis.TraceAnalysis(trace_dir=DIR)`` (it parses every rank, in a
  process pool of min(cores, ranks)), nothing else;
* **dpro**: ``dpro replay DIR --json --no-cache`` (import every rank, align the clocks, op
  statistics, build the global graph, replay).

Before the rounds, one untimed run of each command writes the bytecode of every module it
imports into a private cache (``PYTHONPYCACHEPREFIX``, :func:`bytecode_env`): both tools then
start as installed packages do, whatever the checkouts' ``__pycache__`` holds.

Measured per run: wall seconds and the peak of the RSS summed over the child and its
descendants (both tools may use worker processes; ``ru_maxrss`` would give the largest one
only), sampled every 20 ms (benchmarks/proctree.py). Printed: medians, and the
ratios HTA / dpro from those medians (same run). HTA (``pip install
holistictraceanalysis``) is not a dpro dependency: without it this says so and exits 0.

    python benchmarks/hta_compare.py                         # param_dlrm_8rank + it grown to 8 x 10 MB
    python benchmarks/hta_compare.py DIR [DIR ...] --repeat 5 --gen-mb 0 --json
    python benchmarks/hta_compare.py DIR --gen-mb 0 --base /work/main   # also another checkout's dpro (before/after)

``--base CHECKOUT`` also runs that checkout's ``dpro replay`` (its code on ``PYTHONPATH``)
in the same rounds, as ``base``: a change's before and after measured in one run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import proctree  # noqa: E402
DLRM = REPO.parent / "shared" / "traces" / "corpus" / "param_dlrm_8rank"
HTA_LOAD = ("import sys; from hta.trace_analysis import TraceAnalysis; "
            "print(len(TraceAnalysis(trace_dir=sys.argv[1]).t.traces))")  # how many ranks it parsed
#: how HTA finds a file's rank: this, line by line from the top (else it takes rank 0)
HTA_RANK = re.compile(rb'"rank":\s+(\d+)')


def _commands(path: Path) -> dict[str, list[str]]:
    return {"hta": [sys.executable, "-c", HTA_LOAD, str(path)],
            "dpro": [sys.executable, "-m", "dpro.cli", "replay", str(path), "--json", "--no-cache"]}


def run_once(cmd: list[str], env: dict) -> dict:
    """Wall seconds, CPU seconds (user + system, workers included) and the peak of the
    process tree's summed RSS (:mod:`proctree`). Run in the checkout on ``PYTHONPATH``
    (``python -m`` imports from the working directory first)."""
    r = proctree.run(cmd, env=env, interval=0.02, cwd=Path(env["PYTHONPATH"]))
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return {"wall_s": r.wall_s, "cpu_s": r.cpu_s, "tree_peak_bytes": r.peak_tree_bytes, "processes": r.processes,
            "stdout": r.stdout}


def _result(stdout: str) -> object:
    """``dpro replay --json``'s output without the solver's wall time (it varies)."""
    def strip(x: object) -> object:
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k != "time_s"}
        return [strip(v) for v in x] if isinstance(x, list) else x
    return strip(json.loads(stdout))


def bench(path: Path, repeat: int, base: Path | None = None, pycache: Path | None = None) -> dict:
    """``repeat`` interleaved rounds of each tool on ``path``, after one untimed warm-up run
    of each (see :func:`bytecode_env`)."""
    env = bytecode_env(dict(os.environ, PYTHONPATH=str(REPO), DPRO_NO_CACHE="1"), pycache)
    path = path.resolve()  # the commands run in the checkout's directory
    cmds = _commands(path)
    envs = {"hta": env, "dpro": env}
    if base is not None:  # another checkout's dpro, first on the path
        cmds["base"], envs["base"] = cmds["dpro"], dict(env, PYTHONPATH=str(base.resolve()))
    for tool in cmds:  # the bytecode of every module each one imports, and the files in the page cache
        run_once(cmds[tool], envs[tool])
    runs: dict[str, list[dict]] = {t: [] for t in cmds}
    for r in range(repeat):
        for tool in (list(cmds) if r % 2 == 0 else list(cmds)[::-1]):
            runs[tool].append(run_once(cmds[tool], envs[tool]))
    n_files = sum(1 for f in path.iterdir() if f.is_file())
    ranks = int(runs["hta"][0]["stdout"])
    if ranks != n_files:
        raise SystemExit(f"{path}: HTA parsed {ranks} of {n_files} rank files: not a comparison")
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    out: dict = {"path": str(path), "files": sum(1 for f in path.iterdir() if f.is_file()), "bytes": size}
    for tool, rs in runs.items():
        for k in ("wall_s", "cpu_s", "tree_peak_bytes", "processes"):
            out[f"{tool}_{k}"] = statistics.median(x[k] for x in rs)
        out[f"{tool}_wall_runs_s"] = [round(x["wall_s"], 2) for x in rs]
    out["speedup"] = out["hta_wall_s"] / out["dpro_wall_s"]
    out["speedup_cpu"] = out["hta_cpu_s"] / out["dpro_cpu_s"]
    out["memory_ratio_tree"] = out["dpro_tree_peak_bytes"] / out["hta_tree_peak_bytes"]
    if base is not None:
        out["base_path"] = str(base)
        out["base_speedup"] = out["hta_wall_s"] / out["base_wall_s"]
        out["base_speedup_cpu"] = out["hta_cpu_s"] / out["base_cpu_s"]
        out["dpro_over_base_wall"] = out["base_wall_s"] / out["dpro_wall_s"]
        out["dpro_over_base_cpu"] = out["base_cpu_s"] / out["dpro_cpu_s"]
        if _result(runs["base"][0]["stdout"]) != _result(runs["dpro"][0]["stdout"]):
            print(f"{path}: note: dpro's output differs from the base checkout's", file=sys.stderr)
    return out


def bytecode_env(env: dict, pycache: Path | None) -> dict:
    """``env`` for the measured commands: their modules' bytecode written to and read from
    ``pycache`` (``PYTHONPYCACHEPREFIX``; the warm-up run writes it), as an installed package
    has it. With ``PYTHONDONTWRITEBYTECODE`` set and a checkout whose ``__pycache__`` is stale
    (an edited or editable checkout), every run would otherwise compile those modules from
    source again (~0.1-0.3 s), a cost neither tool has when installed; nothing is written
    into the checkouts or site-packages."""
    if pycache is None:
        return env
    env = dict(env, PYTHONPYCACHEPREFIX=str(pycache))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def generate(src: Path, out: Path, mb: int) -> Path:
    """In a child process (this one stays small while it samples the others): ``src`` grown to ``mb`` MB per rank (gen_big_trace.py), each file's ``distributedInfo``
    moved to the top as torch.profiler writes it, so that HTA finds the rank (its pattern
    wants a space after ``"rank":``, and it reads from the top)."""
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "gen_big_trace.py"), str(src), str(out), "--mb", str(mb)],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, __file__, "--rank-first", str(out)], check=True)
    return out


def rank_first(out: Path) -> None:
    """Each file of ``out`` with ``distributedInfo`` first, ``"rank": N`` spaced (for HTA)."""
    import orjson

    for f in sorted(out.iterdir()):
        with f.open("rb") as fh:
            head = fh.read(1 << 16)
        if HTA_RANK.search(head):
            continue
        doc = orjson.loads(f.read_bytes())
        info = doc.pop("distributedInfo", None)
        if info is None:
            continue
        rest = orjson.dumps(doc)
        f.write_bytes(b'{"distributedInfo": ' + json.dumps(info).encode() + (b", " + rest[1:] if len(rest) > 2 else b"}"))
        del doc, rest


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gen-mb", type=int, default=10,
                    help="also grow param_dlrm_8rank to this many MB of JSON per rank (gen_big_trace.py; 0: no)")
    ap.add_argument("--json", action="store_true", help="print one JSON list instead of text")
    ap.add_argument("--base", type=Path, help="also run this checkout's dpro (before/after in one run)")
    ap.add_argument("--rank-first", type=Path, help=argparse.SUPPRESS)  # generate()'s child
    a = ap.parse_args(argv)
    if a.rank_first:
        rank_first(a.rank_first)
        return []
    if importlib.util.find_spec("hta") is None:
        print("skipped: HTA is not installed (pip install holistictraceanalysis)")
        return []
    out = []
    with tempfile.TemporaryDirectory(prefix="dpro-hta-") as tmp:
        paths = list(a.paths) or [DLRM]
        if a.gen_mb and DLRM.exists():
            paths.append(generate(DLRM, Path(tmp) / f"param_dlrm_8rank_x{a.gen_mb}mb", a.gen_mb))
        for p in paths:
            if not p.is_dir():
                print(f"skipped (not a directory here): {p}", file=sys.stderr)
                continue
            r = bench(p, a.repeat, a.base, Path(tmp) / "pycache")
            out.append(r)
            if not a.json:
                print(f"{p.name}: {r['files']} files, {r['bytes'] / 1e6:.1f} MB on disk; medians of {a.repeat}: "
                      f"HTA load {r['hta_wall_s']:.2f} s, peak {r['hta_tree_peak_bytes'] / 2**20:.0f} MiB "
                      f"({r['hta_processes']:.0f} processes); dpro import+replay {r['dpro_wall_s']:.2f} s, peak "
                      f"{r['dpro_tree_peak_bytes'] / 2**20:.0f} MiB ({r['dpro_processes']:.0f} processes) -> dpro {r['speedup']:.2f}x faster, "
                      f"{r['memory_ratio_tree']:.2f}x HTA's peak")
                if a.base:
                    print(f"  base ({a.base}): {r['base_wall_s']:.2f} s wall, {r['base_cpu_s']:.2f} s CPU, peak "
                          f"{r['base_tree_peak_bytes'] / 2**20:.0f} MiB -> this checkout {r['dpro_over_base_wall']:.2f}x "
                          f"faster (wall), {r['dpro_over_base_cpu']:.2f}x (CPU)")
    if a.json:
        print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
