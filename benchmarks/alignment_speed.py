"""Clock alignment speed: 128 nodes x 10 steps of a ResNet-50-sized data-parallel job.

The job is synthetic (dpro.alignment.synthetic) but has a real job's event counts: per
node and step, 161 backward ops and the 161 gradient tensors (ResNet-50's parameter
shapes, fp32) synchronised either

* ``--mode coarse`` (default): one coarse ALLREDUCE op per tensor per rank, as gloo/NCCL
  traces record them (128 x 10 x 161 = 206,080 collective events), or
* ``--mode ring``: fine-grained ring SEND/RECV ops, 2(N-1) per tensor per rank; the
  tensors are fused into ``--buckets`` buckets (default 2) to keep the event count
  realistic for a fine-grained trace (128 x 10 x 2 x 254 RECVs = 650,240).

Hosts hold ``--per-host`` nodes (default 8) and every host's clock gets a random offset
(up to +-20 ms).  Timed: alignment from the in-memory gTrace to the offsets (extraction,
dependency reduction, building the sparse CVXPY problem, solving, iterations); the
trace generation is not timed.  The recovery error (max |θ - truth| over nodes, µs) is
printed too.

    python benchmarks/alignment_speed.py
    python benchmarks/alignment_speed.py --json
    python benchmarks/alignment_speed.py --mode ring --nodes 32
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dpro.alignment import AlignOptions, align  # noqa: E402
from dpro.alignment.synthetic import JobSpec, collective_job, ring_job  # noqa: E402


def resnet50_param_bytes() -> list[int]:
    """Bytes (fp32) of ResNet-50's 161 parameter tensors, in forward order."""
    sizes = [64 * 3 * 7 * 7, 64, 64]
    inp = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            sizes += [width * inp, width, width]
            sizes += [width * width * 9, width, width]
            sizes += [4 * width * width, 4 * width, 4 * width]
            if b == 0:
                sizes += [4 * width * inp, 4 * width, 4 * width]
            inp = 4 * width
    sizes += [1000 * 2048, 1000]
    assert len(sizes) == 161
    return [4 * s for s in sizes]


def fuse(sizes: list[int], buckets: int) -> list[int]:
    """Sizes of ``buckets`` roughly equal buckets (in backward order)."""
    total = sum(sizes)
    out, cur = [], 0
    for s in reversed(sizes):
        cur += s
        if cur >= total / buckets and len(out) < buckets - 1:
            out.append(cur)
            cur = 0
    out.append(cur)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--per-host", type=int, default=8)
    p.add_argument("--mode", choices=("coarse", "ring"), default="coarse")
    p.add_argument("--buckets", type=int, default=2, help="ring mode: fused buckets per step")
    p.add_argument("--solver", default="CLARABEL")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args()

    rng = np.random.default_rng(a.seed)
    names = [f"worker{r}" for r in range(a.nodes)]
    hosts = [f"host{r // a.per_host}" for r in range(a.nodes)]
    host_skew = {h: float(rng.uniform(-20_000, 20_000)) for h in sorted(set(hosts))}
    skew = {n: host_skew[h] for n, h in zip(names, hosts)}
    sizes = resnet50_param_bytes()
    if a.mode == "ring":
        sizes = fuse(sizes, a.buckets)
        spec = JobSpec(nodes=a.nodes, hosts=hosts, steps=a.steps, tensor_bytes=sizes, compute_us=30_000.0 / len(sizes),
                       compute_jitter_us=200.0, us_per_mb=100.0, latency_us=15.0, comm_jitter_us=5.0, skew_us=skew, seed=a.seed)
    else:
        spec = JobSpec(nodes=a.nodes, hosts=hosts, steps=a.steps, tensor_bytes=sizes, compute_us=200.0,
                       compute_jitter_us=30.0, us_per_mb=100.0, latency_us=15.0, comm_jitter_us=20.0, skew_us=skew, seed=a.seed)
    t = time.perf_counter()
    gt = ring_job(spec) if a.mode == "ring" else collective_job(spec)
    gen_s = time.perf_counter() - t
    events = sum(len(nt.events) for nt in gt.nodes.values())

    res = align(gt, AlignOptions(solver=a.solver, time_limit_s=120.0))
    truth = {n: -(skew[n] - skew[res.reference]) for n in names}
    err = max(abs(res.offsets_us[n] - truth[n]) for n in names)
    out = {
        "mode": a.mode,
        "nodes": a.nodes,
        "hosts": len(host_skew),
        "steps": a.steps,
        "tensors": len(sizes),
        "events": events,
        "recv_instances": res.recv_instances,
        "collective_instances": res.collective_instances,
        "dependency_pairs": res.dependency_pairs,
        "variables": res.variables,
        "constraints": res.constraints,
        "iterations": res.iterations,
        "solver": res.solver,
        "status": res.status,
        "align_s": round(res.time_s, 3),
        "generate_s": round(gen_s, 3),
        "max_error_us": round(err, 3),
        "notes": res.notes,
    }
    if a.json:
        print(json.dumps(out))
        return
    print(f"{a.nodes} nodes on {len(host_skew)} hosts, {a.steps} steps, {len(sizes)} tensors ({a.mode}): {events:,} events")
    print(f"  problem: {res.variables:,} variables, {res.constraints:,} constraints "
          f"({res.dependency_pairs:,} node pairs with a dependency, {res.recv_instances:,} receive + "
          f"{res.collective_instances:,} collective instances)")
    print(f"  align: {res.time_s:.3f} s ({res.solver}, {res.status}, {res.iterations} iteration(s)); "
          f"max |θ - truth| = {err:.2f} µs")
    for n in res.notes:
        print(f"  note: {n}")


if __name__ == "__main__":
    main()
