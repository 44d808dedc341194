"""Horovod's timeline -> the gradient all-reduces of every rank of a recorded PyTorch job.

Horovod's collectives run on its background thread, which torch.profiler does not see: a
rank's Kineto trace shows the backward pass (each gradient's all-reduce is enqueued by a
hook at the end of its ``autograd::engine::evaluate_function:
torch::autograd::AccumulateGrad`` op) and, inside ``Optimizer.step``, one ``aten::set_``
per gradient, each right after ``synchronize()`` waited (a gap on the main thread) for
that gradient's result. Rank 0's timeline (``HOROVOD_TIMELINE``, parsed by
:mod:`dpro.importers.horovod.timeline`) says when each fused response ran. This module
adds, to every rank's NodeTrace, the COMM ops that connect the two.

**Granularity: one coarse ALLREDUCE op per fusion atom.** Horovod fuses whatever is ready
in a cycle, so fusion groups change from step to step, while a DFG must be the same in
every step. An *atom* is a largest set of gradients that Horovod never split across fusion
groups in the profiled steps (tensors with the same group in every step); each group of
every step is then a union of atoms. Atoms are ordered by Horovod's execution order and
get one op each, on device ``comm`` (Horovod's background thread, which runs one response
at a time: consecutive atoms are chained). In a step, an atom's event spans its group's
execution (``B ALLREDUCE`` .. ``E``: fusion-buffer copies + the gloo/MPI collective); atoms
fused together in that step share the interval, so the replayer's link-cost fit sees one
busy period of m collectives carrying the group's bytes, which is what fused execution is.
When grouping is stable the atoms are the fusion groups; at worst they are single tensors.

**Times.** Rank 0's timeline holds ``start_time_since_epoch_in_micros``; each rank's
Kineto trace has ``baseTimeNanoseconds``; both clocks are the Unix-epoch wall clock, so
``kineto_ts = timeline_ts + start_epoch - baseTimeNanoseconds / 1000``. Horovod's
collectives are synchronous (a response runs on every rank at once, after every rank
submitted its tensors), so rank 0's timeline gives every rank's execution interval. Same
host: the same clock, exact. Several hosts: only as good as the hosts' clock agreement
(NTP/PTP); an error shifts the communication relative to the other ranks' compute.

An atom's event on rank r starts at ``P_r + D + X``: ``P_r`` is when the atom became
possible on rank r (its gradients' producers and the previous atom ended), ``D = S - max_r
P_r`` the coordination delay (cycle wait, negotiation) between the last rank being ready
and the group's start ``S``, and ``X`` the group's *excess*: its duration beyond the
uncontended ring cost (:func:`link_envelope`, the largest ``alpha + beta * B/N`` per ring
step that no fused execution of the profiled steps undercuts). So the replayed gap before
the collective is ``D + X`` on every rank, the time an early rank waited for a late one is
not charged twice, and the replayer's link-cost fit sees the uncontended part only. The
excess is the background thread waiting for a CPU while the backward pass runs (on a
loaded 2-core host an 8 MB fused all-reduce took 13-67 ms, 25 MB 33-70 ms): it varies from
step to step and does not scale with bytes, so a link-cost fit, which follows the typical
sample, would drop most of it; as a gap it is replayed at its mean. What-if changes to
the network scale only the ring part.

**Dependencies.** Producer of a gradient: its AccumulateGrad op (the k-th such op of a step
is the k-th gradient in Horovod's order, checked against the recorded shapes per shape);
else the recorder's layer-based producer. Consumer: the gradient's ``aten::set_`` in
``synchronize()`` (in the same order); else the first main-thread op that starts after the
atom's group ended in most steps.
"""

from __future__ import annotations

