"""The job as the optimizer sees it: one representative worker and its gradient units.

Workers of a data-parallel job run the same graph, so the optimizer keeps **one worker**
(the paper's *symmetry*; which one: :func:`job_model`'s ``worker``): every computation
op of that worker with its mean own time + host gap over the typical steps
(:mod:`dpro.graph.stats`), the local edges between
computation ops, and the **gradient units** that are synchronised: one per gradient
tensor when the profiler recorded them (dpro's Recorder), else one per recorded
collective (imported traces). A unit knows its bytes, the ops that must end before it
can be sent (``ready``) and the ops that wait for it (``consumers``). How units are
grouped, partitioned and which computation ops are fused is a
:class:`~dpro.optimizer.strategy.Strategy`; :mod:`dpro.optimizer.worker_graph` turns model +
strategy into a graph and :mod:`dpro.optimizer.evaluate` replays it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from dpro.errors import DproInputError
from dpro.graph.comm_model import LinkCost, ring_steps
from dpro.graph.global_dfg import ACCELERATORS
from dpro.graph.intervals import overlap, union_length
from dpro.graph.overhead import Overhead, measured_overhead, scale_overhead
from dpro.graph.stats import OpStats, node_stats, typical_steps
from dpro.gtrace.schema import GTrace, NodeTrace
from dpro.optimizer import horovod
from dpro.optimizer.libraries import MXNET_DEFAULT_BOUND
from dpro.optimizer.ps.costs import fit_server_link, fit_update
from dpro.optimizer.ps.layout import PsLayout
from dpro.optimizer.ps.layout import base_name as ps_base
from dpro.optimizer.ps.layout import layout as ps_layout
from dpro.optimizer.ps.layout import server_of as ps_server_of
from dpro.replayer.cpu_contention import CpuShare, host_cpus, measured_share

log = logging.getLogger(__name__)


@dataclass(slots=True)
class CompOp:
    """A computation op of the representative worker."""

    id: str
    name: str
    cat: str
    device: str
    dur: float  #: own time, µs
    gap: float  #: host gap before it, µs (removed when the op is fused into its predecessor)
    prio: float  #: start offset in the step (FIFO tie-break)
    layer: str | None = None


@dataclass(slots=True)
class Unit:
    """A gradient (or, for imported traces, a recorded collective) to synchronise."""

    name: str
    bytes: int
    ready: list[str]
    consumers: list[str]
    #: the parameter names it carries (for strategy files); empty when unknown
    params: list[str] = field(default_factory=list)


@dataclass
class JobModel:
    """What the optimizer needs of a profiled job (see the module docstring)."""

    ops: dict[str, CompOp]
    edges: list[tuple[str, str]]
    #: in the order the job produced them (the baseline groups' launch order)
    units: list[Unit]
    #: the job's own grouping: unit indices per collective, in launch order
    baseline_groups: list[list[int]]
    world_size: int
    scheme: str
    library: str
    framework: str
    link: LinkCost
    #: host time to launch one collective, µs
    launch_us: float = 0.0
    servers: int = 0
    measured_us: float | None = None
    notes: list[str] = field(default_factory=list)
    #: the profiling overhead the recorder measured (taken out of the ops), if any
    overhead: Overhead | None = None
    #: the worker that stands for all (see job_model)
    worker: str = ""
    #: every worker's computation per step (own time + host gaps, µs), by name
    loads: dict[str, float] = field(default_factory=dict)
    #: CPU contention between computation and collectives (dpro.replayer.cpu_contention), if measured
    cpu: CpuShare | None = None
    #: the representative worker's memory record (``meta["memory"]``, docs/memory.md), if any
    memory: dict | None = None
    #: module -> {"eager_us", "compiled_us"} measured by the recorder (``--measure-compile``)
    compile: dict[str, dict] | None = None
    #: (batch fraction r, op -> own time µs at r) from a trace at a smaller batch
    #: (:func:`dpro.optimizer.memory.micro_batch.attach_micro_trace`), for gradient accumulation
    micro: tuple[float, dict[str, float]] | None = None
    #: parameter server: keys, sizes, home servers, update cost (dpro.optimizer.ps.layout)
    ps: PsLayout | None = None
    #: pieces per baseline group as profiled (None: 1 each)
    baseline_partitions: list[int] | None = None
    #: Horovod job profiled with Horovod's default fusion (no fusion setting, no explicit
    #: groups): its own grouping is what the defaults do in it (dpro.optimizer.optimize)
    horovod_defaults_profiled: bool = False
    #: cache: per op, the bit set of its ancestors (see worker_graph._ancestors)
    ancestors: dict[str, int] | None = field(default=None, repr=False)
    #: cache: (bytes, pieces) -> sync time, µs (see evaluate.sync_time)
    sync_cache: dict[tuple[int, int], float] = field(default_factory=dict, repr=False)

    @cached_property
    def op_index(self) -> dict[str, int]:
        return {o: i for i, o in enumerate(self.ops)}

    def ring_us(self, nbytes: int) -> float:
        """One ring all-reduce of ``nbytes`` alone on the fitted link (µs)."""
        n = max(2, self.world_size)
        return ring_steps(n) * self.link.step_us(nbytes / n)

    def topo_order(self) -> list[str]:
        """Computation ops in a topological order of ``edges``."""
        indeg = {o: 0 for o in self.ops}
        outs: dict[str, list[str]] = defaultdict(list)
        for a, b in self.edges:
            outs[a].append(b)
            indeg[b] += 1
        order = [o for o, d in indeg.items() if d == 0]
        for o in order:
            for b in outs[o]:
                indeg[b] -= 1
                if indeg[b] == 0:
                    order.append(b)
        return order


def job_model(gt: GTrace, link: LinkCost | None, steps: list[int] | None = None, *,
              remove_overhead: bool = True, worker: str | None = None,
              stats: dict[str, dict[str, OpStats]] | None = None) -> JobModel:
    """Extract the optimizer's model from a (clock-aligned) gTrace.

    ``link`` is the fitted per-ring-step cost (from the replay's build); without one the
    synchronisation cannot be modelled and the trace is refused. ``remove_overhead``:
    where the recorder measured its own overhead (:mod:`dpro.graph.overhead`), take it
    out of the host-side ops, so that predictions are of the job as it runs unprofiled.
    ``worker`` names the worker that stands for all (default: the slowest;
    :func:`dpro.optimizer.optimize.optimize` picks by agreement with the full replay).
    ``stats``: the workers' op statistics over ``steps`` (``{node name: node_stats(nt,
    steps)}``), where the caller has them (they are not changed); computed here otherwise.
    """
    where = gt.source or gt.manifest.meta.get("source") or "<trace>"
    ps = gt.manifest.scheme == "ps"
    if ps and gt.manifest.framework != "mxnet":
        raise DproInputError(where, f"parameter-server traces of {gt.manifest.library} replay (dpro replay) but "
                                    "cannot be optimized yet: only MXNet kvstore jobs can (docs/optimizer.md)")
    workers = gt.workers()
    if not workers:
        raise DproInputError(where, "has no worker node to optimize")
    steps = steps or typical_steps(list(gt.nodes.values()), gt.manifest.steps)
    if ps:
        link = fit_server_link(gt, steps)
        if link is None:
            raise DproInputError(where, "no server link cost could be fitted: the optimizer needs the servers' "
                                        "answers to pulls (PULL_REQ ops with their bytes)")
    if link is None:
        if not any(op.cat == "COMM" for nt in workers for op in nt.ops.values()):
            raise DproInputError(where, f"no collective in the trace ({len(workers)} worker(s)): the optimizer "
                                        "models a data-parallel job's communication and needs one; for a "
                                        "one-worker profile ask `dpro whatif PATH --workers N --platform FILE` "
                                        "(dpro calibrate) what more workers would do")
        raise DproInputError(where, "no link cost could be fitted: the optimizer needs at least one collective "
                                    "with its size recorded on every rank of its group")
    if gt.manifest.library == "horovod":
        link = horovod.link_cost(workers[0], gt.manifest.world_size, steps, link)
    if stats is None:
        per_rank = [node_stats(nt, steps) for nt in workers]
    else:
        key = {id(nt): name for name, nt in gt.nodes.items()}
        per_rank = [stats[key[id(nt)]] for nt in workers]
    # By default the slowest worker stands for all: a synchronous job runs at its straggler's pace.
    load = [sum(s.dur + s.gap for o, s in st.items() if nt.ops[o].cat != "COMM") for nt, st in zip(workers, per_rank)]
    names = [w.info.name for w in workers]
    r = names.index(worker) if worker in names else int(np.argmax(load))
    rep, st0 = workers[r], per_rank[r]
    notes = []
    if len(load) > 1 and min(load) > 0 and max(load) / min(load) > 1.1:
        who = "the slowest, " if r == int(np.argmax(load)) else ""
        notes.append(f"workers are imbalanced (computation {min(load) / 1e3:.1f}-{max(load) / 1e3:.1f} ms): "
                     f"{who}{rep.info.name} ({load[r] / 1e3:.1f} ms) stands for all")
    ops: dict[str, CompOp] = {}
    for op in rep.ops.values():
        if op.cat == "COMM":
            continue
        s = st0.get(op.id)
        if s is None or not s.samples:
            ops[op.id] = CompOp(op.id, op.name, op.cat, op.device, 0.0, 0.0, 0.0, op.layer)
        else:
            ops[op.id] = CompOp(op.id, op.name, op.cat, op.device, s.dur, s.gap, s.offset, op.layer)
    cpu, cnotes = None, []
    if not ps:  # a PS job's link is the servers' (fitted on them), not the worker's
        cpu, link, cnotes = _contention(gt, rep, st0, steps, ops, link)
    notes += cnotes
    overhead = measured_overhead(rep) if remove_overhead else None
    if overhead is not None:
        notes += remove_host_overhead(overhead, ops)

    comm = [op for op in rep.ops.values() if op.cat == "COMM"]
    preds: dict[str, list[str]] = defaultdict(list)
    succs: dict[str, list[str]] = defaultdict(list)
    for a, b in rep.edges:
        preds[b].append(a)
        succs[a].append(b)
    edges = [(a, b) for a, b in rep.edges if a in ops and b in ops]
    comm.sort(key=lambda o: (st0[o.id].offset if o.id in st0 else 0.0, o.id))
    # a PS worker launches pushes; its pulls wait on the servers, not on the host
    # (a Horovod collective's recorded gap also holds its excess over the uncontended ring
    # cost, which the optimizer's link fit already charges to its duration: horovod.link_cost)
    excess = horovod.excess_by_atom(rep, steps) if gt.manifest.library == "horovod" else {}
    launch = [max(0.0, st0[o.id].gap - excess.get(o.id, 0.0))
              for o in comm if o.id in st0 and st0[o.id].samples and (not ps or o.sub_op == "PUSH_REQ")]

    servers = sum(1 for n in gt.nodes.values() if n.info.role == "server")
    layout = partitions = None
    if ps:
        units, groups, partitions, layout, pnotes = _ps_units(gt, rep, st0, ops, preds, succs, servers, steps)
        notes += pnotes
        if "bulking off" in str(rep.meta.get("window_changes_job") or ""):
            notes.append("the window ran with MXNet's op bulking off (`dpro profile --mxnet-unbulk`), which changes "
                         "when pushes leave: for the key split, profile without it (bulking kept, the default; "
                         "docs/optimizer.md)")
    else:
        units, groups = _collective_units(rep, comm, ops, preds, succs)
        if gt.manifest.library == "horovod":
            groups = horovod.step_grouping(rep, [u.name for u in units], steps) or groups
    if not units:
        raise DproInputError(where, "has no gradient synchronisation (no ALLREDUCE/PUSH op) to optimize")
    return JobModel(
        ops=ops, edges=edges, units=units, baseline_groups=groups,
        world_size=max(gt.manifest.world_size, len(workers)), scheme=gt.manifest.scheme,
        library=gt.manifest.library, framework=gt.manifest.framework, link=link,
        launch_us=float(np.mean(launch)) if launch else 0.0, servers=servers,
        notes=notes, overhead=overhead, memory=rep.meta.get("memory") if isinstance(rep.meta.get("memory"), dict) else None,
        compile=_compile_facts([w.meta.get("compile") for w in workers]), cpu=cpu, worker=rep.info.name,
        loads=dict(zip(names, load)), ps=layout, baseline_partitions=partitions,
        horovod_defaults_profiled=gt.manifest.library == "horovod" and horovod.ran_defaults(rep),
    )


def _collective_units(rep: NodeTrace, comm: list, ops: dict[str, CompOp], preds: dict[str, list[str]],
                      succs: dict[str, list[str]]) -> tuple[list[Unit], list[list[int]]]:
    """A collective job's gradients (one unit per recorded tensor, or per collective where the
    tensors are unknown) and the job's own grouping, in launch order."""
    tensors_by_txn: dict[str, list] = defaultdict(list)
    for t in rep.tensors:
        if t.txn is not None:
            tensors_by_txn[t.txn].append(t)
    units: list[Unit] = []
    groups: list[list[int]] = []
    for c in comm:
        if c.sub_op not in ("ALLREDUCE", "PUSH_REQ"):
            continue
        ready = [p for p in preds[c.id] if p in ops]
        consumers = [s for s in succs[c.id] if s in ops]
        tens = tensors_by_txn.get(c.txn or "", [])
        members = []
        if tens:
            # A gradient whose producing op is unknown (a parameter used outside any leaf
            # module, e.g. through a functional call) is taken as ready when its bucket was.
            order = {p: i for i, p in enumerate(_bucket_params(rep, c.tensor))}
            for t in sorted(tens, key=lambda t: order.get(t.name, len(order))):
                members.append(len(units))
                units.append(Unit(t.name, t.bytes, [t.producer] if t.producer in ops else list(ready),
                                  list(consumers), [t.name]))
        else:
            members.append(len(units))
            units.append(Unit(c.tensor or c.id, c.bytes, ready, consumers))
        groups.append(members)
    return units, groups


