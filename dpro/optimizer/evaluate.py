"""Model + strategy -> replayed iteration time (the graph: :mod:`dpro.optimizer.worker_graph`).

* :func:`iteration_us`: the predicted iteration time of a strategy;
* :func:`sync_time`: partial replay, a group's communication subgraph alone;
* :func:`analyse`: the replayed schedule with its critical path and every node's slack.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpro.optimizer.job_model import JobModel, Unit
from dpro.optimizer.strategy import Strategy
from dpro.optimizer.worker_graph import KIND_COMP, KIND_XFER, BuiltGraph, build
from dpro.replayer.cpu_contention import simulate_contended
from dpro.replayer.critical_path import critical_path_indices
from dpro.replayer.engine import Schedule, simulate
from dpro.replayer.port_sharing import simulate_port_sharing


def schedule_of(model: JobModel, built: BuiltGraph) -> Schedule:
    """Replay ``built``; in a CPU-only job whose collectives take CPU from its computation
    (``model.cpu``), with host ops and transfers slowed while they overlap
    (:mod:`dpro.replayer.cpu_contention`)."""
    g = built.graph
    if built.flows:
        return simulate_port_sharing(g, built.flows, model.link.alpha, model.link.beta, model.world_size)
    loss = model.cpu.loss if model.cpu is not None else 0.0
    if loss <= 0:
        return simulate(g)
    host = np.array([d.startswith("cpu") for d in g.devices], dtype=bool)[g.device]
    return simulate_contended(g, (built.kind == KIND_COMP) & host, built.kind == KIND_XFER, loss)


def iteration_us(model: JobModel, strategy: Strategy, *, coarsen: bool = False) -> float:
    """Predicted iteration time of ``strategy`` (µs)."""
    return schedule_of(model, build(model, strategy, coarsen=coarsen)).makespan


def sync_time(model: JobModel, nbytes: int, k: int) -> float:
    """Partial replay: how long synchronising ``nbytes`` in ``k`` pieces takes alone (µs).

    Memoised on the model (the search asks for the same sizes every round)."""
    key = (int(nbytes), int(k))
    hit = model.sync_cache.get(key)
    if hit is not None:
        return hit
    one = JobModel(ops={}, edges=[], units=[Unit("t", nbytes, [], [])], baseline_groups=[],
                   world_size=model.world_size, scheme=model.scheme, library=model.library,
                   framework=model.framework, link=model.link, launch_us=model.launch_us, servers=model.servers)
    t = model.sync_cache[key] = schedule_of(one, build(one, Strategy(((0,),), (k,)))).makespan
    return t


@dataclass
class Analysis:
    """A replayed strategy: schedule, critical path, slack per node."""

    built: BuiltGraph
    schedule: Schedule
    critical: list[int]
    slack: np.ndarray


def analyse(model: JobModel, strategy: Strategy) -> Analysis:
    """Replay without coarsening and compute the critical path and every node's slack.

    Slack = how much a node's start can be delayed without lengthening the iteration,
    on the execution graph (data edges + the replayed order on each device).
    """
    built = build(model, strategy)
    g = built.graph
    sched = schedule_of(model, built)
    n = g.n
    src, dst = g.edges()
    order = np.lexsort((sched.end, sched.start))
    by_dev: dict[int, list[int]] = {}
    for i in order:
        by_dev.setdefault(int(g.device[i]), []).append(int(i))
    es = list(zip(src.tolist(), dst.tolist()))
    for seq in by_dev.values():
        es += list(zip(seq[:-1], seq[1:]))
    outs: list[list[int]] = [[] for _ in range(n)]
    indeg = np.zeros(n, dtype=np.int64)
    for a, b in set(es):
        outs[a].append(b)
        indeg[b] += 1
    topo = [i for i in range(n) if indeg[i] == 0]
    for i in topo:
        for j in outs[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                topo.append(j)
    durs = sched.end - sched.start
    tail = np.zeros(n)
    for i in reversed(topo):
        tail[i] = durs[i] + max((tail[j] for j in outs[i]), default=0.0)
    slack = sched.makespan - sched.start - tail
    return Analysis(built, sched, critical_path_indices(sched), np.maximum(slack, 0.0))