import bisect
import logging
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpro.contracts.recording import RANK_META_GLOB, RAW_DIR, TIMELINE_NAME, MetaKey, rank_trace_name
from dpro.errors import DproInputError
from dpro.gtrace.schema import Event, GTrace, NodeTrace, Op
from dpro.gtrace.validate import find_cycle
from dpro.importers.horovod.timeline import FusionGroup, HorovodTimeline, load_horovod_timeline
from dpro.jsonio import read_bytes, read_json

log = logging.getLogger(__name__)

COMM_DEVICE = "comm"
OP_NAME = "horovod:allreduce"
MAIN = "cpu:main"
ACCUMULATE_GRAD_OP = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
ACCUMULATE_GRAD_INNER = "torch::autograd::AccumulateGrad"
SET_OP = "aten::set_"
STEP_END_ID = "STEP_END@cpu:main"
#: how early (µs) a consumer may start before its collective's recorded end (record jitter)
CONSUMER_TOL_US = 50.0
#: a group may end this late after a rank's step (rank 0's copy-out and timeline write lag
#: the other ranks' completion by up to ~1.5 ms on a loaded host); more suggests bad clocks
WINDOW_TOL_US = 5000.0
#: move the part of each fused execution beyond the uncontended ring cost into the host gap
SPLIT_EXCESS = True
WINDOW_TOL_FRAC = 0.02
_BASE_RE = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')


@dataclass
class Atom:
    """Gradients Horovod always reduced together in the profiled steps (one COMM op)."""

    index: int
    tensors: list[str]  # parameter names, in Horovod's order
    bytes: int

    @property
    def txn(self) -> str:
        return f"horovod.allreduce.{self.index}"

    @property
    def op_id(self) -> str:
        return f"{OP_NAME}@{COMM_DEVICE}#{self.index}"


@dataclass
class _Plan:
    """What the timeline says, independent of the ranks."""

    params: dict[str, dict]  # gradient name -> meta param
    steps: list[int]  # usable steps
    #: step -> gradient name -> its fusion group in that step
    group_of: dict[int, dict[str, FusionGroup]]
    order: list[str]  # Horovod's order of the gradients (= hook order)
    atoms: list[Atom]
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- raw traces


@dataclass
class _RawInfo:
    base_ns: int
    #: event name -> sorted [(ts, shape of first input)]
    shapes: dict[str, list[tuple[float, tuple[int, ...] | None]]]

    def shape_in(self, name: str, t0: float, t1: float) -> tuple[int, ...] | None:
        """Shape of the first ``name`` event starting in [t0, t1]."""
        evs = self.shapes.get(name, [])
        i = bisect.bisect_left(evs, (t0 - 1e-3,))
        while i < len(evs) and evs[i][0] <= t1 + 1e-3:
            if evs[i][1] is not None:
                return evs[i][1]
            i += 1
        return None


def _first_dims(args: object) -> tuple[int, ...] | None:
    dims = args.get("Input Dims") if isinstance(args, dict) else None
    if isinstance(dims, list) and dims and isinstance(dims[0], list) and all(isinstance(x, int) for x in dims[0]):
        return tuple(dims[0])
    return None


def _raw_info(path: Path) -> _RawInfo | None:
    """baseTimeNanoseconds and the shapes of AccumulateGrad / set_ events of a rank's trace."""
    try:
        d = read_json(path)
    except DproInputError as e:
        log.warning("%s", e)
        return None
    if not isinstance(d, dict) or not isinstance(d.get("baseTimeNanoseconds"), int):
        m = _BASE_RE.search(read_bytes(path)) if isinstance(d, dict) else None
        if m is None:
            return None
        d["baseTimeNanoseconds"] = int(m.group(1))
    shapes: dict[str, list] = defaultdict(list)
    for e in d.get("traceEvents") or []:
        if isinstance(e, dict) and e.get("ph") == "X" and e.get("name") in (ACCUMULATE_GRAD_INNER, SET_OP):
            try:
                shapes[e["name"]].append((float(e["ts"]), _first_dims(e.get("args"))))
            except (KeyError, TypeError, ValueError):
                continue
    for v in shapes.values():
        v.sort(key=lambda x: x[0])
    return _RawInfo(int(d["baseTimeNanoseconds"]), dict(shapes))


