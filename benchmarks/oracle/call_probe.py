"""What one small point-to-point call costs, in the calibration's conditions and in a step's
(#29, session 27: the small-call α under a token-bucket cap).

    python benchmarks/oracle/call_probe.py --out probe.json [--cap-mbit 200] [--procs 2]

The driver starts ``--procs`` ranks of this script (torchrun on loopback, or one per network
namespace of a ``tbf`` cap: benchmarks/fidelity/netns.py); rank 0 writes the samples. Pairs
0→1, 2→3 send blocking ``dist.send`` / ``dist.recv`` (the pipeline's calls), ``--calls``
messages per sample, in these modes (interleaved over ``--rounds`` rounds, shuffled):

* ``b2b``:   idle ``--idle-us``, barrier, the calls back to back (the calibration's stream);
* ``b2b0``:  the same without the idle;
* ``step``:  idle, barrier, then every call after ``--compute-us`` of compute on the sender
  (the receiver waits in its recv, as a pipeline stage does): the time inside each call;
* ``step0``: the same without the idle;
* ``xb2b``, ``xstep``: the halo exchange (isend + irecv with the peer, then wait) back to
  back as ``b2b``, and each after ``--compute-us`` of compute on both ranks;
* ``pong``:  idle, barrier, round trips (0 sends, 1 answers): half a round trip per message;
* ``pipe``, ``pipe2``: a two-stage GPipe step (examples/parallel/strategies.gpipe_step's
  calls): ``--calls`` micro-batches forward (0 computes, sends; 1 receives, computes),
  then backward (1 computes, sends; 0 receives, computes); ``pipe``: stage 0 computes
  ``--compute-us``, stage 1 0.6 of it (the receiver waits in its recv), ``pipe2`` the other
  way round (the sender waits for the receiver's recv: gloo's rendezvous); per message:
  the step's time on rank 0 less rank 0's and 1's compute on its path, over 2·calls;
* ``gapG``:  idle, barrier, then ``--big`` bytes per message, each after G µs of compute on
  the sender (``--gaps``): how much the bucket refills between large messages;
* ``agG``:   the same with ``dist.all_gather`` of ``--big`` bytes per rank, every rank
  computing G µs before each (filter parallelism's forward).

Per sample (µs per message): the time inside the calls, sender and receiver apart; the
``latency``: from a send's start to its recv's end (the ranks share the host's monotonic
clock), the mean over the messages (``pong``: half a round trip); the ``span``: from the
first send's start to the last recv's end, over the messages.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODES = ("b2b", "b2b0", "step", "step0", "pong", "xb2b", "xstep")


def _busy(us: float, a) -> None:
    import torch

    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        torch.mm(a, a)


def rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    peer = rank + 1 if rank % 2 == 0 else rank - 1
    sender = rank % 2 == 0
    sizes = [int(s) for s in args.sizes.split(",")]
    bufs = {s: torch.ones(s // 4) for s in sizes + ([args.big] if args.big else [])}
    mat = torch.randn(64, 64)
    for s in sizes + ([args.big] if args.big else []):  # warm-up
        for _ in range(5):
            dist.barrier()
            (dist.send if sender else dist.recv)(bufs[s], peer)
    plan = [(m, s) for m in args.modes.split(",") for s in sizes]
    if args.big:  # large messages after a gap of compute each: does the bucket refill during α?
        plan += [(f"{k}{g}", args.big) for g in args.gaps.split(",") for k in ("gap", "ag")]
    parts = [torch.empty(max([args.big, *sizes]) // 4) for _ in range(n)]
    rng = random.Random(0)
    mine: list[list[float]] = []
    keys: list[tuple[int, str, int]] = []
    for r in range(args.rounds):
        rng.shuffle(plan)
        for m, s in plan:
            for _ in range(args.reps):
                if not m.endswith("0"):
                    time.sleep(args.idle_us * 1e-6)
                dist.barrier()
                inside, starts, ends = 0.0, [], []
                if m.startswith("pipe"):  # a GPipe step of two stages, forward then backward
                    c0, c1 = (args.compute_us, 0.6 * args.compute_us)[:: 1 if m == "pipe" else -1]
                    t0 = time.perf_counter()
                    for _ in range(args.calls):  # forward: 0 -> 1
                        if sender:
                            _busy(c0, mat)
                            dist.send(bufs[s], peer)
                        else:
                            dist.recv(bufs[s], peer)
                            _busy(c1, mat)
                    for _ in range(args.calls):  # backward: 1 -> 0
                        if sender:
                            dist.recv(bufs[s], peer)
                            _busy(c0, mat)
                        else:
                            _busy(c1, mat)
                            dist.send(bufs[s], peer)
                    took = time.perf_counter() - t0
                    # the compute on the step's critical path: the slower stage's 2·calls, the
                    # other's first forward and last backward (pipeline fill and drain)
                    crit = 2 * args.calls * max(c0, c1) + 2 * min(c0, c1)
                    inside = (took - crit * 1e-6) / 2
                    starts.append(t0)
                    ends.append(t0 + took)
                elif m == "pong":
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        if sender:
                            starts.append(time.perf_counter())
                            dist.send(bufs[s], peer)
                            dist.recv(bufs[s], peer)
                            ends.append(time.perf_counter())
                        else:
                            dist.recv(bufs[s], peer)
                            dist.send(bufs[s], peer)
                    inside = (time.perf_counter() - t0) / 2
                else:
                    for _ in range(args.calls):
                        if sender and m.startswith("step"):
                            _busy(args.compute_us, mat)
                        elif sender and m.startswith("gap"):
                            _busy(float(m[3:]), mat)
                        elif m.startswith("ag"):  # every rank: compute, then an all-gather (filter's)
                            _busy(float(m[2:]), mat)
                        elif m == "xstep":
                            _busy(args.compute_us, mat)
                        t0 = time.perf_counter()
                        if m.startswith("ag"):
                            dist.all_gather(parts, bufs[s])
                        elif m.startswith("x"):  # the halo exchange (strategies._exchange) with the peer
                            qs = [dist.isend(bufs[s], peer), dist.irecv(parts[0][: s // 4], peer)]
                            for q in qs:
                                q.wait()
                        else:
                            (dist.send if sender else dist.recv)(bufs[s], peer)
                        t1 = time.perf_counter()
                        inside += t1 - t0
                        starts.append(t0)
                        ends.append(t1)
                # the clock is the host's monotonic one in every rank (namespaces share it)
                mine.append([inside * 1e6 / args.calls, sum(starts) * 1e6, starts[0] * 1e6 if starts else 0.0,
                             ends[-1] * 1e6 if ends else 0.0, sum(ends) * 1e6])
                keys.append((r, m, s))
    every = [torch.empty((len(mine), 5), dtype=torch.float64) for _ in range(n)]
    dist.all_gather(every, torch.tensor(mine, dtype=torch.float64))
    if rank == 0:
        rows = []
        for i, (r, m, s) in enumerate(keys):
            a, b = every[0][i].tolist(), every[1][i].tolist()
            c = args.calls
            if m == "pong":  # half a round trip per message, from rank 0's clock
                lat = (a[4] - a[1]) / c / 2
                span = (a[3] - a[2]) / c / 2
            else:  # send's start to the recv's end, per message; and the stream's span per message
                lat = (b[4] - a[1]) / c
                span = (b[3] - a[2]) / c
            rows.append({"round": r, "mode": m, "bytes": s, "send_us": a[0], "recv_us": b[0],
                         "latency_us": lat, "span_us": span})
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}))
    dist.destroy_process_group()


def summary(path: Path) -> str:
    import statistics as st

    d = json.loads(path.read_text())
    by: dict[tuple[str, int], list[dict]] = {}
    for x in d["rows"]:
        by.setdefault((x["mode"], x["bytes"]), []).append(x)
    out = [f"{path}: µs per message, median / mean over the samples",
           f"{'mode':6} {'bytes':>7} | {'in send':>13} | {'in recv':>13} | {'latency':>13} | {'span':>13}"]
    for (m, s), v in sorted(by.items()):
        cols = []
        for k in ("send_us", "recv_us", "latency_us", "span_us"):
            xs = [x[k] for x in v]
            cols.append(f"{st.median(xs):6.0f} {st.mean(xs):6.0f}")
        out.append(f"{m:6} {s:7d} | " + " | ".join(cols))
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--cap-mbit", type=float, default=None)
    p.add_argument("--sizes", default="1024,32768")
    p.add_argument("--calls", type=int, default=8)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--idle-us", type=float, default=8000.0)
    p.add_argument("--compute-us", type=float, default=500.0)
    p.add_argument("--modes", default=",".join(MODES), help="the modes to run (pipe, pipe2 besides MODES)")
    p.add_argument("--big", type=int, default=262144, help="bytes of the gap modes' messages (0: none)")
    p.add_argument("--gaps", default="0,1000,2000,4000", help="compute (µs) before each large message")
    args = p.parse_args()
    if "RANK" in os.environ:
        return rank_main(args)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRO_")} | {"OMP_NUM_THREADS": "1"}
    me = [str(Path(__file__).resolve()), *sys.argv[1:]]
    if args.cap_mbit:
        sys.path.insert(0, str(REPO / "benchmarks" / "fidelity"))
        from netns import NetnsCluster

        with NetnsCluster(args.procs, rate_mbit=args.cap_mbit):
            subprocess.run([sys.executable, str(REPO / "benchmarks" / "oracle" / "netns_launch.py"), str(args.procs),
                            "29517", *me], env=env, check=True)
    else:
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.procs),
                        "--master_addr", "127.0.0.1", "--master_port", "29518", *me], env=env, check=True)
    print(summary(Path(args.out)))


if __name__ == "__main__":
    main()
