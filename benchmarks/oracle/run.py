"""Predicted (``dpro oracle``, analytical and ``--simulate``) vs measured iteration time of
every parallel strategy of examples/parallel/ at 2 and 4 processes over gloo.

1. fits the link cost of this machine's gloo all-reduces (gloo_link.py) into a platform
   file (``cores``: this host's CPUs, so that 4 processes on 2 cores share them);
2. profiles data parallelism on 2 processes with dpro's recorder (the oracle's input);
3. runs ``run_oracle`` on it for every strategy and device count (its grids: pipeline
   micro-batches and stages, the hybrids' groups are passed to the launcher as it advises);
4. runs every feasible strategy unprofiled (``--steps``, the first ``--skip`` dropped):
   measured iteration = median over steps of the mean over ranks;
5. prints the table (and writes it as JSON) with the predicted breakdown and the load
   average of the machine (other work on it makes the measurement noisy: say so).

    python benchmarks/oracle/run.py [--procs 2,4] [--out /tmp/dpro-oracle-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "parallel" / "train.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(n: int, script: Path, *args: str, env: dict | None = None, prefix: list[str] | None = None) -> None:
    cmd = [*(prefix or []), sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n),
           "--master_addr", "127.0.0.1", "--master_port", str(_port()), str(script), *args]
    e = {k: v for k, v in os.environ.items() if not k.startswith("DPRO_")} | {"OMP_NUM_THREADS": "1"} | (env or {})
    r = subprocess.run(cmd, cwd=REPO, env=e, capture_output=True, text=True, timeout=1200)
    if r.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r.stderr[-3000:]}")


def platform_file(out: Path) -> Path:
    from dpro.graph.comm_model import lad_link_cost, ring_steps

    samples = out / "gloo_link.json"
    torchrun(2, REPO / "benchmarks" / "oracle" / "gloo_link.py", "--out", str(samples))
    d = json.loads(samples.read_text())
    n, rows = d["world_size"], d["samples"]
    A = np.array([[ring_steps(n), ring_steps(n) * b / n] for b, _ in rows], dtype=float)
    cost = lad_link_cost(A, np.array([t for _, t in rows], dtype=float))
    plat = out / "platform.json"
    plat.write_text(json.dumps({"alpha_us": cost.alpha, "beta_us_per_byte": cost.beta, "cores": os.cpu_count(),
                                "samples": rows, "fit_error": cost.fit_error}))
    return plat


def measure(n: int, strategies: list[str], extra: list[str], out: Path, steps: int, skip: int) -> dict[str, float]:
    pattern = out / f"timing{n}_{{rank}}.json"
    torchrun(n, TRAIN, "--strategy", ",".join(strategies), "--steps", str(steps), "--timing-skip", str(skip),
             "--timing-out", str(pattern), *extra)
    per_rank = [json.loads(Path(str(pattern).format(rank=r)).read_text())["step_us"] for r in range(n)]
    return {s: statistics.median(float(np.mean([pr[s][i] for pr in per_rank])) for i in range(len(per_rank[0][s])))
            for s in strategies}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", default="2,4")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=10)
    p.add_argument("--out", type=Path, default=Path("/tmp/dpro-oracle-bench"))
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    import dpro
    from dpro.oracle import run_oracle

    args.out.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    plat = platform_file(args.out)
    trace = args.out / "trace"
    subprocess.run([sys.executable, "-m", "dpro.cli", "profile", "--force", "-o", str(trace), "--", sys.executable, "-m",
                    "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                    str(_port()), str(TRAIN), "--strategy", "data", "--steps", "16", "--batch", str(args.batch)],
                   cwd=REPO, check=True, capture_output=True, env=os.environ | {"OMP_NUM_THREADS": "1"})
    procs = [int(x) for x in args.procs.split(",")]
    res = run_oracle(dpro.open(trace), procs, batch=args.batch, platform=str(plat), simulate=True)
    rows = []
    for n in procs:
        preds = {x.strategy: x for x in res.predictions if x.devices == n and x.feasible}
        extra = []
        if "pipeline" in preds:
            launch = res.launcher(preds["pipeline"]).split()
            extra += launch[launch.index("--micro"):launch.index("--micro") + 2]
            if "--cuts" in launch:
                extra += launch[launch.index("--cuts"):launch.index("--cuts") + 2]
        hyb = [s for s in preds if "+" in s]
        if hyb:
            extra += ["--p2", str(n // preds[hyb[0]].grid["data"])]
        got = measure(n, list(preds), extra + ["--batch", str(args.batch)], args.out, args.steps, args.skip)
        for s, x in preds.items():
            sim = res.simulated.get((s, n))
            rows.append({"strategy": s, "devices": n, "measured_us": got[s], "predicted_us": x.iteration_us,
                         "error_pct": 100 * (x.iteration_us - got[s]) / got[s], "simulated_us": sim,
                         "sim_error_pct": 100 * (sim - got[s]) / got[s] if sim == sim else None,
                         "compute_us": x.compute_us, "communication_us": x.communication_us,
                         "memory_bytes": x.memory_bytes, "grid": x.grid})
    load1 = os.getloadavg()
    print(f"platform: α {res.platform.alpha_us:.1f} µs, β {res.platform.beta_us_per_byte * 1e3:.3f} ns/B; "
          f"load average before {load0[0]:.2f}, after {load1[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'strategy':<13} {'p':>2} {'measured ms':>11} {'oracle ms':>9} {'err %':>6} {'sim ms':>7} {'err %':>6}"
          f"  {'compute':>7}  communication by phase (ms)")
    for r in rows:
        comm = " ".join(f"{k} {v / 1e3:.2f}" for k, v in r["communication_us"].items() if v)
        sim = "" if r["sim_error_pct"] is None else f"{r['simulated_us'] / 1e3:7.2f} {r['sim_error_pct']:+6.1f}"
        print(f"{r['strategy']:<13} {r['devices']:>2} {r['measured_us'] / 1e3:11.2f} {r['predicted_us'] / 1e3:9.2f} "
              f"{r['error_pct']:+6.1f} {sim:>14}  {r['compute_us'] / 1e3:7.2f}  {comm}")
    (args.out / "result.json").write_text(json.dumps({"rows": rows, "load": [load0, load1],
                                                      "platform": res.platform.to_json()}, indent=1))
    print(f"wrote {args.out / 'result.json'}")


if __name__ == "__main__":
    main()