# ----------------------------------------------------------------------------- the plan


def _grad_names(metas: dict[int, dict]) -> dict[str, dict]:
    meta = metas[min(metas)]
    return {str(p["name"]): p for p in meta.get(MetaKey.PARAMS, []) if p.get("requires_grad", True)}


_GROUPED = re.compile(r"grouped_allreduce\.(.+)_(\d+)of(\d+)")


def _timeline_names(tl: HorovodTimeline, params: dict[str, dict]) -> dict[str, str]:
    """Timeline tensor name -> parameter name.

    ``allreduce.<name>`` (named_parameters); with ``groups=``, Horovod names the i-th of a
    group's n tensors ``grouped_allreduce.<first parameter>_<i>of<n>``: the group's members
    are taken to follow its first parameter in registration order (``groups=<int>``) or in
    reverse order (gradient-ready order, as `dpro optimize` writes groups), whichever
    names every tensor once.
    """
    out = {f"allreduce.{n}": n for n in params if f"allreduce.{n}" in tl.tensors}
    grouped = [(t, m) for t in tl.tensors if (m := _GROUPED.fullmatch(t))]
    for order in (list(params), list(reversed(params))):
        pos = {n: i for i, n in enumerate(order)}
        found: dict[str, str] = {}
        for t, m in grouped:
            first, i, n = m.group(1), int(m.group(2)), int(m.group(3))
            j = pos.get(first)
            if j is None or not 1 <= i <= n or j + n > len(order):
                break
            found[t] = order[j + i - 1]
        else:
            if len(set(found.values())) == len(found) and not set(found.values()) & set(out.values()):
                out.update(found)
                break
    return out


def plan_atoms(gt: GTrace, tl: HorovodTimeline, ref: NodeTrace, off_ref: float, params: dict[str, dict]) -> _Plan:
    """Which gradients each Horovod fusion group of the timeline carried, step by step,
    on ``ref``'s clock (``off_ref``: the timeline's offset to it); ``params``: the recorder's
    parameters. Raises :class:`TimelineUnusable` when the timeline names none of them."""
    names = _timeline_names(tl, params)
    if not names:
        raise TimelineUnusable("the timeline names none of the model's gradients (allreduce.<parameter>): "
                    "pass named_parameters=model.named_parameters() to hvd.DistributedOptimizer")
    notes: list[str] = []
    missing = sorted(set(params) - set(names.values()))
    if missing:
        notes.append(f"horovod: {len(missing)} gradient(s) never all-reduced in the timeline "
                     f"(e.g. {missing[0]}): left without a collective")
    params = {n: p for n, p in params.items() if n not in set(missing)}
    groups = [g for g in tl.fusion_groups if g.kind == "ALLREDUCE"]
    starts = [g.exec_start_us for g in groups]
    order_g = sorted(range(len(groups)), key=lambda i: starts[i])
    sorted_starts = [starts[i] for i in order_g]
    group_of: dict[int, dict[str, FusionGroup]] = {}
    orders: Counter = Counter()
    bad: list[int] = []
    others = 0
    for s in gt.manifest.steps:
        if s not in ref.steps:
            bad.append(s)
            continue
        t0, dur = ref.steps[s]
        lo, hi = t0 - off_ref, t0 + dur - off_ref
        i = bisect.bisect_left(sorted_starts, lo)
        seen: dict[str, FusionGroup] = {}
        seq: list[str] = []
        dup = False
        while i < len(sorted_starts) and sorted_starts[i] < hi:
            g = groups[order_g[i]]
            i += 1
            for op in g.ops:
                n = names.get(op.tensor)
                if n is None:
                    others += 1
                    continue
                if n in seen:
                    dup = True
                seen[n] = g
                seq.append(n)
        if dup or set(seen) != set(params):
            bad.append(s)
            continue
        group_of[s] = seen
        orders[tuple(seq)] += 1
    steps = sorted(group_of)
    if not steps:
        raise TimelineUnusable(f"no profiled step has every gradient's all-reduce in the timeline (steps {gt.manifest.steps}; "
                    "was the timeline written by this job, on this host's clock?)")
    if bad:
        notes.append(f"horovod: steps {bad} lack some gradient all-reduce in the timeline; replaying {steps}")
    if others:
        notes.append(f"horovod: {others} other Horovod operation(s) in the profiled steps are not modelled")
    order = list(orders.most_common(1)[0][0])
    pos = {n: i for i, n in enumerate(order)}
    sig: dict[tuple, list[str]] = {}
    for n in order:
        sig.setdefault(tuple(group_of[s][n].index for s in steps), []).append(n)
    members = sorted(sig.values(), key=lambda ts: pos[ts[0]])
    atoms = [Atom(k, ts, sum(int(params[n]["bytes"]) for n in ts)) for k, ts in enumerate(members)]
    return _Plan(params, steps, group_of, order, atoms, notes)