def _ps_units(gt: GTrace, rep: NodeTrace, st: dict, ops: dict[str, CompOp], preds: dict[str, list[str]],
              succs: dict[str, list[str]], servers: int, steps: list[int]
              ) -> tuple[list[Unit], list[list[int]], list[int], PsLayout, list[str]]:
    """A parameter-server worker's gradients: one unit per key (all its pieces), in the order
    their first push started; each alone in its group (MXNet pushes every key apart), with
    as many pieces as servers the profile sent it to."""
    tensors = {t.name: t for t in rep.tensors}
    push: dict[str, list] = defaultdict(list)
    pull: dict[str, list] = defaultdict(list)
    for o in rep.ops.values():
        if o.sub_op in ("PUSH_REQ", "PULL_RES"):
            (push if o.sub_op == "PUSH_REQ" else pull)[ps_base(o.tensor or o.id)].append(o)
    first = {k: min(st[o.id].offset if o.id in st else 0.0 for o in v) for k, v in push.items()}
    names = sorted(push, key=lambda k: (first[k], k))
    units: list[Unit] = []
    shapes, seen = [], []
    for name in names:
        t = tensors.get(name)
        ready = [t.producer] if t is not None and t.producer in ops else \
            sorted({p for o in push[name] for p in preds[o.id] if p in ops})
        consumers = sorted({c for o in pull[name] for c in succs[o.id] if c in ops})
        nbytes = t.bytes if t is not None else sum(o.bytes for o in push[name])
        units.append(Unit(name, nbytes, ready, consumers, [name]))
        shapes.append(tuple(t.shape) if t is not None else ())
        seen.append(sorted({s for o in push[name] if (s := ps_server_of(o.id)) is not None}))
    bound = int(gt.manifest.meta.get("bigarray_bound") or MXNET_DEFAULT_BOUND)
    lay, notes = ps_layout(rep, names, [u.bytes for u in units], shapes, seen, servers, bound)
    lay.update_alpha, lay.update_beta = fit_update(gt, steps)
    return units, [[i] for i in range(len(units))], [max(1, len(s)) for s in seen], lay, notes


