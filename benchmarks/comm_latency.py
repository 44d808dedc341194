"""What one small AllReduce costs on its own: gloo, 2 ranks, each in its own network namespace.

Why: a profile whose collectives all have one size (one DDP bucket) cannot separate the
link's per-message latency (alpha) from its bandwidth; this measures the latency a probe
after the profiling window would see, to compare with what the job's own collectives pay
(docs/optimizer.md, "Limits"). Per trial: a barrier, then ``--count`` AllReduces of
``--bytes`` either one after the other (blocking) or all launched at once (async);
prints per-AllReduce µs (median, min, max over trials) for each mode.

    sudo python benchmarks/comm_latency.py --cap-mbit 200 [--bytes 1024] [--trials 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RANK = r"""
import json, os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
torch.set_num_threads(1)
nb, count, trials = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
big = torch.ones(1 << 20)  # the job's last bucket just went over the link
for _ in range(3):
    dist.all_reduce(big)
t = torch.ones(max(1, nb // 4))
out = {"blocking": [], "async": []}
for mode in out:
    for _ in range(trials):
        dist.barrier()
        t0 = time.perf_counter_ns()
        if mode == "blocking":
            for _ in range(count):
                dist.all_reduce(t)
        else:
            for w in [dist.all_reduce(t.clone(), async_op=True) for _ in range(count)]:
                w.wait()
        out[mode].append((time.perf_counter_ns() - t0) / 1e3 / count)
if dist.get_rank() == 0:
    open(sys.argv[1], "w").write(json.dumps(out))
dist.barrier()
dist.destroy_process_group()
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cap-mbit", type=float, default=200.0, help="tbf cap per direction per rank (Mbit/s)")
    p.add_argument("--bytes", type=int, default=1024)
    p.add_argument("--count", type=int, default=10, help="AllReduces per trial")
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--port", type=int, default=29711)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks" / "fidelity"))
    from netns import NetnsCluster
    from run import run_processes

    with tempfile.TemporaryDirectory(prefix="dpro-lat-") as tmp, NetnsCluster(2, rate_mbit=args.cap_mbit) as net:
        script, res = Path(tmp) / "rank.py", Path(tmp) / "out.json"
        script.write_text(RANK)
        cmds = [net.exec_prefix(r) + ["env", *net.env_assignments(r, args.port), sys.executable, str(script), str(res),
                                      str(args.bytes), str(args.count), str(args.trials)] for r in range(2)]
        err = run_processes(cmds, Path(tmp) / "logs", 600, lambda _: None)
        if err:
            sys.exit(f"comm_latency: {err}")
        out = json.loads(res.read_text())
    wire_us = args.bytes * 8 / args.cap_mbit  # 2 ranks: each sends B bytes in all
    summary = {m: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)} for m, v in out.items()}
    if args.json:
        print(json.dumps({"cap_mbit": args.cap_mbit, "bytes": args.bytes, "count": args.count,
                          "wire_us": wire_us, "modes": summary, "trials_us": out}))
        return
    print(f"gloo AllReduce of {args.bytes} B, 2 ranks, {args.cap_mbit:g} Mbit/s, {args.trials} trials x {args.count} "
          f"(wire time {wire_us:.0f} us); cpu: {os.cpu_count()} cores")
    for m, s in summary.items():
        print(f"  {m:<9} per AllReduce: median {s['median_us']:7.0f} us   min {s['min_us']:7.0f}   max {s['max_us']:7.0f}")


if __name__ == "__main__":
    main()