def keep_steps(gt: GTrace, steps: list[int]) -> None:
    """Drop every profiled step not in ``steps`` (manifest, events, step windows)."""
    keep = set(steps)
    if keep == set(gt.manifest.steps):
        return
    gt.manifest.steps = [s for s in gt.manifest.steps if s in keep]
    for nt in gt.nodes.values():
        nt.events = [e for e in nt.events if e.step in keep]
        nt.steps = {s: v for s, v in nt.steps.items() if s in keep}


def groups_meta(plan: "_Plan", excess: dict[int, float]) -> tuple[dict[str, list[dict]], list[dict]]:
    """What each profiled step's fusion groups were, and the atoms: for ``meta.horovod``."""
    per_step = {
        str(s): [
            {"tensors": [n for n in plan.order if plan.group_of[s][n] is g],
             "bytes": sum(int(plan.params[n]["bytes"]) for n in plan.order if plan.group_of[s][n] is g),
             "start_us": g.exec_start_us, "end_us": g.exec_end_us, "excess_us": excess.get(g.index, 0.0),
             "atoms": sorted({a.index for a in plan.atoms if plan.group_of[s][a.tensors[0]] is g})}
            for g in sorted({id(g): g for g in plan.group_of[s].values()}.values(), key=lambda g: g.exec_start_us)
        ]
        for s in plan.steps
    }
    atoms = [{"txn": a.txn, "op": a.op_id, "tensors": a.tensors, "bytes": a.bytes} for a in plan.atoms]
    return per_step, atoms


class TimelineUnusable(Exception):
    """The timeline cannot be used; the message says why."""


# ----------------------------------------------------------------------------- per rank


def _events(nt: NodeTrace) -> dict[tuple[str, int], Event]:
    return {(e.op, e.step): e for e in nt.events}


def _in_step_order(nt: NodeTrace, ev: dict, step: int, ops: list[Op]) -> list[Op]:
    """``ops`` (CPU ops) sorted by their start in ``step`` (the autograd thread may not be the main one)."""
    ops = [o for o in ops if o.device.startswith("cpu") and (o.id, step) in ev]
    return sorted(ops, key=lambda o: ev[(o.id, step)].ts)


