"""Where a measured step of examples/parallel/ goes, per strategy: the main thread's CPU
time, its wait for a core (run queue), the time it is blocked (in a collective, a recv),
and the CPU of the other threads (gloo's: on loopback they copy the bytes), from the
kernel's schedstat (train.py ``--timing-out``'s ``cpu_us``), with the job settings of
benchmarks/jobenv.py. Medians over the steps after the warm-up of the mean over ranks.

    benchmarks/measure.sh .venv/bin/python benchmarks/oracle/cpu_split.py --procs 2,4 \\
        --strategies data,filter,channel,spatial,pipeline --settings threads1,threads1pin

``--from-run OUT [OUT ...]`` measures nothing: it reads run.py's outputs (the per-rank
``timing<p>_<launch>_<rank>.json`` its unprofiled launches wrote, and result.json) and
splits each row's error in two: the main threads' CPU stretched by the core sharing
(``main cpu`` × max(1, p/N), what the predicted compute + host stand for) against the
predicted compute + host, and the rest of the step (``step − that``: the collectives'
CPU on the shared cores and the waits) against the predicted communication; ``gloo`` is
the other threads' CPU × max(1, p/N), the collectives' own CPU within that rest. Both
launches of a row are averaged (each: median over steps of the mean over ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "parallel" / "train.py"
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "benchmarks" / "oracle"))
import jobenv  # noqa: E402
from run import _port  # noqa: E402


def launch(n: int, strategies: list[str], setting: jobenv.JobSettings, out: Path, steps: int, skip: int,
           extra: list[str]) -> list[dict]:
    pattern = out / "t_{rank}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "--master_addr", "127.0.0.1",
           "--master_port", str(_port()), *setting.script(TRAIN), "--strategy", ",".join(strategies),
           "--steps", str(steps), "--timing-skip", str(skip), "--timing-out", str(pattern), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRO_")} | {"OMP_NUM_THREADS": "1"} | setting.env()
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r.stderr[-3000:]}")
    return [json.loads(Path(str(pattern).format(rank=k)).read_text()) for k in range(n)]


def summary(per_rank: list[dict], s: str) -> dict[str, float]:
    """Per step the mean over ranks, then the median over steps (µs)."""
    steps = len(per_rank[0]["step_us"][s])
    rows = []
    for i in range(steps):
        wall = statistics.mean(pr["step_us"][s][i] for pr in per_rank)
        c = {k: statistics.mean(pr["cpu_us"][s][i][k] for pr in per_rank) for k in per_rank[0]["cpu_us"][s][i]}
        total = sum(pr["cpu_us"][s][i]["main_cpu"] + pr["cpu_us"][s][i]["threads_cpu"] for pr in per_rank)
        rows.append({"wall": wall, **c, "blocked": wall - c["main_cpu"] - c["main_wait"], "total_cpu": total})
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def from_run(out: Path, cores: int) -> None:
    """Print the split of each row of run.py's ``out`` (ms)."""
    res = json.loads((out / "result.json").read_text())
    print(f"{out}: ms per step; busy = main cpu x max(1, p/{cores}), rest = step - busy, gloo = other threads' cpu "
          f"x max(1, p/{cores})")
    print(f"{'strategy':<13} {'p':>2} {'step':>7} {'pred':>7} {'err %':>6} | {'busy':>6} {'pred':>6} {'diff':>6} | "
          f"{'rest':>6} {'pred':>6} {'diff':>6} | {'gloo':>6} {'wait':>6}")
    for r in res["rows"]:
        s, n = r["strategy"], r["devices"]
        launches = sorted({f.name.split("_")[1] for f in out.glob(f"timing{n}_*_0.json")})
        ms = []
        for k in launches:
            per_rank = [json.loads((out / f"timing{n}_{k}_{rank}.json").read_text()) for rank in range(n)]
            if s in per_rank[0]["cpu_us"] and per_rank[0]["cpu_us"][s]:
                ms.append(summary(per_rank, s))
        if not ms:
            continue
        m = {k: statistics.mean(x[k] for x in ms) for k in ms[0]}
        f = max(1.0, n / cores)
        busy, gloo = m["main_cpu"] * f, m["threads_cpu"] * f
        pbusy = r["compute_us"] + sum(r["host_us"].values())
        pcomm = sum(r["communication_us"].values())
        print(f"{s:<13} {n:>2} {m['wall'] / 1e3:7.2f} {r['predicted_us'] / 1e3:7.2f} {r['error_pct']:+6.1f} | "
              f"{busy / 1e3:6.2f} {pbusy / 1e3:6.2f} {(pbusy - busy) / 1e3:+6.2f} | {(m['wall'] - busy) / 1e3:6.2f} "
              f"{pcomm / 1e3:6.2f} {(pcomm - m['wall'] + busy) / 1e3:+6.2f} | {gloo / 1e3:6.2f} "
              f"{m['main_wait'] / 1e3:6.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", default="2,4")
    p.add_argument("--strategies", default="data,filter,channel,spatial,pipeline")
    p.add_argument("--settings", default="threads1,threads1pin")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=10)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--from-run", type=Path, nargs="+", metavar="OUT",
                   help="measure nothing: split the rows of these run.py outputs (their timing files)")
    p.add_argument("--cores", type=int, default=os.cpu_count(), help="the cores the runs shared (--from-run)")
    args = p.parse_args()
    cores = os.cpu_count()
    if args.from_run:
        for out in args.from_run:
            from_run(out, args.cores)
        return
    strategies = args.strategies.split(",")
    print(f"load average {os.getloadavg()[0]:.2f} on {cores} CPUs; ms per step (median over steps of the mean over "
          f"ranks); util = all ranks' CPU / (cores x wall)")
    print(f"{'setting':<12} {'strategy':<12} {'p':>2} {'wall':>7} {'main cpu':>8} {'main wait':>9} {'blocked':>7} "
          f"{'gloo cpu':>8} {'gloo wait':>9} {'in comm':>7} {'util':>5}")
    with tempfile.TemporaryDirectory(prefix="dpro-cpu-split-") as tmp:
        for n in [int(x) for x in args.procs.split(",")]:
            for k in range(args.repeats):
                for name in args.settings.split(","):
                    order = strategies if k % 2 == 0 else strategies[::-1]
                    got = launch(n, order, jobenv.SETTINGS[name], Path(tmp), args.steps, args.skip,
                                 ["--batch", str(args.batch), "--micro", str(4 * n)] + (["--p2", "2"] if n > 2 else []))
                    for s in strategies:
                        m = summary(got, s)
                        print(f"{name:<12} {s:<12} {n:>2} {m['wall'] / 1e3:7.2f} {m['main_cpu'] / 1e3:8.2f} "
                              f"{m['main_wait'] / 1e3:9.2f} {m['blocked'] / 1e3:7.2f} {m['threads_cpu'] / 1e3:8.2f} "
                              f"{m['threads_wait'] / 1e3:9.2f} {m['comm'] / 1e3:7.2f} "
                              f"{m['total_cpu'] / (cores * m['wall']):5.2f}", flush=True)


if __name__ == "__main__":
    main()
