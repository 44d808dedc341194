"""Diagnosis of dpro's asynchronous PS simulation (issue #28): what the server port carries.

For a dist_async profile and a cluster, runs ``dpro whatif --async``'s simulation twice: with
one message per server (a worker pushes all its bytes, the server updates, it pulls them all:
the model before session 27) and pipelined (its messages one at a time in its profiled order,
each pulled once updated). For each: the simulated mean step (before the port and CPU
bounds), how much of the time each direction of the busiest port carries bytes, how the
workers' flows overlap, and the step again with the compute samples spread by +-X %
(several seeds): how much the workers' phases, which the samples set, decide the result.
No job is run: the profile and the platform file only.

    .venv/bin/python benchmarks/whatif/async_trace.py PROFILE --platform PLATFORM.json --workers 2 --servers 1 \
        [--host-cores 2 --pinned]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's dpro


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", type=Path)
    ap.add_argument("--platform", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--spread", default="0.05,0.2,0.5", help="compute sample spreads to try (fractions)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--host-cores", type=int, default=None)
    ap.add_argument("--pinned", action="store_true")
    o = ap.parse_args()

    import dpro
    from dpro.whatif import scaleout
    from dpro.whatif.async_sim import simulate_async
    from dpro.whatif.platform import load_platform

    job = dpro.open(o.profile)
    plat = load_platform(o.platform)
    cluster = scaleout.Cluster(o.workers, servers=o.servers, asynchronous=True, host_cores=o.host_cores,
                               pinned=o.pinned)
    for pipelined in (False, True):
        calls: list[dict] = []

        def spy(*a, _p=pipelined, **kw):
            if not _p:
                kw.pop("messages", None)
            if a[0] > 1:
                calls.append({"args": a, "kw": dict(kw)})
            return simulate_async(*a, **kw)

        scaleout.simulate_async = spy
        try:
            res = scaleout.predict(job, [cluster], plat)
        finally:
            scaleout.simulate_async = simulate_async
        call = calls[-1]
        a, kw = call["args"], call["kw"]
        b = a[4].beta
        busy = {0: 0.0, 1: 0.0}
        kinds: dict[str, float] = {}
        total = [0.0]

        def observe(rates, dt, busy=busy, kinds=kinds, total=total, b=b):
            srv = max(range(len(a[2])), key=lambda s: a[2][s])  # the busiest port
            for d in (0, 1):
                busy[d] += dt * min(1.0, b * sum(r for f, r in rates.items() if f[0] == srv and f[1] == d))
            on = sorted({(f[2], f[1]) for f in rates})
            push = len({w for w, d in on if d == 0})
            pull = len({w for w, d in on if d == 1})
            key = f"{push} pushing, {pull} pulling"
            kinds[key] = kinds.get(key, 0.0) + dt
            total[0] += dt

        thr = simulate_async(*a, **{**kw, "observe": observe})
        bd = res.points[0].breakdown_us
        print(f"{'pipelined' if pipelined else 'one message per server'}: bytes x {bd.get('async_bytes_scale', 0):.3f}"
              f" (lone worker as profiled), simulated step {a[0] * 1e6 / thr / 1e3:.1f} ms, prediction "
              f"{res.points[0].iteration_us / 1e3:.1f} ms (port bound {bd['port_bound'] / 1e3:.1f} ms)")
        print(f"  busiest port busy: in {100 * busy[0] / total[0]:.0f} %, out {100 * busy[1] / total[0]:.0f} % of the time")
        for k, v in sorted(kinds.items(), key=lambda x: -x[1])[:6]:
            print(f"  workers {k:24} {100 * v / total[0]:5.1f} % of the time")
        mean = statistics.mean(a[1])
        for sp in [float(x) for x in o.spread.split(",") if x]:
            steps = []
            for seed in range(o.seeds):
                rng = random.Random(100 + seed)
                comp = [mean * (1 + rng.uniform(-sp, sp)) for _ in range(50)]
                t = simulate_async(a[0], comp, *a[2:8], seed, **kw)
                steps.append(a[0] * 1e6 / t / 1e3)
            print(f"  compute samples +-{100 * sp:.0f} %: simulated step {', '.join(f'{s:.1f}' for s in steps)} ms "
                  f"(seeds 0-{o.seeds - 1})")


if __name__ == "__main__":
    main()