def _map_by_order(ops: list[Op], order: list[str], shape_of_op: dict[str, tuple | None],
                  shape_of: dict[str, tuple]) -> dict[str, str] | None:
    """Gradient name -> op: the k-th op is the k-th gradient, per shape where shapes are known."""
    if len(ops) != len(order):
        return None
    if all(shape_of_op.get(o.id) is None for o in ops):
        return {n: o.id for n, o in zip(order, ops)}
    by_shape_ops: dict[tuple | None, list[str]] = defaultdict(list)
    for o in ops:
        by_shape_ops[shape_of_op.get(o.id)].append(o.id)
    by_shape_names: dict[tuple | None, list[str]] = defaultdict(list)
    for n in order:
        by_shape_names[shape_of[n]].append(n)
    if {k: len(v) for k, v in by_shape_ops.items()} != {k: len(v) for k, v in by_shape_names.items()}:
        return None
    return {n: o for k, ns in by_shape_names.items() for n, o in zip(ns, by_shape_ops[k])}


def _op_shapes(nt: NodeTrace, ops: list[Op], raw: _RawInfo | None, inner: str, step: int) -> dict[str, tuple | None]:
    if raw is None:
        return {}
    ev = _events(nt)
    out = {}
    for o in ops:
        e = ev.get((o.id, step))
        out[o.id] = raw.shape_in(inner, e.ts, e.ts + e.dur) if e is not None else None
    return out


def _fallback_producer(nt: NodeTrace, ev: dict, steps: list[int], start_of: dict[int, float]) -> str | None:
    """The last main-thread BW op that ended before the group started, in every step."""
    best = None
    for op in nt.ops.values():
        if op.device != MAIN or op.cat != "BW":
            continue
        if all((op.id, s) in ev and ev[(op.id, s)].ts + ev[(op.id, s)].dur <= start_of[s] for s in steps):
            best = op.id  # ops are in device order
    return best


def _fallback_consumer(nt: NodeTrace, ev: dict, steps: list[int], end_of: dict[int, float], after: set[str]) -> str | None:
    """The main-thread op that starts first after the group ended, voted over the steps."""
    main = [op.id for op in nt.ops.values() if op.device == MAIN and op.id not in after]
    votes: Counter = Counter()
    for s in steps:
        cands = [(ev[(o, s)].ts, o) for o in main if (o, s) in ev and ev[(o, s)].ts >= end_of[s] - CONSUMER_TOL_US]
        if cands:
            votes[min(cands)[1]] += 1
    return votes.most_common(1)[0][0] if votes else None


def _apply_rank(nt: NodeTrace, plan: _Plan, off: dict[int, float], raw: dict[int, _RawInfo | None],
                world: int, prod: dict[int, dict[str, str]], notes: list[str]) -> None:
    """Producers were chosen already (``prod``); add ops, events, edges, tensors, meta."""
    r = nt.info.rank
    ev = _events(nt)
    step0 = plan.steps[0]
    shape_of = {n: tuple(int(x) for x in plan.params[n].get("shape", [])) for n in plan.order}
    atom_of = {n: a for a in plan.atoms for n in a.tensors}
    # consumers: the set_ ops of synchronize(), in the same order
    sets = _in_step_order(nt, ev, step0, [o for o in nt.ops.values() if o.name == SET_OP and o.cat == "UPDATE"])
    cons = _map_by_order(sets, plan.order, _op_shapes(nt, sets, raw.get(r), SET_OP, step0), shape_of)
    for a in plan.atoms:
        nt.ops[a.op_id] = Op(id=a.op_id, name=OP_NAME, cat="COMM", device=COMM_DEVICE, sub_op="ALLREDUCE",
                             tensor=f"fusion{a.index}", bytes=a.bytes, txn=a.txn, group=tuple(range(world)))
    edges: set[tuple[str, str]] = set(nt.edges)
    for prev, a in zip(plan.atoms, plan.atoms[1:]):
        edges.add((prev.op_id, a.op_id))
    if plan.atoms and STEP_END_ID in nt.ops:
        edges.add((plan.atoms[-1].op_id, STEP_END_ID))
    fallback_cons = 0
    for a in plan.atoms:
        for n in a.tensors:
            p = prod[r].get(n)
            if p is not None:
                edges.add((p, a.op_id))
        if cons is not None:
            for n in a.tensors:
                edges.add((a.op_id, cons[n]))
        else:
            end_of = {s: plan.group_of[s][a.tensors[0]].exec_end_us + off[r] for s in plan.steps}
            producers = {prod[r][n] for n in a.tensors if n in prod[r]}
            c = _fallback_consumer(nt, ev, plan.steps, end_of, producers)
            if c is not None:
                edges.add((a.op_id, c))
                fallback_cons += 1
    if cons is None:
        notes.append(f"worker{r}: no aten::set_ per gradient in the optimizer step; consumers of "
                     f"{fallback_cons}/{len(plan.atoms)} collectives found by time")
    if find_cycle(sorted(edges)) is not None:
        notes.append(f"worker{r}: Horovod consumer edges would form a cycle; kept producers and order only")
        atom_ids = {a.op_id for a in plan.atoms}
        edges = {(u, v) for u, v in edges if u not in atom_ids or v in atom_ids or v == STEP_END_ID}
    nt.edges = sorted(edges)
    for t in nt.tensors:
        a = atom_of.get(t.name)
        if a is not None:
            t.txn = a.txn
            t.producer = prod[r].get(t.name, t.producer)


