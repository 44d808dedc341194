"""How fast `dpro optimize` searches the key split of a ResNet-50-sized parameter-server job.

The job is benchmarks/search_speed.py's synthetic ResNet-50 (161 gradient tensors, 102 MB,
353 computation ops; seeded) turned into an MXNet ``dist_sync`` job: one key per
tensor in gradient-ready order, MXNet's placement rule, S servers, N workers, alpha 500 µs
per message and 1 GB/s ports (the order of this VM's capped runs), server updates
``300 µs + 0.4 ns/B``. The search replays every distinct bound at flow level
(dpro/replayer/port_sharing.py); this prints its time and one replay's.

    python benchmarks/optimize/ps_search_speed.py [--workers 16] [--servers 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from search_speed import resnet50_job  # noqa: E402

from dpro.graph.comm_model import LinkCost  # noqa: E402
from dpro.optimizer.ps import bound_search  # noqa: E402
from dpro.optimizer.evaluate import iteration_us  # noqa: E402
from dpro.optimizer.libraries import MXNET_DEFAULT_BOUND  # noqa: E402
from dpro.optimizer.ps.layout import PsLayout, mxnet_home  # noqa: E402


def ps_job(workers: int, servers: int):
    m = resnet50_job(workers)
    keys = list(range(len(m.units)))
    elements = [u.bytes // 4 for u in m.units]
    lay = PsLayout(servers, keys, elements, [mxnet_home(k, servers) for k in keys], MXNET_DEFAULT_BOUND,
                   update_alpha=300.0, update_beta=0.0004)
    return replace(m, scheme="ps", library="ps-lite", framework="mxnet", servers=servers, ps=lay,
                   link=LinkCost(500.0, 1e-3), baseline_partitions=list(lay.partitions(MXNET_DEFAULT_BOUND)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--servers", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    m = ps_job(a.workers, a.servers)
    default = bound_search.with_bound(m, MXNET_DEFAULT_BOUND)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        t_default = iteration_us(m, default)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    res = bound_search.search_bounds(m)[0]
    dt = time.perf_counter() - t0
    out = {"workers": a.workers, "servers": a.servers, "keys": len(m.units), "ops": len(m.ops),
           "replay_s": statistics.median(times), "search_s": dt, "evaluations": res.evaluations,
           "default_us": t_default, "best_us": res.iteration_us, "bound": bound_search.bound_of(m, res.strategy)}
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"ResNet-50-sized PS job: {out['keys']} keys, {out['ops']} ops, {a.workers} workers, {a.servers} servers")
    print(f"one replay (MXNet's default bound): {out['replay_s'] * 1e3:.1f} ms (median of 5), {t_default / 1e3:.1f} ms "
          f"iteration")
    print(f"search: {dt:.2f} s, {res.evaluations} replays; bound {out['bound']}: {res.iteration_us / 1e3:.1f} ms "
          f"({t_default / res.iteration_us:.3f}x the default)")


if __name__ == "__main__":
    main()
