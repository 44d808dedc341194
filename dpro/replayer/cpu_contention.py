"""CPU contention between a worker's computation and its own collectives (CPU-only jobs).

On a GPU the collective runs on its own engine; on a CPU the communication library's
threads (gloo's workers, Horovod's background thread) need CPU time while they move and
reduce the data, and where a rank has no spare core that time is taken from its
computation. Overlapping the synchronisation with the backward pass then gains less than
a replay with independent devices predicts (docs/benchmarks.md, loopback).

Model (fluid processor sharing): a rank has ``c`` cores (its share of the host's CPUs)
and its computation keeps ``t`` of them busy (intra-op threads); a collective, while it
runs alone, keeps ``kappa`` cores busy (measured: the CPU time of the threads other than
the training thread, per second of collective). While both run, the demand ``t + kappa``
exceeds ``c`` by the fraction

    loss = max(0, 1 - c / (min(t, c) + kappa))

and both progress at ``1 - loss`` of their pace: an op that overlaps the other kind for
``O`` µs takes ``loss * O`` µs longer (exact for two overlapping activities: tests). The
replay applies this as a fixed point (durations from the overlaps of the previous replay;
the error shrinks by ``loss`` <= 1/2 each round); a trace's measured durations are taken
back to their uncontended values the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dpro.graph.compiled import CompiledGraph
from dpro.graph.intervals import overlap
from dpro.replayer.engine import Schedule, simulate

#: fixed-point rounds of :func:`simulate_contended`
ROUNDS = 10


@dataclass(frozen=True)
class CpuShare:
    """What a rank's CPU allows (see the module docstring)."""

    cores: float  #: the rank's share of the host's CPUs (affinity / ranks on the host)
    threads: int  #: intra-op threads of its computation
    kappa: float  #: cores a collective keeps busy while it runs alone

    @property
    def loss(self) -> float:
        if self.cores <= 0:
            return 0.0
        return max(0.0, 1.0 - self.cores / (min(self.threads, self.cores) + self.kappa))


def simulate_contended(g: CompiledGraph, comp: np.ndarray, comm: np.ndarray, loss: float) -> Schedule:
    """Replay ``g`` with the ``comp`` and ``comm`` nodes (boolean masks) slowed by ``loss``
    while they overlap each other (a fixed point, :data:`ROUNDS` rounds)."""
    sched = simulate(g)
    if loss <= 0 or not comp.any() or not comm.any():
        return sched
    base = g.dur
    for _ in range(ROUNDS):
        s, e = sched.start, sched.end
        o = np.zeros(g.n)
        o[comp] = overlap(s[comp], e[comp], s[comm], e[comm])
        o[comm] = overlap(s[comm], e[comm], s[comp], e[comp])
        sched = simulate(replace(g, dur=base + loss * o))
    return sched


def host_cpus(metas: list[dict]) -> int | None:
    """CPUs the ranks of one host may run on together: the union of their recorded affinity
    sets (``meta["cpu"]["affinity"]``); None unless every rank recorded one. Ranks pinned one
    per core each see a single CPU, yet the host gives them one core each, not half a core."""
    union: set[int] = set()
    for m in metas:
        cpu = m.get("cpu") if isinstance(m, dict) else None
        aff = cpu.get("affinity") if isinstance(cpu, dict) else None
        if not isinstance(aff, list) or not aff or not all(isinstance(c, int) for c in aff):
            return None
        union.update(aff)
    return len(union) or None


def measured_share(meta: dict, local_ranks: int, comm_busy_us: float,
                   host_cpus: int | None = None) -> CpuShare | None:
    """The rank's :class:`CpuShare` from its recorder facts (``meta["cpu"]``: cores and
    threads; ``meta["cpu_after_us"]``: process and training-thread CPU over the calls after
    the window) and the wall time its collectives run per step. ``host_cpus``: the CPUs the
    host's ranks share (:func:`host_cpus`), else the rank's own affinity stands for the
    host's. None where a fact is missing (an older trace, a framework whose computation is
    not on the training thread)."""
    cpu, after = meta.get("cpu"), meta.get("cpu_after_us")
    if not isinstance(cpu, dict) or not isinstance(after, dict):
        return None
    try:
        cores, threads = float(cpu["cores"]), int(cpu["threads"])
        calls, proc, thread = int(after["calls"]), float(after["process"]), float(after["thread"])
    except (KeyError, TypeError, ValueError):
        return None
    if calls <= 0 or comm_busy_us <= 0 or cores <= 0 or threads != 1:
        # with several intra-op threads the other threads' CPU is not the collectives' alone
        return None
    kappa = max(0.0, (proc - thread) / calls) / comm_busy_us
    share = (float(host_cpus) if host_cpus else cores) / max(1, local_ranks)
    return CpuShare(share, threads, min(kappa, cores))