def _group_samples(plan: _Plan) -> list[tuple[FusionGroup, int, int]]:
    """Every fusion group of the usable steps with its atom count and bytes."""
    out = []
    for s in plan.steps:
        members: dict[int, list[Atom]] = defaultdict(list)
        by_index: dict[int, FusionGroup] = {}
        for a in plan.atoms:
            g = plan.group_of[s][a.tensors[0]]
            members[g.index].append(a)
            by_index[g.index] = g
        out += [(by_index[i], len(m), sum(a.bytes for a in m)) for i, m in members.items()]
    return out


def link_envelope(samples: list[tuple[int, int, float]], n: int) -> tuple[float, float]:
    """The largest ring cost ``alpha + beta * B/n`` per step that no sample undercuts.

    ``samples``: (atoms m, bytes B, duration T µs) of fused executions; a ring all-reduce
    of m atoms is ``2(n-1) * (m * alpha + beta * B/n)`` (what the replayer charges). Among
    alpha, beta >= 0 with every sample's cost <= T, maximise the total cost (a 2-variable
    LP): the collectives' cost when nothing slowed them down.
    """
    k = 2.0 * (n - 1)
    rows = [(k * m, k * b / n, t) for m, b, t in samples if t > 0]
    if not rows:
        return 0.0, 0.0
    a = np.array([r[0] for r in rows], dtype=float)
    b = np.array([r[1] for r in rows], dtype=float)
    t = np.array([r[2] for r in rows], dtype=float)
    oa, ob = float(a.sum()), float(b.sum())
    pos_b = b > 0
    beta_max = float((t[pos_b] / b[pos_b]).min()) if pos_b.any() else 0.0

    def alpha_at(beta: float) -> float:  # the largest feasible alpha for this beta
        return max(0.0, float(((t - b * beta) / a).min()))

    # the objective oa * alpha_at(beta) + ob * beta is concave in beta: golden-section search
    lo, hi = 0.0, beta_max
    phi = (5 ** 0.5 - 1) / 2
    f = lambda x: oa * alpha_at(x) + ob * x  # noqa: E731
    for _ in range(200):
        if hi - lo <= 1e-12 * max(1.0, beta_max):
            break
        x1, x2 = hi - phi * (hi - lo), lo + phi * (hi - lo)
        if f(x1) < f(x2):
            lo = x1
        else:
            hi = x2
    cands = [0.0, beta_max, (lo + hi) / 2]
    beta = max(cands, key=f)
    return alpha_at(beta), beta


