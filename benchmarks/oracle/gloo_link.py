"""Calibrate what the oracle charges (dpro/oracle/measure.py) in ranks started by any
launcher (torchrun, or netns_launch.py's capped namespaces); rank 0 writes the samples.

    torchrun --nproc_per_node 2 benchmarks/oracle/gloo_link.py --out samples.json

``dpro calibrate --oracle`` does the same in local processes (loopback) and fits them; this
script is for launches it cannot make (benchmarks/oracle/run.py --cap-mbit), whose samples
run.py fits with dpro.oracle.calibration.platform_from_samples.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dpro.oracle.measure import rank_samples  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=5, help="calls per size and round")
    p.add_argument("--rounds", type=int, default=6, help="rounds over every size, each in a new order")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-host", action="store_true", help="collectives only")
    p.add_argument("--compute-us", type=float, default=0.0, help="compute before every timed call (µs)")
    p.add_argument("--idle-us", type=float, default=8000.0, help="idle before every timed call (µs)")
    p.add_argument("--stream-calls", type=int, default=8, help="calls in a row per back-to-back sample (0: none)")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    got = rank_samples(reps=args.reps, rounds=args.rounds, warmup=args.warmup, seed=args.seed,
                       compute_us=args.compute_us, idle_us=args.idle_us, host=not args.no_host,
                       stream_calls=args.stream_calls)
    if got is not None:
        Path(args.out).write_text(json.dumps(got))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
