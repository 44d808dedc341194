"""How fast `dpro optimize` searches a ResNet-50-sized, 16-worker job, with and without its speed-ups.

The job is synthetic but shaped like ResNet-50 data parallelism: the 161 parameter tensors
of ResNet-50 with their real sizes (25.6 M parameters, 102 MB of fp32 gradients), one
forward and one backward op per conv / batch-norm / ReLU / residual add / fc (about 470
computation ops), durations proportional to each layer's FLOPs (about 60 ms forward,
120 ms backward per iteration), each gradient ready at its layer's backward op and
consumed by one optimizer op; ring AllReduce over 16 workers, alpha 30 µs per ring step,
10 GB/s links. Seeded, so every run searches the same job.

Speed-ups measured: the coarsened view (search with and without it), symmetry (one worker
replayed instead of 16: the per-replay cost of the full 16-worker graph, whose iteration
time is the same, times the replays the search made). Partial replay (a group's sync time
from its communication subgraph alone) is always on.

    python benchmarks/search_speed.py [--workers 16] [--budget 120] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from dpro.graph.comm_model import LinkCost
from dpro.graph.compiled import CompiledGraph, compile_graph
from dpro.optimizer.evaluate import iteration_us
from dpro.optimizer.job_model import CompOp, JobModel, Unit
from dpro.optimizer.optimize import baselines
from dpro.optimizer.search import search
from dpro.optimizer.strategy import Strategy
from dpro.optimizer.worker_graph import KIND_XFER, build
from dpro.optimizer.passes.registry import builtin_passes
from dpro.replayer.engine import simulate


def build_all_workers(model: JobModel, strategy: Strategy) -> CompiledGraph:
    """The same strategy with every worker in the graph (no symmetry): N copies of the
    worker, and each ring step on rank r also waiting for the previous rank's step (the
    chunk it receives), as the replayer's global DFG does. With identical workers it
    replays to the same iteration time as :func:`dpro.optimizer.worker_graph.build`
    (tests/test_optimizer.py); it measures what the symmetry saves."""
    built = build(model, strategy)
    one, is_x = built.graph, built.kind == KIND_XFER
    n, world = one.n, max(1, model.world_size)
    src, dst = one.edges()
    names, dur, cat, dev, prio = [], [], [], [], []
    devices: list[str] = [f"w{r}/{d}" for r in range(world) for d in one.devices]
    nd = len(one.devices)
    for r in range(world):
        names += [f"w{r}/{x}" for x in one.names]
        dur.append(one.dur)
        cat.append(one.cat)
        dev.append(one.device + r * nd)
        prio.append(one.prio)
    s_all, d_all = [], []
    cross = is_x[dst] | (is_x[src] & ~is_x[dst])  # into a ring step, or from the last step into OUT
    for r in range(world):
        s_all.append(src + r * n)
        d_all.append(dst + r * n)
        prev = (r - 1) % world
        s_all.append(src[cross] + prev * n)
        d_all.append(dst[cross] + r * n)
    return compile_graph(names=names, dur=np.concatenate(dur), cat=np.concatenate(cat), device=np.concatenate(dev),
                         prio=np.concatenate(prio), src=np.concatenate(s_all), dst=np.concatenate(d_all),
                         devices=devices, device_owner=np.repeat(np.arange(world), nd),
                         owners=[f"w{r}" for r in range(world)], device_is_comm=np.tile(one.device_is_comm, world))


def resnet50_layers() -> list[tuple[str, str, int, float]]:
    """(layer, kind, parameter elements, relative FLOPs) in forward order."""
    out: list[tuple[str, str, int, float]] = []

    def conv(name: str, cin: int, cout: int, k: int, hw: int) -> None:
        out.append((name, "conv", cin * cout * k * k, cin * cout * k * k * hw * hw))
        out.append((name + ".bn", "bn", 2 * cout, 4 * cout * hw * hw))

    conv("conv1", 3, 64, 7, 112)
    cin, hw = 64, 56
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        for b in range(blocks):
            name = f"layer{stage + 1}.{b}"
            if b == 0 and stage > 0:
                hw //= 2
            conv(name + ".conv1", cin, width, 1, hw)
            conv(name + ".conv2", width, width, 3, hw)
            conv(name + ".conv3", width, 4 * width, 1, hw)
            if b == 0:
                conv(name + ".downsample", cin, 4 * width, 1, hw)
            out.append((name + ".add", "add", 0, 4 * width * hw * hw))
            cin = 4 * width
    out.append(("fc", "fc", 2048 * 1000 + 1000, 2 * 2048 * 1000))
    return out


def resnet50_job(workers: int, seed: int = 0) -> JobModel:
    rng = np.random.default_rng(seed)
    layers = resnet50_layers()
    flops = np.array([f for _, _, _, f in layers], dtype=float)
    fw_us = 60_000.0 * flops / flops.sum()
    ops: dict[str, CompOp] = {}
    order: list[str] = []
    for (name, kind, _, _), t in zip(layers, fw_us):
        for suffix, d in ((kind, t), ("relu", 0.1 * t) if kind == "bn" else (None, 0)):
            if suffix is None:
                continue
            i = f"fw:{name}:{suffix}"
            ops[i] = CompOp(i, suffix, "FW", "gpu", float(d), float(rng.uniform(5, 15)), len(order), name)
            order.append(i)
    bw_of: dict[str, str] = {}
    for name, kind, _, _ in reversed(layers):
        fw = [o for o in order if o.startswith(f"fw:{name}:")]
        for f in reversed(fw):
            i = "bw" + f[2:]
            ops[i] = CompOp(i, ops[f].name + "_backward", "BW", "gpu", 2 * ops[f].dur, float(rng.uniform(5, 15)),
                            len(order), name)
            order.append(i)
            bw_of.setdefault(name, i)
    ops["update"] = CompOp("update", "optimizer", "UPDATE", "gpu", 3000.0, 10.0, len(order))
    order.append("update")
    units = []
    for name, kind, elems, _ in reversed(layers):  # gradient-ready order
        if elems == 0:
            continue
        if kind == "bn":
            for p in ("weight", "bias"):
                units.append(Unit(f"{name}.{p}", 4 * elems // 2, [bw_of[name]], ["update"], [f"{name}.{p}"]))
        elif kind == "fc":
            units.append(Unit("fc.weight", 4 * 2048 * 1000, [bw_of[name]], ["update"], ["fc.weight"]))
            units.append(Unit("fc.bias", 4 * 1000, [bw_of[name]], ["update"], ["fc.bias"]))
        else:
            units.append(Unit(f"{name}.weight", 4 * elems, [bw_of[name]], ["update"], [f"{name}.weight"]))
    return JobModel(ops=ops, edges=list(zip(order, order[1:])), units=units,
                    baseline_groups=[[i] for i in range(len(units))], world_size=workers, scheme="allreduce",
                    library="nccl", framework="pytorch", link=LinkCost(30.0, 1e-4), launch_us=20.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--budget", type=float, default=120.0, help="search budget per configuration, s")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    m = resnet50_job(a.workers)
    params = sum(u.bytes for u in m.units) // 4
    base = Strategy.from_groups(m.baseline_groups)
    one, full = build(m, base), build_all_workers(m, base)
    t_one = t_full = 0.0
    for _ in range(5):
        t0 = time.perf_counter(); mk1 = simulate(one.graph).makespan; t_one += time.perf_counter() - t0
        t0 = time.perf_counter(); mk16 = simulate(full).makespan; t_full += time.perf_counter() - t0
    t_coarse = build(m, base, coarsen=True).graph.n
    rows = {}
    for label, coarsen in (("default (symmetry, partial replay)", False), ("+ coarsened view", True)):
        t0 = time.perf_counter()
        # as `dpro optimize` runs it: from the job's grouping, no fusion and every baseline
        res = search(m, builtin_passes(), budget_s=a.budget, coarsen=coarsen, extra_starts=baselines(m))
        dt = time.perf_counter() - t0
        rows[label] = {"time_s": dt, "evaluations": sum(r.evaluations for r in res), "converged": res[0].converged,
                       "before_us": iteration_us(m, base),
                       "best_us": res[0].iteration_us, "groups": len(res[0].strategy.groups)}
    ev = rows["default (symmetry, partial replay)"]["evaluations"]
    per_one, per_full = t_one / 5, t_full / 5
    rows["without symmetry (estimated)"] = {"time_s": rows["default (symmetry, partial replay)"]["time_s"] + ev * (per_full - per_one),
                                            "evaluations": ev}
    out = {"workers": a.workers, "parameters": params, "units": len(m.units), "ops": len(m.ops),
           "graph_nodes_one_worker": one.graph.n, "graph_nodes_coarsened": t_coarse, "graph_nodes_all_workers": full.n,
           "replay_s_one_worker": per_one, "replay_s_all_workers": per_full, "same_iteration": abs(mk1 - mk16) < 1e-6,
           "rows": rows}
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"ResNet-50-sized job: {params / 1e6:.1f} M parameters in {len(m.units)} tensors, {len(m.ops)} ops, "
          f"{a.workers} workers")
    print(f"graph: {one.graph.n} nodes (one worker), {t_coarse} coarsened, {full.n} with all {a.workers} workers "
          f"(same iteration time: {out['same_iteration']})")
    print(f"one replay: {per_one * 1e3:.1f} ms one worker, {per_full * 1e3:.1f} ms all workers")
    for label, r in rows.items():
        extra = "" if "best_us" not in r else (f", {r['best_us'] / 1e3:.2f} ms best, {r['groups']} groups, "
                                               f"{'converged' if r['converged'] else 'budget spent'}")
        print(f"{label:<30} {r['time_s']:7.1f} s, {r['evaluations']} replays{extra}")


if __name__ == "__main__":
    main()
