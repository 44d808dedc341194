"""Replay speed on a >= 1M-op global DFG: 64 workers of a ResNet-50-sized graph, ring AllReduce.

Each worker has 160 FW ops, 320 BW ops (data-grad and weight-grad per layer) and 160 UPDATE
ops on its compute stream, and a communication queue holding a virtual IN and OUT op per
collective.  The 161 gradient tensors (real ResNet-50 parameter shapes, fp32) are either
all-reduced one by one (``--buckets 0``, Horovod-style) or fused greedily, in backward
order, into buckets of total/``--buckets`` bytes (DDP-style; ``--buckets 25`` gives 19, the
largest tensors filling a bucket alone).  Links cost alpha + beta * bytes per ring step with
alpha = 8 µs, beta = 1e-4 µs/B (10 GB/s); backward is ~50 ms.  Every collective is expanded the way :mod:`dpro.graph.global_dfg` does: a ring
of 2(N-1) SEND steps on the N directed links ``link:r->r+1``.  With 64 workers and one
collective per tensor this is 161 * 126 * 64 ring ops + 64 * 962 local ops ~= 1.36M ops and
~2.7M edges.  The graph is built directly with :class:`GraphBuilder` (no gTrace, no JSON).

Timed: :func:`dpro.replayer.engine.simulate` only (median of ``--repeat`` runs, one core;
also the CPU time and the best run, for machines shared with other work). ``--engine``
picks the engine (default: the compiled core when built); ``--compare python`` also times
the Python engine on the same graph in the same run and prints the ratio.
Memory: ``ru_maxrss`` is the whole process's peak resident set (build included);
``simulate_tracemalloc_peak`` is the peak of Python allocations traced during one extra,
untimed ``simulate`` run (tracemalloc slows it; skip with ``--no-tracemalloc``).

    python benchmarks/replay_speed.py                       # 64 workers, per-tensor
    python benchmarks/replay_speed.py --buckets 25          # tensor fusion
    python benchmarks/replay_speed.py --workers 8 --repeat 5 --json
    python benchmarks/replay_speed.py --engine reference    # the unoptimised reference
    python benchmarks/replay_speed.py --check               # and require identical schedules
    python benchmarks/replay_speed.py --compare python      # compiled core vs Python engine
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import sys
import time
import tracemalloc

import numpy as np

from dpro.graph.comm_model import LinkCost, ring_steps
from dpro.graph.builder import GraphBuilder
from dpro.replayer import engine


def resnet50_param_sizes() -> list[int]:
    """Element counts of ResNet-50's 161 parameter tensors, in forward order."""
    sizes = [64 * 3 * 7 * 7, 64, 64]  # conv1, bn1 (weight, bias)
    inp = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            sizes += [width * inp, width, width]  # 1x1 conv, bn
            sizes += [width * width * 9, width, width]  # 3x3 conv, bn
            sizes += [4 * width * width, 4 * width, 4 * width]  # 1x1 conv, bn
            if b == 0:
                sizes += [4 * width * inp, 4 * width, 4 * width]  # downsample conv, bn
            inp = 4 * width
    sizes += [1000 * 2048, 1000]  # fc
    assert len(sizes) == 161
    return sizes


