"""Where a measured step of examples/parallel/ goes, per strategy: the main thread's CPU
time, its wait for a core (run queue), the time it is blocked (in a collective, a recv),
and the CPU of the other threads (gloo's: on loopback they copy the bytes), from the
kernel's schedstat (train.py ``--timing-out``'s ``cpu_us``), with the job settings of
benchmarks/jobenv.py. Medians over the steps after the warm-up of the mean over ranks.

    benchmarks/measure.sh .venv/bin/python benchmarks/oracle/cpu_split.py --procs 2,4 \\
        --strategies data,filter,channel,spatial,pipeline --settings threads1,threads1pin
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", default="2,4")
    p.add_argument("--strategies", default="data,filter,channel,spatial,pipeline")
    p.add_argument("--settings", default="threads1,threads1pin")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=10)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()
    cores = os.cpu_count()
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
