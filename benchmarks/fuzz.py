"""The long fuzzing run of issue #32: mutated real inputs of every format through every
reading command; prints counts per outcome and per command (tests/fuzz/fuzzlib.py says
what each outcome means) and the cases that went wrong.

Usage: python benchmarks/fuzz.py [--cases 10000] [--seed 1] [--jobs 2] [--subprocess-every 50]
                                 [--work /tmp/dpro-fuzz] [--json results.json]
       python benchmarks/fuzz.py --summarize WORK [WORK ...] [--recheck]

``--summarize`` prints the tables from the per-case logs (``WORK/w<j>.jsonl``) of runs,
finished or stopped; ``--recheck`` runs their bad cases again with the current code (each
case is reproducible from its seed, campaign seed and index).

Cases run in-process (click's CliRunner, SIGALRM timeout) in ``--jobs`` worker processes;
every ``--subprocess-every``-th case runs as a real ``python -m dpro.cli`` process instead.
Exit status 1 when any case ended in a bad outcome.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "fuzz"))
sys.path.insert(0, str(REPO))

import fuzzlib  # noqa: E402
import orjson  # noqa: E402


def _worker(args: tuple[int, int, int, int, str, int]) -> list[dict]:
    start, step, n, base, work, sub_every = args
    log = (Path(work) / f"w{start}.jsonl").open("ab")  # one line per case as it ends (a cut run can be read)

    def note(r: fuzzlib.Result) -> None:
        log.write(orjson.dumps(asdict(r)) + b"\n")
        log.flush()

    res = fuzzlib.campaign(n, base, Path(work) / f"w{start}", subprocess_every=sub_every, start=start, step=step,
                           progress=note)
    return [asdict(r) for r in res]


def _logged(work: Path) -> list[dict]:
    """The cases a run logged, with their index when the log predates Result.index
    (worker j of J runs cases j, j + J, ...; the run's meta.json says J and the seed)."""
    meta = orjson.loads((work / "meta.json").read_bytes())
    out = []
    for j in range(meta["jobs"]):
        f = work / f"w{j}.jsonl"
        lines = f.read_bytes().splitlines() if f.exists() else []
        for k, ln in enumerate(lines):
            r = orjson.loads(ln)
            if r.get("index", -1) < 0:
                r["index"] = j + k * meta["jobs"]
            r["base_seed"] = meta["seed"]
            out.append(r)
    return out


def report(results: list[dict], header: str) -> list[dict]:
    """Print the counts per outcome, command, seed and mutation level; returns the bad cases."""
    by_outcome = collections.Counter(r["outcome"] for r in results)
    by_cmd: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in results:
        by_cmd[r["command"]][r["outcome"]] += 1
    modes = collections.Counter(r["mode"] for r in results)
    seeds = collections.Counter(r["seed"] for r in results)
    print(f"{len(results)} cases, {header} ({modes['in-process']} in-process, {modes['subprocess']} in subprocesses)")
    print("outcomes: " + ", ".join(f"{k} {by_outcome.get(k, 0)}" for k in ("clean-error", "success", *fuzzlib.BAD_OUTCOMES)))
    width = max([len(c) for c in by_cmd] + [7])
    cols = ("clean-error", "success", *fuzzlib.BAD_OUTCOMES)
    print(f"{'command':<{width}}  " + "  ".join(f"{c:>13}" for c in cols))
    for cmd in sorted(by_cmd):
        print(f"{cmd:<{width}}  " + "  ".join(f"{by_cmd[cmd].get(c, 0):>13}" for c in cols))
    print("seeds: " + ", ".join(f"{k} {v}" for k, v in sorted(seeds.items())))
    muts = collections.Counter(m.split(":")[0] for r in results for m in r["mutations"])
    print("mutations: " + ", ".join(f"{k} {v}" for k, v in sorted(muts.items())))
    bad = [r for r in results if r["outcome"] in fuzzlib.BAD_OUTCOMES]
    for r in bad[:50]:
        print(f"BAD {r['outcome']}: {r['seed']} {r['command']} {r['mutations']}: {r['detail']}")
    return bad


def summarize(works: list[str], recheck: bool) -> None:
    results = [r for w in works for r in _logged(Path(w))]
    bad = report(results, "from the logs of " + ", ".join(works))
    if not (recheck and bad):
        sys.exit(1 if bad else 0)
    tmp = Path(works[0]) / "recheck"
    seeds = {s.name: s for s in fuzzlib.build_seeds(tmp / "seeds")}
    still = 0
    for r in bad:
        new = fuzzlib.run_case(seeds[r["seed"]], r["index"], r["base_seed"], tmp / "cases",
                               subprocess_mode=r["mode"] == "subprocess")
        still += new.outcome in fuzzlib.BAD_OUTCOMES
        print(f"RECHECK case {r['index']} ({r['seed']} {r['command']}): was {r['outcome']}, now {new.outcome}: {new.detail[:160]}")
    print(f"recheck: {len(bad) - still} of {len(bad)} bad cases now end well")
    sys.exit(1 if still else 0)


def main() -> None:
    if "--summarize" in sys.argv:
        i = sys.argv.index("--summarize")
        summarize([a for a in sys.argv[i + 1:] if not a.startswith("--")], "--recheck" in sys.argv)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--subprocess-every", type=int, default=50)
    ap.add_argument("--work", default="/tmp/dpro-fuzz")
    ap.add_argument("--json", dest="json_out", default=None, help="Write every case's result here.")
    a = ap.parse_args()
    t0 = time.perf_counter()
    Path(a.work).mkdir(parents=True, exist_ok=True)
    (Path(a.work) / "meta.json").write_bytes(orjson.dumps({"seed": a.seed, "jobs": a.jobs, "cases": a.cases}))
    parts = [(j, a.jobs, a.cases, a.seed, a.work, a.subprocess_every) for j in range(a.jobs)]
    with mp.get_context("fork").Pool(a.jobs) as pool:
        results = [r for part in pool.map(_worker, parts) for r in part]
    wall = time.perf_counter() - t0
    bad = report(results, f"seed {a.seed}, {a.jobs} jobs, {wall:.0f} s wall")
    if a.json_out:
        Path(a.json_out).write_bytes(orjson.dumps(results))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