def excess_times(plan: _Plan, world: int) -> tuple[dict[int, float], tuple[float, float]]:
    """Group index -> time beyond the uncontended ring cost (µs); and that cost (alpha, beta)."""
    if world < 2 or not SPLIT_EXCESS:
        return {}, (0.0, 0.0)
    samples = _group_samples(plan)
    alpha, beta = link_envelope([(m, b, g.exec_end_us - g.exec_start_us) for g, m, b in samples], world)
    k = 2.0 * (world - 1)
    return ({g.index: max(0.0, (g.exec_end_us - g.exec_start_us) - k * (m * alpha + beta * b / world))
             for g, m, b in samples}, (alpha, beta))


def add_atom_events(gt: GTrace, plan: _Plan, off: dict[int, float], prod: dict[int, dict[str, str]],
                excess: dict[int, float]) -> None:
    """Each atom's event per step and rank (see the module docstring: ``P_r + D + X`` .. group end)."""
    nodes = gt.workers()
    evs = {nt.info.rank: _events(nt) for nt in nodes}
    for s in plan.steps:
        first_ts: dict[tuple[int, int], float] = {}  # (group index, rank) -> event start (timeline clock)
        prev_end: float | None = None
        for a in plan.atoms:
            g = plan.group_of[s][a.tensors[0]]
            S, E = g.exec_start_us, g.exec_end_us
            ready: dict[int, float] = {}
            for nt in nodes:
                r = nt.info.rank
                ends = [evs[r][(prod[r][n], s)].ts + evs[r][(prod[r][n], s)].dur - off[r]
                        for n in a.tensors if n in prod[r] and (prod[r][n], s) in evs[r]]
                if prev_end is not None:
                    ends.append(prev_end)
                ready[r] = max(ends) if ends else S
            D = max(0.0, S - max(ready.values()))
            for nt in nodes:
                r = nt.info.rank
                key = (g.index, r)
                if key not in first_ts:
                    first_ts[key] = min(S, ready[r] + D) + excess.get(g.index, 0.0)
                ts = first_ts[key]
                nt.events.append(Event(op=a.op_id, step=s, ts=ts + off[r], dur=max(0.0, E - ts)))
            prev_end = E


def _producers(nt: NodeTrace, plan: _Plan, off: float, raw: _RawInfo | None, notes: list[str]) -> dict[str, str]:
    """Gradient name -> the op after which Horovod got it (AccumulateGrad, else layer-based)."""
    shape_of = {n: tuple(int(x) for x in plan.params[n].get("shape", [])) for n in plan.order}
    ags = _in_step_order(nt, _events(nt), plan.steps[0], [o for o in nt.ops.values() if o.name == ACCUMULATE_GRAD_OP])
    m = _map_by_order(ags, plan.order, _op_shapes(nt, ags, raw, ACCUMULATE_GRAD_INNER, plan.steps[0]), shape_of)
    if m is not None:
        return m
    ev = _events(nt)
    out = {}
    layer_based = {t.name: t.producer for t in nt.tensors if t.producer is not None}
    by_time = 0
    for a in plan.atoms:
        start_of = {s: plan.group_of[s][a.tensors[0]].exec_start_us + off for s in plan.steps}
        for n in a.tensors:
            if n in layer_based:
                out[n] = layer_based[n]
            else:
                p = _fallback_producer(nt, ev, plan.steps, start_of)
                if p is not None:
                    out[n] = p
                    by_time += 1
    notes.append(f"worker{nt.info.rank}: AccumulateGrad ops do not match the gradients one to one; producers from "
                 f"layers ({len(out) - by_time}) and timing ({by_time}) for {len(plan.order)} gradients")
    return out


# ----------------------------------------------------------------------------- entry point


def apply_horovod_timeline(gt: GTrace, timeline: Path, raw_dir: Path, metas: dict[int, dict]) -> bool:
    """Add Horovod's gradient all-reduces to every rank of ``gt`` (see the module docstring).

    Returns False (with a note in ``gt.notes``) when the timeline cannot be used.
    """
    try:
        tl = load_horovod_timeline(timeline)
    except DproInputError as e:
        gt.notes.append(f"horovod timeline not used: {e}")
        return False
    try:
        _apply(gt, tl, raw_dir, metas)
    except TimelineUnusable as e:
        gt.notes.append(f"horovod timeline not used: {timeline.name}: {e}")
        return False
    return True