def _compile_facts(per_rank: list[object]) -> dict[str, dict] | None:
    """The recorder's torch.compile measurements, kept where both times are positive
    numbers; per module, the median over the ranks that measured it (one rank's
    compiled / eager ratio of the same model varied 1.17–1.37 between runs here)."""
    times: dict[str, list[tuple[float, float]]] = {}
    cls: dict[str, object] = {}
    for d in per_rank:
        for k, v in (d.items() if isinstance(d, dict) else ()):
            if isinstance(v, dict) and all(isinstance(v.get(x), (int, float)) and v[x] > 0
                                           for x in ("eager_us", "compiled_us")):
                times.setdefault(str(k), []).append((float(v["eager_us"]), float(v["compiled_us"])))
                cls.setdefault(str(k), v.get("class"))
    return {k: {"class": cls[k], "eager_us": float(np.median([e for e, _ in t])),
                "compiled_us": float(np.median([c for _, c in t])), "ranks": len(t)}
            for k, t in times.items()} or None


def _bucket_params(nt: NodeTrace, tensor: str | None) -> list[str]:
    """Parameter order inside a DDP bucket (op tensor ``bucket<i>``) as recorded."""
    for b in nt.meta.get("buckets", []) or []:
        if tensor == f"bucket{b.get('index')}":
            return list(b.get("params", []))
    return []