def build(workers: int, buckets: int = 0, seed: int = 0, alpha: float = 8.0, beta: float = 1e-4):
    """The global DFG and its number of collectives; ``buckets`` = 0: one per tensor."""
    rng = np.random.default_rng(seed)
    nbytes = [4 * s for s in resnet50_param_sizes()]  # fp32
    n_layers = 160
    owner = list(range(160)) + [159]  # tensor -> layer (fc owns weight and bias)
    layer_tensors: list[list[int]] = [[] for _ in range(n_layers)]
    for t, l in enumerate(owner):
        layer_tensors[l].append(t)
    # Per-layer forward time (µs): a fixed cost plus a term growing with the layer's weights,
    # scaled to ~25 ms of forward per iteration (ResNet-50, batch 32, one V100-class GPU).
    wt = np.sqrt(np.array([sum(nbytes[t] for t in layer_tensors[l]) for l in range(n_layers)], dtype=float))
    base = 30.0 + (25_000.0 - 30.0 * n_layers) * wt / wt.sum()
    # Collectives: lists of tensors, in the order backward produces them (last layer first).
    bw_order = sorted(range(len(nbytes)), key=lambda t: (-owner[t], -t))
    if buckets <= 0:
        colls = [[t] for t in bw_order]
    else:
        cap = sum(nbytes) / buckets
        colls, cur, size = [], [], 0
        for t in bw_order:
            cur.append(t)
            size += nbytes[t]
            if size >= cap:
                colls.append(cur)
                cur, size = [], 0
        if cur:
            colls.append(cur)
    coll_of = {t: c for c, ts in enumerate(colls) for t in ts}
    cost = LinkCost(alpha, beta)

    b = GraphBuilder()
    coll_in: list[list[int]] = [[0] * workers for _ in colls]
    coll_out: list[list[int]] = [[0] * workers for _ in colls]
    coll_prio = [0.0] * len(colls)
    for w in range(workers):
        node = f"worker{w}"
        comp = b.add_device(f"{node}/cuda:0", owner=node, is_comm=False)
        comm = b.add_device(f"{node}/comm", owner=node, is_comm=True)
        jitter = rng.lognormal(0.0, 0.1, size=3 * n_layers)  # per-op noise, ~10%
        t = 0.0
        prev = -1
        for l in range(n_layers):
            d = float(base[l] * jitter[l])
            i = b.add_op(f"{node}/fw{l}", dur=d, gap=0.0 if l else 20.0, cat="FW", device=comp, prio=t)
            t += d
            if prev >= 0:
                b.add_edge(prev, i)
            prev = i
        bw_w = [0] * n_layers
        bw_end = [0.0] * n_layers  # offset at which layer l's weight gradient is ready
        for l in reversed(range(n_layers)):
            d_in = float(base[l] * jitter[n_layers + l])
            d_w = float(base[l] * jitter[2 * n_layers + l])
            i_in = b.add_op(f"{node}/bw{l}.in", dur=d_in, gap=0.0, cat="BW", device=comp, prio=t)
            b.add_edge(prev, i_in)
            t += d_in
            i_w = b.add_op(f"{node}/bw{l}.w", dur=d_w, gap=0.0, cat="BW", device=comp, prio=t)
            b.add_edge(i_in, i_w)
            t += d_w
            bw_w[l], bw_end[l] = i_w, t
            prev = i_in
        for c, ts in enumerate(colls):
            # prio = the op's start offset in the step: a collective is issued when its
            # last gradient is ready, the ring steps of all ranks get the latest issue
            issue = max(bw_end[owner[x]] for x in ts)
            i_in = b.add_op(f"{node}/ar{c}:IN", dur=0.0, gap=5.0, cat="COMM", device=comm, prio=issue)
            i_out = b.add_op(f"{node}/ar{c}:OUT", dur=0.0, gap=0.0, cat="COMM", device=comm, prio=issue + 5.0)
            for x in ts:
                b.add_edge(bw_w[owner[x]], i_in)
            coll_in[c][w], coll_out[c][w] = i_in, i_out
            coll_prio[c] = max(coll_prio[c], issue)
        for l in range(n_layers):
            d = float(0.2 * base[l])
            i = b.add_op(f"{node}/upd{l}", dur=d, gap=0.0, cat="UPDATE", device=comp, prio=t)
            t += d
            for x in layer_tensors[l]:
                b.add_edge(coll_out[coll_of[x]][w], i)
    # Ring AllReduce expansion, exactly as dpro.graph.global_dfg does it.
    n = workers
    for c, ts in enumerate(colls):
        step_dur = cost.step_us(sum(nbytes[x] for x in ts) / n)
        prev_s: list[int] = []
        for s in range(ring_steps(n)):
            cur = []
            for r in range(n):
                nxt = (r + 1) % n
                d = b.add_device(f"link:{r}->{nxt}", owner=f"worker{r}", is_comm=True)
                i = b.add_op(f"ar{c}/ring{s}/{r}->{nxt}", dur=step_dur, gap=0.0, cat="COMM", device=d, prio=coll_prio[c])
                if s == 0:
                    b.add_edge(coll_in[c][r], i)
                    b.add_edge(coll_in[c][nxt], i)
                else:
                    b.add_edge(prev_s[r - 1], i)
                    b.add_edge(prev_s[r], i)
                cur.append(i)
            prev_s = cur
        for r in range(n):
            b.add_edge(prev_s[r - 1], coll_out[c][r])
            b.add_edge(prev_s[r], coll_out[c][r])
    return b.compile({"link_cost": cost}), len(colls)


ENGINES = {
    "auto": engine.simulate,
    "compiled": engine.simulate_compiled,
    "python": engine.simulate_python,
    "reference": engine._simulate_reference,
}


