"""What one all-reduce really costs under a bandwidth cap, without dpro (issue #28).

Times ``hvd.allreduce`` (Horovod over gloo, as examples/pytorch/hvd_recorder.py runs it)
and ``torch.distributed.all_reduce`` (gloo, as DDP runs it) of fixed float32 tensors at
2, 3 and 4 ranks, each rank in its own network namespace behind a tbf cap on both
directions of its link (benchmarks/fidelity/netns.py; Horovod's ranks are started as
benchmarks/fidelity/hvd_netns.py does). Each call: a barrier, then every rank records the
wall clock (one host: one clock) before and after its all-reduce. The collective's time
is from the last rank entering to the last rank leaving; its median over ``--repeats``
calls is reported per size, as ns per byte of the tensor (``ns/B``) and as ns per byte a
ring moves through each rank's link and direction, ``2(N-1)/N * B`` (``ns/ring-B``:
a ring at the cap's rate gives the same figure at every N, about 16.7 ns at 500 Mbit/s
after TCP/IP headers). Nothing here reads a trace or calls dpro.

    benchmarks/measure.sh .venv/bin/python benchmarks/whatif/hvd_allreduce_probe.py --cap-mbit 500 \\
        [--ranks 2,3,4] [--sizes 40960,1048576,...] [--repeats 5] [--libs hvd,torch] [--json out.json]

Ranks run with benchmarks/jobenv.py's settings of the jobs they stand for (Horovod:
``threads1pin``; torch: ``threads1``). Root (namespaces, tc).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve()
#: the MLP's gradients as Horovod fuses them (hvd_recorder.py --model mlp: 6.*, 4.*, 2.*+0.*)
#: between 1 and 16 MiB
DEFAULT_SIZES = "40960,1048576,4194304,8392704,16777216,25182208"


# -- the ranks ----------------------------------------------------------------------------
def rank_main(lib: str, sizes: list[int], repeats: int, warmup: int, out: Path) -> None:
    import torch

    torch.set_num_threads(1)
    if lib == "hvd":
        import horovod.torch as hvd

        hvd.init()
        rank, world = hvd.rank(), hvd.size()
        barrier = hvd.barrier

        def allreduce(t: torch.Tensor) -> None:
            hvd.allreduce(t, name="probe")  # Average, as DistributedOptimizer
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        barrier = dist.barrier

        def allreduce(t: torch.Tensor) -> None:
            dist.all_reduce(t)
    rows = []
    for nbytes in sizes:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        for i in range(warmup + repeats):
            barrier()
            t0 = time.time()
            allreduce(t)
            t1 = time.time()
            if i >= warmup:
                rows.append({"bytes": nbytes, "call": i - warmup, "start_s": t0, "end_s": t1})
    out.with_name(out.name.format(rank=rank)).write_text(json.dumps({"rank": rank, "world": world, "rows": rows}))
    if lib == "hvd":
        hvd.shutdown()
    else:
        dist.destroy_process_group()


# -- the launcher --------------------------------------------------------------------------
def _fid():
    sys.path.insert(0, str(ROOT / "benchmarks" / "fidelity"))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import jobenv
    import netns

    return netns, jobenv


def run(lib: str, n: int, cap_mbit: float | None, sizes: list[int], repeats: int, warmup: int,
        tmp: Path, port: int, timeout_s: float) -> list[dict]:
    """One job of ``n`` ranks; per size: the median collective time (µs) and the calls'."""
    netns, jobenv = _fid()
    s = jobenv.default_for("hvd" if lib == "hvd" else "ddp")
    outp = tmp / f"{lib}{n}_{{rank}}.json"
    rank_cmd = [sys.executable, *s.script(HERE), "--rank", lib, "--sizes", ",".join(map(str, sizes)),
                "--repeats", str(repeats), "--warmup", str(warmup), "--rank-out", str(outp)]
    env = {**os.environ, **s.env(), "PYTHONPATH": str(ROOT)}
    with netns.NetnsCluster(n, rate_mbit=cap_mbit) as net:
        if lib == "hvd":
            cmd = [sys.executable, str(ROOT / "benchmarks" / "fidelity" / "hvd_netns.py"), "--np", str(n),
                   "--existing", "--timeout", str(timeout_s), "--", *rank_cmd]
            procs = [subprocess.Popen(cmd, env=env, start_new_session=True)]
        else:
            procs = [subprocess.Popen(net.exec_prefix(r) + ["env", *net.env_assignments(r, port), *rank_cmd],
                                      env=env, start_new_session=True) for r in range(n)]
        deadline = time.monotonic() + timeout_s
        try:
            while any(p.poll() is None for p in procs):
                if any(p.returncode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                    raise RuntimeError(f"{lib} {n} ranks failed: {[p.returncode for p in procs]}")
                time.sleep(0.1)
            if any(p.returncode for p in procs):
                raise RuntimeError(f"{lib} {n} ranks failed: {[p.returncode for p in procs]}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    per_rank = [json.loads(Path(str(outp).format(rank=r)).read_text())["rows"] for r in range(n)]
    out = []
    for nbytes in sizes:
        calls = []
        for rows in zip(*[[x for x in pr if x["bytes"] == nbytes] for pr in per_rank]):
            last_in = max(x["start_s"] for x in rows)
            calls.append({"span_us": 1e6 * (max(x["end_s"] for x in rows) - last_in),
                          "first_in_us": 1e6 * (last_in - min(x["start_s"] for x in rows)),
                          "rank_us": [1e6 * (x["end_s"] - x["start_s"]) for x in rows]})
        med = statistics.median(c["span_us"] for c in calls)
        ring_bytes = 2 * (n - 1) / n * nbytes
        out.append({"lib": lib, "ranks": n, "bytes": nbytes, "median_us": med,
                    "min_us": min(c["span_us"] for c in calls), "max_us": max(c["span_us"] for c in calls),
                    "ns_per_byte": 1e3 * med / nbytes, "ns_per_ring_byte": 1e3 * med / ring_bytes,
                    "calls": calls})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cap-mbit", type=float, default=500.0, help="tbf cap per direction of every link (0: none)")
    ap.add_argument("--ranks", default="2,3,4")
    ap.add_argument("--libs", default="hvd,torch", help="hvd (Horovod gloo), torch (torch.distributed gloo)")
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help="bytes (float32 tensors)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--port", type=int, default=29650)
    ap.add_argument("--timeout", type=float, default=300.0, help="per job, s")
    ap.add_argument("--json", type=Path, default=None, help="write every call here")
    ap.add_argument("--rank", choices=["hvd", "torch"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rank-out", type=Path, default=None, help=argparse.SUPPRESS)
    o = ap.parse_args()
    sizes = [int(x) for x in o.sizes.split(",") if x.strip()]
    if o.rank:
        rank_main(o.rank, sizes, o.repeats, o.warmup, o.rank_out)
        return
    sys.path.insert(0, str(HERE.parent))
    from boost import boosted

    cap = o.cap_mbit or None
    res = []
    with tempfile.TemporaryDirectory(prefix="dpro-probe-") as tmp, boosted() as on:
        print(f"# jobs boosted: {'yes' if on else 'no'}; cap {cap or 'none'} Mbit/s; "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
        print(f"{'lib':6} {'N':>2} {'bytes':>10} {'median ms':>10} {'min ms':>8} {'max ms':>8} "
              f"{'ns/B':>7} {'ns/ring-B':>9} {'late ms':>8}", flush=True)
        for n in [int(x) for x in o.ranks.split(",")]:
            for lib in o.libs.split(","):
                o.port += 1
                for r in run(lib, n, cap, sizes, o.repeats, o.warmup, Path(tmp), o.port, o.timeout):
                    late = statistics.median(c["first_in_us"] for c in r["calls"])
                    print(f"{lib:6} {n:2d} {r['bytes']:10d} {r['median_us'] / 1e3:10.2f} {r['min_us'] / 1e3:8.2f} "
                          f"{r['max_us'] / 1e3:8.2f} {r['ns_per_byte']:7.2f} {r['ns_per_ring_byte']:9.2f} "
                          f"{late / 1e3:8.2f}", flush=True)
                    res.append(r)
    if o.json:
        o.json.write_text(json.dumps({"cap_mbit": cap, "results": res}, indent=1))


if __name__ == "__main__":
    main()