def _contention(gt: GTrace, rep: NodeTrace, st: dict, steps: list[int], ops: dict[str, CompOp],
                link: LinkCost) -> tuple[CpuShare | None, LinkCost, list[str]]:
    """The rank's CPU share (dpro.replayer.cpu_contention) and, where its collectives took CPU
    from its computation, the ops' own times and the link cost without that contention.

    Per typical step, each host op's overlap with the collectives (and each collective's
    with the host ops) is measured on the trace; the median over steps is taken off as
    ``loss x overlap``. ``ops`` is changed in place; returns (share, link, notes)."""
    if any(o.device.startswith(ACCELERATORS) for o in rep.ops.values()):
        return None, link, []
    if gt.manifest.library == "horovod":
        # Horovod's background thread negotiates every cycle whether or not a collective
        # runs: the CPU beside the training thread is not the collectives' (docs/optimizer.md)
        return None, link, []
    host = sorted(o for o in ops if ops[o].device.startswith("cpu") and o in st and st[o].samples)
    comm = sorted(o.id for o in rep.ops.values() if o.cat == "COMM" and o.id in st and st[o.id].samples)
    steps = [s for s in steps if all(s in st[o].samples for o in comm)]
    if not host or not comm or not steps:
        return None, link, []

    def spans(ids: list[str], s: int) -> tuple[np.ndarray, np.ndarray]:
        rows = [st[o].samples.get(s, (np.nan, np.nan, 0.0)) for o in ids]
        return np.array([r[0] for r in rows], float), np.array([r[1] for r in rows], float)

    per_step = [(spans(host, s), spans(comm, s)) for s in steps]
    busy = float(np.median([union_length(cs[~np.isnan(cs)], ce[~np.isnan(cs)]) for _, (cs, ce) in per_step]))
    mates = [w for w in gt.workers() if w.info.host == rep.info.host]
    share = measured_share(rep.meta, len(mates), busy, host_cpus([w.meta for w in mates]))
    if share is None or share.loss <= 0:
        return share, link, []
    o_host, o_comm = [], []
    for (hs, he), (cs, ce) in per_step:
        ok_h, ok_c = ~np.isnan(hs), ~np.isnan(cs)
        oh = np.full(len(hs), np.nan)
        oh[ok_h] = overlap(hs[ok_h], he[ok_h], cs[ok_c], ce[ok_c])
        o_host.append(oh)
        o_comm.append(overlap(cs, ce, hs[ok_h], he[ok_h]))
    oh = np.nan_to_num(np.nanmedian(np.array(o_host), axis=0))
    oc = np.median(np.array(o_comm), axis=0)
    for o, x in zip(host, oh):
        ops[o].dur = max(0.0, ops[o].dur - share.loss * x)
    measured = sum(st[o].dur for o in comm)
    r = max(0.0, measured - share.loss * float(oc.sum())) / measured if measured > 0 else 1.0
    link = LinkCost(link.alpha * r, link.beta * r, link.samples, link.fit_error, link.shapes)
    return share, link, [
        f"CPU contention: collectives keep {share.kappa:.2f} cores busy on a rank with {share.cores:.2g}; "
        f"computation and communication slowed {100 * share.loss:.0f}% while overlapped "
        f"({float(oh.sum()) / 1e3:.2f} ms of host ops and {float(oc.sum()) / 1e3:.2f} ms of collectives taken "
        f"back per step)"]


def remove_host_overhead(ov: Overhead, ops: dict[str, CompOp]) -> list[str]:
    """Scale the host-side ops' gaps and own times by the recorder's unprofiled/profiled
    step ratio (dpro.graph.overhead.scale_overhead). Returns a note (nothing when
    nothing changed)."""
    host = [o for o in ops.values() if o.device.startswith("cpu")]
    r = scale_overhead(ov, host)
    if r == 1.0:
        return []
    return [f"profiling overhead {ov.pct:+.1f}% measured by the recorder ({ov.unprofiled_us / 1e3:.2f} ms per step "
            f"unprofiled): {len(host)} host-side ops scaled by {r:.3f}"]