def _apply(gt: GTrace, tl: HorovodTimeline, raw_dir: Path, metas: dict[int, dict]) -> None:
    if tl.start_epoch_us is None:
        raise TimelineUnusable("no start_time_since_epoch_in_micros record: cannot place it on the ranks' clocks")
    if not metas:
        raise TimelineUnusable(f"no {RANK_META_GLOB}: the gradients are unknown")
    nodes = gt.workers()
    if not nodes:
        raise TimelineUnusable("no worker traces")
    raw = {nt.info.rank: _raw_info(raw_dir / rank_trace_name(nt.info.rank)) for nt in nodes}
    off: dict[int, float] = {}
    for nt in nodes:
        info = raw[nt.info.rank]
        if info is None:
            raise TimelineUnusable(f"{rank_trace_name(nt.info.rank)} has no baseTimeNanoseconds")
        off[nt.info.rank] = tl.offset_to_kineto_us(info.base_ns)
    ref = nodes[0]
    plan = plan_atoms(gt, tl, ref, off[ref.info.rank], _grad_names(metas))
    notes = list(plan.notes)
    keep_steps(gt, plan.steps)  # only the usable steps
    prod = {nt.info.rank: _producers(nt, plan, off[nt.info.rank], raw[nt.info.rank], notes) for nt in nodes}
    world = max(gt.manifest.world_size, len(nodes))
    excess, (alpha, beta) = excess_times(plan, world)
    add_atom_events(gt, plan, off, prod, excess)
    for nt in nodes:
        _apply_rank(nt, plan, off, raw, world, prod, notes)
    check_windows(gt, plan, off, notes)
    per_step, atoms = groups_meta(plan, excess)
    for nt in nodes:
        nt.meta["horovod"] = {
            "timeline": TIMELINE_NAME,
            "timeline_rank": 0,
            "timeline_offset_us": off[nt.info.rank],
            "granularity": "fusion atom: gradients never split across fusion groups in the profiled steps",
            "atoms": atoms,
            "groups": per_step,
        }
    gt.manifest.library = "horovod"
    gt.manifest.world_size = world
    gt.manifest.meta["horovod"] = {
        "timeline": f"{RAW_DIR}/{TIMELINE_NAME}",
        "atoms": len(plan.atoms),
        "uncontended_ring_step": {"alpha_us": alpha, "beta_us_per_byte": beta},
        "groups_per_step": {str(s): len(v) for s, v in per_step.items()},
        "clock": "rank 0's timeline mapped onto each rank's Kineto clock (Unix epoch); ranks on other hosts "
                 "rely on synchronised host clocks",
    }
    gt.notes.extend(notes)


def check_windows(gt: GTrace, plan: _Plan, off: dict[int, float], notes: list[str]) -> None:
    """Every rank waits for every group of its step: a group outside a rank's step means bad clocks."""
    bad = 0
    for nt in gt.workers():
        r = nt.info.rank
        for s in plan.steps:
            t0, dur = nt.steps[s]
            tol = max(WINDOW_TOL_US, WINDOW_TOL_FRAC * dur)
            for g in {id(g): g for g in plan.group_of[s].values()}.values():
                if not (t0 - tol <= g.exec_start_us + off[r] and g.exec_end_us + off[r] <= t0 + dur + tol):
                    bad += 1
    if bad:
        notes.append(f"horovod: {bad} fusion group(s) of rank 0's timeline fall outside a rank's step window "
                     f"(by more than max({WINDOW_TOL_US / 1000:g} ms, {WINDOW_TOL_FRAC:.0%} of the step)): "
                     "are the hosts' clocks synchronised?")
