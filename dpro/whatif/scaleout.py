"""Scale-out: the same job on another cluster (workers, servers, bandwidth, latency).

From any profile, one worker included, a representative worker (the lowest rank) is kept
with its op times; its communication is re-costed for the new cluster with the primitives:

* **all-reduce** (DDP, Horovod): each coarse collective of B bytes takes
  :func:`~dpro.whatif.models.allreduce_us` (ring or tree) for N workers, with alpha/beta
  fitted on the trace's own collectives (dpro.graph.comm_model) or from a platform file
  (``dpro calibrate``);
* **parameter server** (MXNet over ps-lite): every push and pull is a message on the
  connection between the worker and a server; a key's pieces go to MXNet's servers for M
  servers (``(key*9973) % M``, or split over all when it has at least the big-array bound
  of elements); a message crosses its worker's link and its server's port (one per
  direction), shared max-min fairly by the messages moving at the moment
  (:mod:`~dpro.whatif.fairshare`); the N workers push to a server in the same phase, so the
  representative worker gets 1/N of each server's port and its whole link; the messages
  queued on one connection are multiplexed
  (:func:`~dpro.whatif.models.multiplex`: heads up to the window first, then tails: the
  ``schedule`` primitive); the server aggregates and updates each piece once;
* **asynchronous SGD** (``dist_async``): a discrete-event simulation over many steps, each
  worker's compute time sampled from the profiled steps, its pushes and pulls sharing the
  servers' ports and its own link with the other flows (max-min fair), no barrier.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from dpro.errors import DproInputError
from dpro.whatif.async_sim import simulate_async
from dpro.whatif.graph import Op, WhatIfGraph
from dpro.whatif.horovod_spans import SpanFit, give_back_excess, horovod_span_fit
from dpro.whatif.models import Transfer, allreduce_us
from dpro.whatif.overlap import Overlap, deflate_overlap
from dpro.whatif.platform import OverlapCost, Platform, PsCpu

if TYPE_CHECKING:
    from dpro.job import Job

log = logging.getLogger(__name__)

#: MXNet's default MXNET_KVSTORE_BIGARRAY_BOUND (elements)
DEFAULT_BOUND = 1_000_000
#: payload bytes per byte on the link: ``--bandwidth`` is the line rate (what ``tc`` and an
#: Ethernet port count: every frame's headers); TCP over the usual 1500-byte MTU carries
#: 1448 payload bytes (timestamps on) in each 1514-byte frame
TCP_PAYLOAD_SHARE = 1448 / 1514
#: ps-lite/ZMQ control window (bytes) of the multiplexing model: first pieces of this size
#: of every queued message go out before the rest (the simulator's stream window)
DEFAULT_WINDOW = 64 << 10


@dataclass
class Cluster:
    """The cluster to predict for."""

    workers: int
    servers: int | None = None
    #: bytes per µs of a link (None: as profiled / the platform's)
    bandwidth: float | None = None
    #: per-message overhead µs (None: as profiled / the platform's)
    latency_us: float | None = None
    algorithm: str = "ring"
    asynchronous: bool = False
    #: steps of the asynchronous simulation
    steps: int = 1000
    seed: int = 0
    #: the workers share this many cores of one host (local runs): with more workers than
    #: cores, every computation op takes workers/cores times as long (None: a host each)
    host_cores: int | None = None
    #: bytes per µs of the links the profile ran on, if known (refines ``bandwidth``)
    profiled_bandwidth: float | None = None
    #: CPU time per rank of an all-reduce (``dpro calibrate``), for ``host_cores``
    comm_cpu: Transfer | None = None
    #: the profile's op times already hold ``comm_cpu`` at this many ranks (a profile of
    #: several ranks with its own collectives, its computation not given back its time alone):
    #: only the collectives' CPU beyond it is new demand (0: none held)
    comm_cpu_profiled: int = 0
    #: with ``host_cores``: each rank bound to core ``rank % host_cores`` (``taskset``,
    #: ``--bind-to core``), so the busiest core runs ``ceil(workers / host_cores)`` ranks
    pinned: bool = False
    #: CPU time of a PS message in the worker and the server (``dpro calibrate --backend
    #: ps-lite``), for ``host_cores``
    ps_cpu: PsCpu | None = None
    #: (workers, servers, efficiency) of the busiest server port with that many asynchronous
    #: senders (``dpro.whatif.calibrate_ps.measure_port``), for ``asynchronous``
    ps_port: tuple[tuple[int, int, float], ...] = ()
    #: P3 on a parameter server (the ``p3`` what-if): slices of at most this many bytes,
    #: sent first layer first, no barrier between steps (:mod:`dpro.whatif.p3_ps`)
    p3_slice_bytes: int | None = None
    #: the all-reduce while the ranks compute and their computation's speed meanwhile
    #: (``dpro calibrate``, a platform's ``overlap_*``): with it, a rank's CPU computation and
    #: its collectives slow each other while both run (:mod:`dpro.whatif.overlap`); taken from
    #: the platform when its all-reduce cost is the one used, as calibrated, with ``host_cores``
    overlap: OverlapCost | None = None


@dataclass
class Point:
    workers: int
    servers: int | None
    iteration_us: float
    #: iterations per second of the whole job (asynchronous: steps per second over all workers)
    throughput: float
    breakdown_us: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"workers": self.workers, "servers": self.servers, "iteration_us": self.iteration_us,
                "throughput_steps_per_s": self.throughput, "breakdown_us": self.breakdown_us}


@dataclass
class ScaleOutResult:
    """Predictions for one or several worker counts (:meth:`to_json` is ``dpro whatif --json``)."""

    kind: str
    points: list[Point]
    transfer: Transfer
    transfer_source: str
    profiled_workers: int
    measured_iteration_us: float | None
    asynchronous: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def predicted_iteration_us(self) -> float:
        return self.points[0].iteration_us

    def to_json(self) -> dict:
        p0 = self.points[0]
        return {
            "kind": self.kind, "asynchronous": self.asynchronous,
            "predicted_iteration_us": p0.iteration_us, "throughput_steps_per_s": p0.throughput,
            "breakdown_us": p0.breakdown_us,
            "scaling": [p.to_json() for p in self.points],
            "profiled_workers": self.profiled_workers, "measured_iteration_us": self.measured_iteration_us,
            "transfer": {"alpha_us": self.transfer.alpha, "beta_us_per_byte": self.transfer.beta,
                         "source": self.transfer_source},
            "notes": self.notes,
        }


def _transfer(job: Job, cluster: Cluster, platform: Platform | None, kind: str,
              spans: SpanFit | None = None) -> tuple[Transfer, str]:
    """alpha/beta: the platform file's, else fitted on the trace (a Horovod profile: on its
    fused spans, ``spans``); --bandwidth/--latency override."""
    t, src = None, ""
    if platform is not None:
        t, src = platform.transfer(kind), f"platform {platform.source}"
    elif spans is not None:
        t, src = spans.transfer, "fitted on the trace (Horovod's fused spans)"
    else:
        if kind == "allreduce":
            lc = job.replay().build.link_cost
        else:
            from dpro.optimizer.ps.costs import fit_server_link

            lc = fit_server_link(job.trace, list(job.steps))
        if lc is not None:
            t, src = Transfer(lc.alpha, lc.beta), "fitted on the trace"
    if cluster.bandwidth is not None:
        wire = 1.0 / (cluster.bandwidth * TCP_PAYLOAD_SHARE)
        if t is None:
            t, src = Transfer(0.0, wire), "bandwidth given"
        elif cluster.profiled_bandwidth is not None:
            # the fitted beta is the profiled wire plus the library's own per-byte work: swap the wire
            t = Transfer(t.alpha, max(0.0, t.beta - 1.0 / (cluster.profiled_bandwidth * TCP_PAYLOAD_SHARE)) + wire)
            src += " (wire swapped for the bandwidth given)"
        else:
            # the wire and the library's per-byte work pipeline: the slower one sets the pace
            t = Transfer(t.alpha, max(t.beta, wire))
            src += " (bandwidth given: beta = max(fitted, 1/bandwidth))"
    if cluster.latency_us is not None:
        t = Transfer(cluster.latency_us, t.beta if t else 0.0)
        src += " (latency given)"
    if t is None:
        raise DproInputError(job.path, f"no {kind} link cost: the profile has none to fit (one worker?); "
                             "give --platform (dpro calibrate) or --bandwidth and --latency")
    return t, src.strip()


def _workers(job: Job) -> list[WhatIfGraph]:
    """Each profiled worker's ops of the job's DFG (collectives coarse, as measured), by rank."""
    from dpro.whatif.view import of

    names = [n for _, n in sorted((nt.info.rank, name) for name, nt in job.trace.nodes.items()
                                  if nt.info.role == "worker")]
    if not names:
        raise DproInputError(job.path, "no worker in the trace")
    full = of(job, expand_collectives=False)
    out = []
    for name in names:
        g = full.copy()
        for op in list(g.select(lambda o, n=name: o.node != n)):
            g.remove(op)
        out.append(g)
    return out


def synthesize_allreduce(g: WhatIfGraph, tensors: list[tuple[str, int, str]], node: str) -> int:
    """Daydream's "distributed training from a single-worker profile" for a profile with no
    collective (Horovod at one rank skips its all-reduces): ``tensors`` are the gradients
    ``(name, bytes, producer op name in g)``; the gradients of one producer are ready in the
    same Horovod cycle and go as one fused all-reduce, inserted after the producer on the
    node's communication queue; the optimizer (the UPDATE ops with no UPDATE predecessor)
    waits for every one (``hvd.DistributedOptimizer.step`` synchronizes first). Their
    ``dur`` is set by the scale-out model. Returns the number of all-reduces inserted."""
    by_name = {op.name: op for op in g.ops.values()}
    groups: dict[str, list[tuple[str, int]]] = {}
    for name, nbytes, producer in tensors:
        if producer in by_name and nbytes > 0:
            groups.setdefault(producer, []).append((name, nbytes))
    if not groups:
        return 0
    updates = [op.id for op in g.ops.values() if op.cat == "UPDATE" and op.node == node
               and not any(g.ops[q].cat == "UPDATE" for q in g.pred[op.id])]
    for producer, ts in groups.items():
        src = by_name[producer]
        g.insert([src.id], Op(name=f"{node}/allreduce:{'+'.join(t for t, _ in ts)}", cat="COMM",
                              device=f"{node}/comm:allreduce", node=node, comm_device=True, dur=0.0,
                              bytes=sum(b for _, b in ts), prio=src.prio,
                              attrs={"sub_op": "ALLREDUCE", "synthesized": True}), updates)
    return len(groups)


def _simulate_point(g: WhatIfGraph, n: int, servers: int | None) -> Point:
    from dpro.replayer.breakdown import breakdown

    r = g.simulate()
    owners = [i for i, o in enumerate(r.graph.owners) if not o.startswith(("server", "conn:"))]
    it = r.iteration_us
    return Point(n, servers, it, 1e6 / it if it > 0 else 0.0, breakdown(r.graph, r.schedule, owners[:1]))


def predict(job: Job, cluster_points: list[Cluster], platform: Platform | None = None,
            whatifs: list[tuple[Callable, dict]] = ()) -> ScaleOutResult:
    """Predict each cluster of ``cluster_points`` (same servers/bandwidth, several worker
    counts); ``whatifs``: (function, params) applied to each representative worker's graph
    first (e.g. mixed precision on 8 workers)."""
    if not cluster_points:
        raise ValueError("no cluster to predict")
    c0 = cluster_points[0]
    workers = [nt for nt in job.trace.nodes.values() if nt.info.role == "worker"]
    has_ps = any(nt.info.role == "server" for nt in job.trace.nodes.values()) or any(
        op.sub_op == "PUSH_REQ" for nt in workers for op in nt.ops.values())
    kind = "ps" if has_ps else "allreduce"
    if kind == "allreduce" and (c0.servers or c0.asynchronous):
        raise DproInputError(job.path, "--servers/--async need a parameter-server profile; this one all-reduces")
    spans = horovod_span_fit(job) if kind == "allreduce" else None
    transfer, src = _transfer(job, c0, platform, kind, spans)
    if platform is not None and platform.allreduce_cpu is not None:
        cluster_points = [c if c.comm_cpu is not None else replace(c, comm_cpu=platform.allreduce_cpu)
                          for c in cluster_points]
    if platform is not None and platform.ps_cpu is not None:
        cluster_points = [c if c.ps_cpu is not None else replace(c, ps_cpu=platform.ps_cpu) for c in cluster_points]
    if platform is not None and platform.ps_port:
        cluster_points = [c if c.ps_port else replace(c, ps_port=platform.ps_port) for c in cluster_points]
    measured = job.replay().measured_iteration_us
    res = ScaleOutResult(kind, [], transfer, src, len(workers), measured, c0.asynchronous)
    kvstore = str((job.trace.manifest.meta or {}).get("kvstore") or "")
    if kind == "ps" and "async" in kvstore and not c0.asynchronous:
        res.notes.append(f"profiled with {kvstore}: --async predicts its throughput")
    reps = _workers(job)
    if kind == "allreduce" and not any(g.select(lambda o: o.attrs.get("sub_op") == "ALLREDUCE") for g in reps):
        for g, (name, nt) in zip(reps, sorted(((nt.info.rank, n), nt) for n, nt in job.trace.nodes.items()
                                              if nt.info.role == "worker")):
            k = synthesize_allreduce(g, [(t.name, t.bytes, f"{name[1]}/{t.producer}") for t in nt.tensors
                                         if t.producer], name[1])
        if k:
            res.notes.append(f"the profile has no collective (one rank): {k} gradient all-reduces inserted "
                             "after the ops producing the gradients, before the optimizer")
    if spans is not None:
        for g in reps:
            give_back_excess(g, spans)
        res.notes.append(f"Horovod: ring cost fitted on the {spans.samples} fused executions' whole spans "
                         f"(alpha {spans.transfer.alpha:.1f} us, beta {spans.transfer.beta * 1e3:.2f} ns/B), "
                         "each collective's gap keeps only the excess beyond it")
    if platform is not None and platform.unsteady and src == f"platform {platform.source}":
        from dpro.whatif.calibrate import describe_unsteady

        res.notes.append(f"the platform's calibration tries disagreed ({describe_unsteady(platform.unsteady)}): "
                         "its cost is the median of a machine whose speed moved; calibrate again to check it")
    law = _overlap_law(platform, src, c0, reps, res.notes) if kind == "allreduce" else None
    if law is not None:
        cluster_points = [c if c.overlap is not None else replace(c, overlap=law) for c in cluster_points]
    per_rep = [transfer] * len(reps)
    if kind == "allreduce" and spans is None and law is None and len(reps) > 1 and any(
            not op.attrs.get("synthesized") for op in reps[0].select(lambda o: o.attrs.get("sub_op") == "ALLREDUCE")):
        # its computation ran beside its own collectives, and no overlap law gave it back its
        # time alone. Not Horovod's: its background thread polls (CPU = wall), which torch's
        # gloo calibration (the CPU cost given) does not measure, so what its op times hold
        # is not cpu(P) (docs/whatif.md, session 31)
        cluster_points = [replace(c, comm_cpu_profiled=len(reps)) for c in cluster_points]
    if kind == "allreduce" and not c0.asynchronous:
        c_ = cluster_points[0]
        for i, g in enumerate(reps):
            k = deflate_lockstep(g, c_, len(reps))
            if k > 1.0:
                res.notes.append(f"the profile's {len(reps)} ranks computed in lockstep on {c_.host_cores} cores: "
                                 f"its computation / {k:.3f} before scaling out")
            f = deflate_contended(g, c_, len(reps), measured)
            if f > 1.0:
                if f >= 1.0005:  # what shows at 3 decimals
                    res.notes.append(f"the profile's workers saturated the {c_.host_cores} cores: "
                                     f"its times / {f:.3f} before scaling out")
                if src.startswith("fitted on the trace"):  # the collectives were measured as slowly
                    per_rep[i] = Transfer(transfer.alpha / f, transfer.beta / f)
    if kind == "ps" and not c0.asynchronous:
        for g in reps:
            k = deflate_lockstep(g, cluster_points[0], len(reps), gaps=False)
            if k > 1.0:
                res.notes.append(f"the profile's {len(reps)} workers computed in lockstep on "
                                 f"{cluster_points[0].host_cores} cores: its computation / {k:.3f} before scaling out")
    lone = None  # a one-worker profile: its measured step corrects the asynchronous simulation's lone worker
    if kind == "ps" and c0.asynchronous and len(reps) == 1 and measured:
        t0, _ = _transfer(job, replace(c0, bandwidth=None, latency_us=None), platform, kind, spans)
        lone = lone_comm_ratio_of(job, reps[0], t0, measured)
    if kind == "ps":
        cluster_points, whatifs = _p3_on_ps(job, cluster_points, whatifs, res)
    for fn, params in whatifs:
        for g in reps:
            fn(g, **params)
    if len(reps) > 1:
        res.notes.append(f"each of the {len(reps)} profiled workers predicted as the representative; "
                         "synchronous: the slowest one's iteration")
    for c in cluster_points:
        if c.asynchronous:
            res.points.append(_async_point(job, reps[0], c, transfer, lone))
            continue
        one = _allreduce_point if kind == "allreduce" else (lambda g, c, t: _ps_point(job, g, c, t))
        res.points.append(max((one(g.copy(), c, t) for g, t in zip(reps, per_rep)), key=lambda p: p.iteration_us))
    return res


def _overlap_law(platform: Platform | None, src: str, c0: Cluster, reps: list[WhatIfGraph],
                 notes: list[str]) -> OverlapCost | None:
    """The platform's overlap law, where it applies: with ``host_cores`` and the platform's
    all-reduce cost as calibrated (timed alone, so the overlap is the model's, not the
    profile's; a ``--bandwidth`` or ``--latency`` given: the wire paces the collectives, the
    calibration's overlap on its own link does not apply). A profile of several ranks whose
    computation ran beside its own collectives gets its time alone back first."""
    if not c0.host_cores or platform is None or platform.allreduce_overlap is None \
            or src != f"platform {platform.source}":
        return None
    law = platform.allreduce_overlap
    notes.append(f"collectives and computation slow each other while both run (platform): computation "
                 f"at x{law.compute_rate:.2f}, collectives at alpha {law.transfer.alpha:.1f} us, "
                 f"beta {law.transfer.beta * 1e3:.2f} ns/B a ring step")
    for g in reps if len(reps) > 1 else []:  # one rank's collectives take no time
        if any(not op.attrs.get("synthesized") for op in g.select(lambda o: o.attrs.get("sub_op") == "ALLREDUCE")):
            us = deflate_overlap(g, law.compute_rate)
            if us > 0:
                notes.append(f"the profile's computation beside its collectives: {us / 1e3:.2f} ms back to its time alone")
    return law


# -- all-reduce -------------------------------------------------------------------------------
def _is_server(op: Op) -> bool:
    return op.node.startswith("server")


def lockstep_factor(n: int, cores: int | None, pinned: bool) -> float:
    """How many times longer a computation takes when ``n`` ranks of a synchronous job
    compute at the same moment on ``cores`` cores: pinned (core ``rank % cores``), the
    busiest core's ``ceil(n/cores)`` ranks take turns on it; free, ``n/cores`` (processor
    sharing); 1 when they fit (or no ``cores``)."""
    if not cores or n <= cores:
        return 1.0
    return float(math.ceil(n / cores)) if pinned else n / cores


def _computing(op: Op) -> bool:
    return op.cat != "COMM" and not op.comm_device


def _oversubscribed(g: WhatIfGraph, c: Cluster, point: Callable[[WhatIfGraph], Point], *,
                    worker_cpu: float = 0.0, host_cpu: float = 0.0, gaps: bool = True,
                    lockstep: bool = False) -> Point:
    """``point(g)`` with N workers sharing C cores of one host (``c.host_cores``).

    Each worker needs ``busy`` µs of CPU a step: its computation ops, plus, with
    ``c.comm_cpu`` (``dpro calibrate``'s CPU time of a collective), the CPU its collectives
    take (the library's reductions and copies, the kernel's socket work:
    ``allreduce_us(bytes, N, comm_cpu)`` each, less what a profile of several ranks already
    holds, :func:`comm_cpu_demand`). N of them fit on C cores only if the step
    lasts at least ``N*busy/C`` (``c.pinned``, each rank bound to core ``rank % C``: the
    busiest core's ``ceil(N/C)*busy``). Processor sharing slows every computation op by the least
    factor ``f >= 1`` with ``T(f) >= N*busy/C``, and a collective takes the longer of its
    link time and its CPU time ``* f`` (bisection: the step ``T`` grows with ``f``). A
    CPU-bound job slows by N/C; one whose workers wait on the network lends those waits to
    the others (workers not in lockstep). Without ``comm_cpu`` nothing changes up to C
    workers; with it, C workers whose collectives overlap their computation may already
    contend.

    Parameter server: ``worker_cpu`` is a worker's CPU per step beyond its ops (ps-lite's
    messages, :func:`ps_cpu_demand`), ``host_cpu`` the CPU per step of the host's other
    processes (the servers' messages); the servers' own ops (updates) count once, not per
    worker. Pinned workers leave the servers unpinned: the step lasts at least the busiest
    core's ``ceil(N/C)`` workers and at least all the CPU over C cores. ``gaps=False``: an
    op's host gap is not CPU (MXNet: the engine thread's waits between ops, see
    :func:`_ps_point`).

    ``lockstep`` (synchronous all-reduce, synchronous PS): the workers compute in the same
    phases (the collectives end on every rank at once, a dist_sync step's pulls end on every
    worker at once, and all start the next forward then), so the waits on the network are
    every worker's at the same moment and lend no core: a worker's computation op (its own
    time, and its host gap where ``gaps``) takes at least :func:`lockstep_factor` times as
    long; the CPU bound above then only slows it further. The servers' ops are not in the
    workers' phase (they run between a push and its pull): only the CPU bound slows them."""
    n, cores = c.workers, c.host_cores
    if not cores or (n <= cores and c.comm_cpu is None and not worker_cpu and not host_cpu):
        return point(g.copy())
    from dpro.whatif.builtin import compute_speed

    comm_cpu = {} if c.comm_cpu is None else {
        op.id: allreduce_us(op.bytes, n, c.comm_cpu) for op in g.ops.values() if op.attrs.get("sub_op") == "ALLREDUCE"}
    computing = [op for op in g.ops.values() if op.cat != "COMM" and not op.comm_device]
    busy = sum(op.dur + op.gap * gaps for op in computing if not _is_server(op))
    host = host_cpu + sum(op.dur + op.gap * gaps for op in computing if _is_server(op))
    # N ranks' CPU on C cores; pinned, the busiest core runs ceil(N/C) of them
    cpu = busy + comm_cpu_demand(g, c) + worker_cpu
    need = (n * cpu + host) / cores
    if c.pinned:
        need = max(need, math.ceil(n / cores) * cpu)

    k = lockstep_factor(n, cores, c.pinned) if lockstep else 1.0
    servers = any(_is_server(op) for op in computing)

    def at(f: float) -> Point:
        # f: the CPU's sharing of every computation op; a worker's ops at least k (lockstep)
        h = g.copy()
        compute_speed(h, factor=1.0 / f)
        if k > 1.0:
            for op in h.select(lambda o: _computing(o) and not _is_server(o)):
                op.dur *= max(1.0, k / f)
                op.gap *= k if gaps else 1.0
        for i, cpu_us in comm_cpu.items():
            h.ops[i].dur = max(h.ops[i].dur, cpu_us * f)
        return point(h)

    lo = 1.0 if servers else k  # without servers' ops nothing changes below k
    first = at(lo)
    if first.iteration_us >= need:
        return first
    hi = max(lo, k, n / cores)
    while at(hi).iteration_us < need and hi < 1e3:  # overlapping threads: beyond N/C
        lo, hi = hi, hi * 2
    for _ in range(20):
        mid = (lo + hi) / 2
        if at(mid).iteration_us >= need:
            hi = mid
        else:
            lo = mid
    return at(hi)


def comm_cpu_demand(g: WhatIfGraph, c: Cluster, n: int | None = None) -> float:
    """CPU µs a rank's collectives add to its computation's at ``n`` ranks (default
    ``c.workers``): their calibrated CPU (``c.comm_cpu``), less what the profile's op times
    already hold at ``c.comm_cpu_profiled`` ranks (its computation beside its collectives ran
    slower by about their CPU, and the collectives' own times carry the rest)."""
    if c.comm_cpu is None:
        return 0.0
    n = c.workers if n is None else n
    sizes = [op.bytes for op in g.ops.values() if op.attrs.get("sub_op") == "ALLREDUCE"]
    return sum(max(0.0, allreduce_us(b, n, c.comm_cpu) - allreduce_us(b, c.comm_cpu_profiled, c.comm_cpu))
               for b in sizes)


def deflate_lockstep(g: WhatIfGraph, c: Cluster, profiled: int, gaps: bool = True) -> float:
    """A profile of ``profiled`` synchronous ranks on ``c.host_cores`` cores ran every
    computation op :func:`lockstep_factor` times slower than alone: divides their own
    times (and host gaps, where ``gaps``) by it and returns it (1: they fit). A PS
    server's ops are not a worker's: left as they are."""
    k = lockstep_factor(profiled, c.host_cores, c.pinned)
    if k > 1.0:
        for op in g.select(lambda o: _computing(o) and not _is_server(o)):
            op.dur /= k
            op.gap /= k if gaps else 1.0
    return k


def deflate_contended(g: WhatIfGraph, c: Cluster, profiled: int, step_us: float | None = None) -> float:
    """A profile of ``profiled`` workers on the same ``c.host_cores`` cores that saturated
    them ran every op ``f`` times slower than alone: its step ``T`` is then the CPU its
    workers needed, ``profiled * (busy/f + cpu) = cores * T`` (``busy``: the computation
    ops' measured time, ``cpu``: the collectives' CPU per ``c.comm_cpu`` at ``profiled``
    ranks that the op times do not already hold, :func:`comm_cpu_demand`). ``T`` is
    ``step_us``, the profile's measured step, where given (a worker's graph
    simulated alone, without the other ranks' waits, can step well below it: 76.6 against
    92.7 ms on a Horovod loopback profile, which then read as saturated), else ``g``
    simulated. Divides every op's time of ``g`` by ``f`` and returns it (1: not saturated,
    or no ``host_cores``/``comm_cpu`` to tell)."""
    if not c.host_cores or c.comm_cpu is None:
        return 1.0
    t = step_us if step_us else g.simulate().iteration_us
    busy = sum(op.dur + op.gap for op in g.ops.values() if op.cat != "COMM" and not op.comm_device)
    cpu = comm_cpu_demand(g, c, profiled)
    room = (t / math.ceil(profiled / c.host_cores) if c.pinned else c.host_cores * t / profiled) - cpu
    if room <= 0 or busy <= room:
        return 1.0
    f = busy / room
    for op in g.ops.values():
        op.dur /= f
        op.gap /= f
    return f


def _allreduce_point(g: WhatIfGraph, c: Cluster, t: Transfer) -> Point:
    for op in g.select(lambda o: o.attrs.get("sub_op") == "ALLREDUCE"):
        op.dur = allreduce_us(op.bytes, c.workers, t, c.algorithm)
    if c.overlap is not None:
        g.overlap = Overlap(c.overlap.compute_rate, {
            op.id: allreduce_us(op.bytes, c.workers, c.overlap.transfer, c.algorithm)
            for op in g.select(lambda o: o.attrs.get("sub_op") == "ALLREDUCE")})
    return _oversubscribed(g, c, lambda h: _simulate_point(h, c.workers, None), lockstep=True)


# -- parameter server -------------------------------------------------------------------------
@dataclass
class _Piece:
    key: str
    server: int
    bytes: int


def _key_of(job: Job) -> dict[str, int]:
    """Tensor name -> kvstore key, from the first worker's recorded key map."""
    from dpro.optimizer.ps.layout import key_index

    return key_index(next((nt for nt in job.trace.nodes.values() if nt.info.role == "worker"), None))


def _ps_pieces(job: Job, g: WhatIfGraph, servers: int) -> tuple[dict[str, list[_Piece]], int]:
    """Per gradient (tensor base name): its pieces for ``servers`` servers by MXNet's rule."""
    from dpro.optimizer.ps.layout import base_name, mxnet_home

    key_of = _key_of(job)
    bound = int(job.trace.manifest.meta.get("bigarray_bound") or DEFAULT_BOUND) if isinstance(
        getattr(job.trace.manifest, "meta", None), dict) else DEFAULT_BOUND
    total: dict[str, int] = {}
    for op in g.select(lambda o: o.attrs.get("sub_op") == "PUSH_REQ"):
        name = base_name(op.attrs.get("tensor") or op.name)
        total[name] = total.get(name, 0) + op.bytes
    out = {}
    for i, (name, nbytes) in enumerate(sorted(total.items())):
        if nbytes // 4 >= bound and servers > 1:
            out[name] = [_Piece(name, s, nbytes // servers) for s in range(servers)]
        else:
            out[name] = [_Piece(name, mxnet_home(key_of.get(name, i), servers), nbytes)]
    return out, bound


def ps_key_sizes(job: Job) -> list[int]:
    """The bytes a worker step pushes of each key, in the order of the job's keys (its
    recorded key map, else the gradients' names): the message mix of the job, for the port
    calibration (:func:`dpro.whatif.calibrate_ps.measure_port`)."""
    key_of = _key_of(job)
    pieces, _ = _ps_pieces(job, _workers(job)[0], 1)  # the representative worker's step
    order = sorted(pieces, key=lambda n: (key_of.get(n, len(key_of)), n))
    return [sum(p.bytes for p in pieces[n]) for n in order]


def ps_compute_us(job: Job) -> float:
    """A worker step's computation (µs): the representative worker's step with its
    communication zeroed, what the port calibration spends as CPU before each round
    (:func:`dpro.whatif.calibrate_ps.measure_port`)."""
    return _compute_only_us(_workers(job)[0])


def _p3_on_ps(job: Job, points: list[Cluster], whatifs, res: ScaleOutResult) -> tuple[list[Cluster], list]:
    """The ``p3`` what-if on a PS profile becomes the clusters' ``p3_slice_bytes`` (the PS
    model re-costs every message, so P3 is modelled there: :mod:`dpro.whatif.p3_ps`)."""
    from dpro.whatif.builtin import p3

    rest, sizes = [], []
    for fn, params in whatifs:
        if fn is p3:
            sizes.append(int(params.get("slice_bytes", 4 << 20)))
        else:
            rest.append((fn, params))
    if not sizes:
        return points, list(whatifs)
    if any(c.asynchronous for c in points):
        raise DproInputError(job.path, "p3 on a parameter server: synchronous steps only (not --async)")
    if sizes[-1] < 1:
        raise DproInputError(None, f"p3: slice_bytes {sizes[-1]}: must be >= 1")
    res.notes.append(f"P3: every gradient in slices of at most {sizes[-1]} bytes sent first layer first after "
                     "the backward, no barrier between steps: the steady-state period of chained iterations")
    return [replace(c, p3_slice_bytes=sizes[-1]) for c in points], rest


def _ps_p3_point(job: Job, g: WhatIfGraph, c: Cluster, t: Transfer) -> Point:
    """A synchronous PS worker's step under P3 with ``c.p3_slice_bytes`` (the period of
    :func:`~dpro.whatif.p3_ps.period_us`); the messages, links, servers' updates and CPU
    sharing as in :func:`_ps_point`."""
    from dpro.optimizer.ps.costs import fit_update
    from dpro.optimizer.ps.layout import base_name
    from dpro.whatif.p3_ps import Iteration, mirror_forward, period_us, slices

    servers = c.servers or _profiled_servers(job)
    pieces, _ = _ps_pieces(job, g, servers)
    ua, ub = fit_update(job.trace, list(job.steps))
    node = next(iter(g.ops.values())).node
    g.links = ps_links(node, servers, c.workers, t)
    by_key: dict[str, list[Op]] = {}
    for op in list(g.select(lambda o: o.attrs.get("sub_op") in ("PUSH_REQ", "PULL_RES"))):
        by_key.setdefault(base_name(op.attrs.get("tensor") or op.name), []).append(op)
    index = _key_of(job)
    # layer order: the framework's key order (gluon: the parameters' order, first layer first)
    order = sorted(by_key, key=lambda n: (index.get(n, len(index)), n))
    producers: set[int] = set()
    after: dict[str, set[int]] = {}
    consumer: dict[str, int | None] = {}
    for name in order:
        ops = by_key[name]
        ids = {o.id for o in ops}
        before = {p for o in ops if o.attrs["sub_op"] == "PUSH_REQ" for p in g.pred[o.id]} - ids
        after[name] = {s for o in ops if o.attrs["sub_op"] == "PULL_RES" for s in g.succ[o.id]} - ids
        producers |= before
        fw = {f.id for f in (mirror_forward(g, g.ops[p]) for p in before) if f is not None}
        consumer[name] = next(iter(fw)) if len(fw) == 1 else None
        for o in ops:
            g.remove(o)
    fwd = sorted((op for op in g.ops.values() if op.cat == "FW" and op.node == node), key=lambda o: o.prio)
    if not fwd or not producers:
        raise ValueError("p3: the worker's step has no forward or no gradient producer")
    total = {name: sum(p.bytes for p in pieces.get(name, [])) for name in order}
    cut = slices([(n, total[n]) for n in order], c.p3_slice_bytes, servers)
    ready: dict[str, set[int]] = {n: set() for n in order}
    push_us, pull_us = slice_message_us(c.ps_cpu, t, c.workers)
    for s in cut:
        # every slice handed over once the backward is done, first layer first: key = send order
        up = _pipelined_message(g, producers, f"{node}/push:{s.tensor}#{s.key}@s{s.server}", node,
                                f"ps-send:{node}", push_us(s.bytes), f"conn:{node}->s{s.server}", s.bytes,
                                float(s.key), (("link", node, "out"), ("port", s.server, "in")))
        upd = g.insert([up], Op(name=f"server{s.server}/update:{s.tensor}#{s.key}", cat="UPDATE",
                                node=f"server{s.server}", device=f"server{s.server}/update", dur=ua + ub * s.bytes,
                                prio=float(s.key)))
        down = _pipelined_message(g, [upd.id], f"{node}/pull:{s.tensor}#{s.key}@s{s.server}", f"server{s.server}",
                                  f"ps-send:server{s.server}", pull_us(s.bytes), f"conn:s{s.server}->{node}",
                                  s.bytes, float(s.key), (("port", s.server, "out"), ("link", node, "in")))
        for a in after[s.tensor]:
            g.connect(down, a)
        ready[s.tensor].add(down)
    for name in order:  # its parameters are in place after the copies that follow its pulls
        copies = {a for a in after[name] if g.ops[a].cat != "OTHER" or "copy" in g.ops[a].name}
        if copies:
            ready[name] = copies
    # one slice at a time per connection, in send order (no head-first multiplexing: P3 sends by priority)
    g.schedule(lambda op: op.prio)
    it = Iteration(producers, {n: r for n, r in ready.items() if r}, consumer, fwd[0].id)
    wcpu, scpu = ps_cpu_demand([_Piece(s.tensor, s.server, s.bytes) for s in cut], c.workers, servers, c.ps_cpu)

    def point(h: WhatIfGraph) -> Point:
        period, first = period_us(h, it)
        return Point(c.workers, servers, period, 1e6 / period if period > 0 else 0.0,
                     {"p3_period": period, "p3_first_backward_end": first, "p3_slices": float(len(cut))})

    return _oversubscribed(g, c, point, worker_cpu=wcpu, host_cpu=sum(scpu), gaps=False, lockstep=True)


def slice_message_us(cost: PsCpu | None, t: Transfer,
                     workers: int) -> tuple[Callable[[int], float], Callable[[int], float]]:
    """A P3 slice's per-message cost (µs) in its sender, as functions of its bytes: (push
    from the worker, pull answered by the server).

    With ps-lite's calibrated CPU per message (``dpro calibrate --backend ps-lite``, the
    ``--cpu-cost`` file): the worker's ``worker.alpha + worker.beta * B`` for a push, the
    server's ``server.alpha + server.beta * B`` for each of the ``workers`` workers' pulls
    of the slice (one server thread answers them all, as its port carries them all:
    ``workers`` times it). Without it, the link's per-message ``alpha`` (the trace's fit)."""
    if cost is None:
        return (lambda b: t.alpha), (lambda b: t.alpha)
    return cost.worker.us, (lambda b: workers * cost.server.us(b))


def _pipelined_message(g: WhatIfGraph, before, name: str, node: str, stage: str, stage_us: float,
                       conn: str, nbytes: int, prio: float, links: tuple) -> int:
    """A P3 slice as ps-lite sends it: the sender's per-message work (``stage_us`` on
    ``stage``, the sender process's ps-lite thread, one message at a time), then its bytes on
    the connection ``conn`` (one message at a time, no per-message time: the wire) crossing
    ``links`` at the max-min fair rate. The stage of the next slice runs while this one is on
    the wire, so a slice costs its per-message work only where the wire waits for it (where
    the work is longer than the bytes' time, or before the first slice). The wire op's id."""
    work = g.insert(before, Op(name=f"{name}:send", cat="COMM", device=stage, node=node, comm_device=True,
                               dur=stage_us, prio=prio, attrs={"sub_op": "PS_SEND"}))
    wire = g.insert([work.id], Op(name=f"{name}:wire", cat="COMM", device=conn, node=node, comm_device=True,
                                  dur=0.0, bytes=nbytes, prio=prio, attrs={"sub_op": "PS_MSG", "links": links}))
    return wire.id


def _ps_point(job: Job, g: WhatIfGraph, c: Cluster, t: Transfer) -> Point:
    """Synchronous PS: the worker's pushes and pulls re-costed and re-placed, one step."""
    if c.p3_slice_bytes:
        return _ps_p3_point(job, g, c, t)
    from dpro.optimizer.ps.costs import fit_update
    from dpro.optimizer.ps.layout import base_name

    servers = c.servers or _profiled_servers(job)
    pieces, _ = _ps_pieces(job, g, servers)
    ua, ub = fit_update(job.trace, list(job.steps))
    node = next(iter(g.ops.values())).node
    g.links = ps_links(node, servers, c.workers, t)
    window = DEFAULT_WINDOW
    by_key: dict[str, list[Op]] = {}
    for op in list(g.select(lambda o: o.attrs.get("sub_op") in ("PUSH_REQ", "PULL_RES"))):
        by_key.setdefault(base_name(op.attrs.get("tensor") or op.name), []).append(op)
    heads: set[int] = set()
    for name, ops in by_key.items():
        push = [o for o in ops if o.attrs["sub_op"] == "PUSH_REQ"]
        pull = [o for o in ops if o.attrs["sub_op"] == "PULL_RES"]
        before = {p for o in push for p in g.pred[o.id]} - {o.id for o in ops}
        after = {s for o in pull for s in g.succ[o.id]} - {o.id for o in ops}
        prio = min(o.prio for o in push) if push else 0.0
        for o in ops:
            g.remove(o)
        ends = []
        for p in pieces.get(name, []):
            # push: head up to the window, then the tail (multiplexing), on the connection to the server
            up = _message(g, before, f"{node}/push:{name}@s{p.server}", f"conn:{node}->s{p.server}", node,
                          p.bytes, t, window, prio, heads, (("link", node, "out"), ("port", p.server, "in")))
            upd = g.insert([up], Op(name=f"server{p.server}/update:{name}", cat="UPDATE", node=f"server{p.server}",
                                    device=f"server{p.server}/update", dur=ua + ub * p.bytes, prio=prio))
            down = _message(g, [upd.id], f"{node}/pull:{name}@s{p.server}", f"conn:s{p.server}->{node}",
                            f"server{p.server}", p.bytes, t, window, prio, heads,
                            (("port", p.server, "out"), ("link", node, "in")))
            ends.append(down)
        for e in ends:
            for a in after:
                g.connect(e, a)
    g.schedule(lambda op: (0.0 if op.id in heads or op.cat != "COMM" else 1e12) + op.prio)
    wcpu, scpu = ps_cpu_demand([p for ps in pieces.values() for p in ps], c.workers, servers, c.ps_cpu)
    # MXNet runs the ops on its engine threads, asynchronously from the Python front end: the
    # gap before an op there is a wait (for the front end, for a dependency, for the
    # process's ps-lite threads, which ps_cpu counts), not computation
    # the workers of a dist_sync step start their forward together when the pulls end
    return _oversubscribed(g, c, lambda h: _simulate_point(h, c.workers, servers), worker_cpu=wcpu,
                           host_cpu=sum(scpu), gaps=False, lockstep=True)


def ps_cpu_demand(pieces: list[_Piece], workers: int, servers: int, cost: PsCpu | None) -> tuple[float, list[float]]:
    """ps-lite's CPU per step (µs): each worker's, and each server's, for ``workers`` workers.

    A worker pushes every piece to its server and pulls it back: two messages of the
    piece's bytes, ``2 * (worker.alpha + worker.beta * bytes)`` of its CPU; the server
    receives and sends the same for each of the workers: ``workers * 2 * (server.alpha +
    server.beta * bytes)`` (synchronous and asynchronous alike: per worker step)."""
    if cost is None:
        return 0.0, [0.0] * servers
    w = sum(2 * cost.worker.us(p.bytes) for p in pieces)
    s = [0.0] * servers
    for p in pieces:
        s[p.server] += workers * 2 * cost.server.us(p.bytes)
    return w, s


def ps_links(node: str, servers: int, workers: int, t: Transfer) -> dict:
    """The capacities (bytes/µs) the representative worker ``node``'s messages cross in a
    synchronous step: its own link per direction at ``1/beta``, and each server's port
    per direction, whose ``1/beta`` the ``workers`` workers in the same phase share: ``1/N``
    of it for each (the symmetric case of the max-min share, :mod:`dpro.whatif.fairshare`)."""
    bw = 1.0 / t.beta if t.beta > 0 else math.inf
    caps: dict = {("link", node, d): bw for d in ("out", "in")}
    caps.update({("port", s, d): bw / max(1, workers) for s in range(servers) for d in ("in", "out")})
    return {r: c for r, c in caps.items() if math.isfinite(c)}


def _message(g: WhatIfGraph, before, name: str, device: str, node: str, nbytes: int, cost: Transfer,
             window: int, prio: float, heads: set[int], links: tuple) -> int:
    """A message as its head (up to ``window`` bytes, paying the overhead ``alpha``) and tail
    on ``device`` (its connection: one piece at a time); their bytes cross ``links`` at the
    max-min fair rate among the messages moving at the moment. The tail's id."""
    head = g.insert(before, Op(name=f"{name}:head", cat="COMM", device=device, node=node, comm_device=True,
                               dur=cost.alpha, bytes=min(nbytes, window), prio=prio,
                               attrs={"sub_op": "PS_MSG", "links": links}))
    heads.add(head.id)
    if nbytes <= window:
        return head.id
    tail = g.insert([head.id], Op(name=f"{name}:tail", cat="COMM", device=device, node=node, comm_device=True,
                                  dur=0.0, bytes=nbytes - window, prio=prio,
                                  attrs={"sub_op": "PS_MSG", "links": links}))
    return tail.id


def _profiled_servers(job: Job) -> int:
    return max(1, sum(1 for nt in job.trace.nodes.values() if nt.info.role == "server"))


# -- asynchronous SGD -------------------------------------------------------------------------
def _async_point(job: Job, base: WhatIfGraph, c: Cluster, t: Transfer, comm_ratio: float | None = None) -> Point:
    """Discrete-event simulation of ``c.steps`` steps of asynchronous SGD.

    A worker alone runs the synchronous one-worker graph (its pushes overlap its backward
    pass): its step ``T1`` and compute-only time ``C`` (communication ops zeroed) give the
    exposed communication ``T1 - C``, times ``comm_ratio`` when given (a one-worker
    profile's measured lone step against the model's, :func:`lone_comm_ratio_of`); each
    server's bytes are scaled so that one worker in the simulation takes exactly ``C`` plus
    that exposed communication (``async_bytes_scale`` in the breakdown). In the simulation
    a worker sends its messages to a server one at a time in its profiled order
    (:func:`async_messages`) and pulls each once the server has updated it, so its pushes
    and pulls overlap key by key (:mod:`dpro.whatif.async_sim`); it adds what the other workers'
    traffic through the same server ports costs and, with ``c.host_cores``, the workers
    computing at the same time sharing those cores. The scaling hides the overlap of one
    worker's pushes with its backward pass, but also shrinks the bytes the server ports
    carry: the mean step is at least :func:`async_port_bound` (every worker step's real
    bytes through the busiest port, and through the worker's own link), and, with ps-lite's
    CPU cost, :func:`async_cpu_bound`."""
    from dpro.optimizer.ps.costs import fit_update

    servers = c.servers or _profiled_servers(job)
    pieces, _ = _ps_pieces(job, base, servers)
    per_server = [0.0] * servers
    msgs = [0] * servers
    for ps in pieces.values():
        for p in ps:
            per_server[p.server] += p.bytes
            msgs[p.server] += 1
    plan = async_messages(base, pieces, servers)
    ua, ub = fit_update(job.trace, list(job.steps))
    comp_us = _compute_only_us(base)
    solo = _ps_point(job, base.copy(), Cluster(1, servers), t).iteration_us
    exposed = max(0.0, solo - comp_us)
    bd = {"compute": comp_us}
    if comm_ratio is not None:
        exposed *= comm_ratio
        bd["lone_comm_ratio"] = comm_ratio
    # one worker's communication alone in the simulation; every term scales with k
    thr1 = simulate_async(1, [0.0], per_server, msgs, t, ua, ub, 1, messages=plan) if any(per_server) else 0.0
    raw = 1e6 / thr1 if thr1 > 0 else 0.0
    k = exposed / raw if raw > 0 else 0.0
    bd["async_bytes_scale"] = k
    samples = _step_factors(job)
    thr = simulate_async(c.workers, [comp_us * f for f in samples], [b * k for b in per_server], msgs,
                         Transfer(t.alpha * k, t.beta), ua * k, ub, c.steps, c.seed, cores=c.host_cores,
                         pinned=c.pinned, messages=[[b * k for b in m] for m in plan])
    it = c.workers * 1e6 / thr if thr > 0 else 0.0
    bd["exposed_COMM_alone"] = exposed
    eff = port_efficiency_for(c.ps_port, c.workers, servers)
    port = async_port_bound(c.workers, per_server, msgs, t, eff)
    bd["port_bound"] = port
    if c.ps_port:
        bd["port_efficiency"] = eff
    if port > it:
        it, thr = port, c.workers * 1e6 / port
    if c.host_cores and c.ps_cpu is not None:
        # the host's CPU per worker step: its computation and messages, the servers' side of
        # them and an update per push (asynchronous: every push is applied); a bound on the
        # mean step over the cores (pinned: also the busiest core's ceil(N/C) workers)
        wcpu, scpu = ps_cpu_demand([p for ps in pieces.values() for p in ps], 1, servers, c.ps_cpu)
        upd = sum(ua * msgs[s] + ub * per_server[s] for s in range(servers))
        own = sum(op.dur for op in base.ops.values() if op.cat != "COMM" and not op.comm_device)  # no gaps: _ps_point
        bound = async_cpu_bound(c.workers, c.host_cores, own + wcpu, sum(scpu) + upd, c.pinned)
        bd["cpu_bound"] = bound
        if bound > it:
            it, thr = bound, c.workers * 1e6 / bound
    return Point(c.workers, servers, it, thr, bd)


def async_messages(g: WhatIfGraph, pieces: dict[str, list[_Piece]], servers: int) -> list[list[float]]:
    """The bytes of the messages a worker step sends to each server, in the order the
    worker sends them: its gradients' pushes by their order in the profiled step (the
    push ops' ``prio``, their measured start offset), each gradient's pieces on their servers."""
    from dpro.optimizer.ps.layout import base_name

    first: dict[str, float] = {}
    for op in g.select(lambda o: o.attrs.get("sub_op") == "PUSH_REQ"):
        name = base_name(op.attrs.get("tensor") or op.name)
        first[name] = min(first.get(name, op.prio), op.prio)
    out: list[list[float]] = [[] for _ in range(servers)]
    for name in sorted(pieces, key=lambda n: (first.get(n, float("inf")), n)):
        for p in pieces[name]:
            out[p.server].append(float(p.bytes))
    return out


def _compute_only_us(g: WhatIfGraph) -> float:
    """The graph's step with its communication ops (and their gaps) zeroed."""
    compute = g.copy()
    for op in list(compute.select(lambda o: o.cat == "COMM")):
        op.dur, op.gap = 0.0, 0.0
    return compute.simulate().iteration_us


def lone_comm_ratio(measured_us: float, compute_us: float, model_us: float) -> float | None:
    """The measured lone worker's exposed communication over the model's: ``(measured - C) /
    (model - C)``, ``C`` the compute-only step, ``measured`` the step a lone worker took (a
    one-worker profile's), ``model`` the synchronous graph's one-worker step in the same
    cluster; None when either is not above ``C`` (nothing to scale)."""
    if measured_us <= compute_us or model_us <= compute_us:
        return None
    return (measured_us - compute_us) / (model_us - compute_us)


def lone_comm_ratio_of(job: Job, g: WhatIfGraph, t: Transfer, measured_us: float) -> float | None:
    """:func:`lone_comm_ratio` of a one-worker profile's graph ``g`` (before any what-if) in
    its profiled cluster: its servers, the link ``t`` as profiled (no --bandwidth/--latency)."""
    model = _ps_point(job, g.copy(), Cluster(1, _profiled_servers(job)), t).iteration_us
    return lone_comm_ratio(measured_us, _compute_only_us(g), model)


def async_port_bound(workers: int, server_bytes: list[float], server_msgs: list[int], t: Transfer,
                     efficiency: float = 1.0) -> float:
    """The least mean step of a worker (µs) that the servers' ports and the workers' links
    allow in asynchronous SGD: a worker step pushes ``server_bytes[s]`` in
    ``server_msgs[s]`` messages into server ``s`` (and pulls as many out, through the
    port's other direction); ``workers`` such steps at a time through the busiest port take
    ``workers * (alpha * msgs + beta * bytes) / efficiency`` (the share of that cost the port
    delivers with that many senders, :func:`port_efficiency_for`), and every step moves all
    its servers' bytes through its own worker's link: ``sum over servers (alpha * msgs + beta * bytes)``."""
    cost = [t.alpha * m + t.beta * b for b, m in zip(server_bytes, server_msgs)]
    return max(workers * max(cost, default=0.0) / min(1.0, max(efficiency, 1e-9)), sum(cost))


def port_efficiency_for(rows: tuple[tuple[int, int, float], ...], workers: int, servers: int) -> float:
    """The busiest port's efficiency with ``workers`` asynchronous senders from the calibrated
    ``(workers, servers, efficiency)`` rows: those of ``servers`` servers (else of the most
    servers measured below it, else of the fewest), linear in the workers between the
    measured counts (and from 1.0 at one worker), the last one's beyond them; at most 1.0
    (no rows: 1.0)."""
    if not rows:
        return 1.0
    have = sorted({s for _, s, _ in rows})
    below = [s for s in have if s <= servers]
    srv = below[-1] if below else have[0]
    pts = dict(sorted((n, e) for n, s, e in rows if s == srv))
    pts.setdefault(1, 1.0)
    ns = sorted(pts)
    e = float(np.interp(workers, ns, [pts[n] for n in ns]))  # clamped to the ends
    return min(1.0, e)


def async_cpu_bound(workers: int, cores: int, worker_us: float, other_us: float, pinned: bool = False) -> float:
    """The least mean step of a worker (µs) that the host's CPU allows in asynchronous SGD:
    each worker step needs ``worker_us`` of its own process's CPU and ``other_us`` of the
    servers', ``workers`` such steps at a time on ``cores`` cores; pinned workers (core
    ``rank % cores``, the servers free) also wait for the busiest core's ``ceil(N/C)``."""
    bound = workers * (worker_us + other_us) / cores
    return max(bound, math.ceil(workers / cores) * worker_us) if pinned else bound


def _step_factors(job: Job) -> list[float]:
    """Each profiled step's duration over their mean (the lowest-rank worker): the sampled variation."""
    w = min((nt for nt in job.trace.nodes.values() if nt.info.role == "worker"), key=lambda nt: nt.info.rank)
    d = [w.steps[s][1] for s in job.steps if s in w.steps] or [1.0]
    m = float(np.mean(d))
    return [x / m for x in d] if m > 0 else [1.0]