def timed(simulate, g, repeat: int):
    """Wall and CPU seconds of ``repeat`` runs, and the last schedule."""
    times, cpu = [], []
    sched = None
    for _ in range(repeat):
        sched = None
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        sched = simulate(g)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return times, cpu, sched


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--buckets", type=int, default=0, help="fuse tensors into ~this many buckets (0: per tensor)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine", choices=tuple(ENGINES), default="auto",
                    help="auto: simulate (the compiled core when built); compiled, python; reference: the plain "
                         "reference implementation every engine must match")
    ap.add_argument("--compare", choices=tuple(ENGINES), help="also time this engine in the same run: the ratio")
    ap.add_argument("--check", action="store_true", help="also run the reference once and require identical results")
    ap.add_argument("--no-tracemalloc", action="store_true")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    a = ap.parse_args(argv)

    t0 = time.perf_counter()
    g, ncoll = build(a.workers, a.buckets, a.seed)
    build_s = time.perf_counter() - t0
    edges = int(len(g.succ_idx))

    simulate = ENGINES[a.engine]
    times, cpu, sched = timed(simulate, g, a.repeat)
    replay_s = statistics.median(times)
    replay_cpu_s = statistics.median(cpu)
    makespan = sched.makespan
    cmp = None
    if a.compare:
        ctimes, ccpu, csched = timed(ENGINES[a.compare], g, a.repeat)
        same = bool(np.array_equal(sched.start, csched.start) and np.array_equal(sched.binder, csched.binder))
        del csched
        cmp = {"engine": a.compare, "replay_s": round(statistics.median(ctimes), 3),
               "replay_runs_s": [round(x, 3) for x in ctimes], "replay_cpu_s": round(statistics.median(ccpu), 3),
               "ops_per_s": round(g.n / statistics.median(ctimes)),
               "speedup": round(statistics.median(ctimes) / replay_s, 2),
               "speedup_cpu": round(statistics.median(ccpu) / replay_cpu_s, 2), "identical": same}
    identical = None
    if a.check:
        other = (engine._simulate_reference if a.engine != "reference" else engine.simulate)(g)
        identical = bool(np.array_equal(sched.start, other.start) and np.array_equal(sched.end, other.end)
                         and np.array_equal(sched.binder, other.binder))
        del other
    del sched

    tm_peak = None
    if not a.no_tracemalloc:
        gc.collect()
        tracemalloc.start()
        simulate(g)
        tm_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)

    out = {
        "workers": a.workers,
        "collectives": ncoll,
        "ops": g.n,
        "edges": edges,
        "devices": len(g.devices),
        "build_s": round(build_s, 3),
        "replay_s": round(replay_s, 3),
        "replay_runs_s": [round(x, 3) for x in times],
        "replay_cpu_s": round(replay_cpu_s, 3),
        "engine": a.engine if a.engine != "auto" else engine.engine_choice(),
        "compare": cmp,
        "ops_per_s": round(g.n / replay_s),
        "ops_per_s_best_run": round(g.n / min(times)),
        "ops_per_cpu_s": round(g.n / replay_cpu_s),
        "edges_per_s": round(edges / replay_s),
        "predicted_iteration_us": round(makespan, 3),
        "identical_to_other_engine": identical,
        "simulate_tracemalloc_peak_mib": None if tm_peak is None else round(tm_peak / 2**20, 1),
        "process_max_rss_mib": round(rss / 2**20, 1),
        "python": sys.version.split()[0],
    }
    if a.json:
        print(json.dumps(out))
    else:
        print(f"graph: {out['ops']:,} ops, {out['edges']:,} edges, {out['devices']} devices "
              f"({a.workers} workers, {ncoll} collectives)  build {build_s:.2f} s")
        print(f"replay ({out['engine']}): median {replay_s:.3f} s of {a.repeat} ({', '.join(f'{x:.3f}' for x in times)}), "
              f"CPU {replay_cpu_s:.3f} s  -> {out['ops_per_s']:,.0f} ops/s (best run {out['ops_per_s_best_run']:,.0f}, "
              f"{out['ops_per_cpu_s']:,.0f} per CPU s), "
              f"{out['edges_per_s']:,.0f} edges/s")
        if cmp:
            print(f"replay ({a.compare}, same run): median {cmp['replay_s']:.3f} s "
                  f"({', '.join(f'{x:.3f}' for x in cmp['replay_runs_s'])}), CPU {cmp['replay_cpu_s']:.3f} s -> "
                  f"{cmp['ops_per_s']:,.0f} ops/s; {out['engine']} is {cmp['speedup']}x faster "
                  f"({cmp['speedup_cpu']}x in CPU time), schedules {'identical' if cmp['identical'] else 'DIFFER'}")
        print(f"predicted iteration: {makespan / 1e3:.2f} ms"
              + ("" if identical is None else f"; {out['engine']} and reference engines {'agree bit for bit' if identical else 'DIFFER'}"))
        if tm_peak is not None:
            print(f"memory: simulate peak (tracemalloc, separate untimed run) {out['simulate_tracemalloc_peak_mib']} MiB; "
                  f"process max RSS (ru_maxrss, build included) {out['process_max_rss_mib']} MiB")
        else:
            print(f"memory: process max RSS (ru_maxrss, build included) {out['process_max_rss_mib']} MiB")
    return out


if __name__ == "__main__":
    main()
