"""Daydream's primitives on the global DFG: a mutable copy of a job's graph.

    w = dpro.whatif.of(job)                          # the job's global DFG, as a WhatIfGraph
    w.select(lambda op: op.cat == "BW").scale(0.5)   # backward twice as fast
    w.remove(op); w.insert(before=[a], op=Op(...), after=[b])
    w.schedule(lambda op: op.layer)                  # the order a device runs its ready ops in
    w.simulate().iteration_us                        # replayed with dpro.replayer.engine

Ops are :class:`Op` records (times in µs, sizes in bytes) keyed by an id that stays valid
while other ops are added and removed. Edges are dependencies: an op starts once every
predecessor has ended and its device is free.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from dpro.gtrace.schema import CATEGORIES

if TYPE_CHECKING:
    from dpro.graph.comm_model import LinkCost
    from dpro.graph.compiled import CompiledGraph
    from dpro.replayer.engine import Schedule
    from dpro.whatif.overlap import Overlap

#: a scheduling policy: op -> priority key, lower runs first among the ops ready on a device
Policy = Callable[["Op"], float]


@dataclass
class Op:
    """One task of the graph. ``dur`` is its own time and ``gap`` the host gap charged
    before it (µs); ``device`` the queue it runs on; ``node`` the worker or server owning it."""

    name: str
    cat: str
    device: str
    dur: float
    gap: float = 0.0
    node: str = ""
    #: bytes it moves (communication ops), 0 if unknown or none
    bytes: int = 0
    #: the FIFO tie-break the replayer uses (the op's measured start offset in the step)
    prio: float = 0.0
    #: the device is a link or a communication queue
    comm_device: bool = False
    #: free-form attributes a what-if may read (e.g. "sub_op", "txn", "layer")
    attrs: dict = field(default_factory=dict)
    #: stable id in its graph (set by :meth:`WhatIfGraph.add`)
    id: int = -1


@dataclass
class WhatIfResult:
    """A simulated iteration of a (changed) graph."""

    iteration_us: float
    graph: CompiledGraph
    schedule: Schedule
    #: compiled index -> op id in the WhatIfGraph
    ids: list[int]

    def start_us(self, op: Op | int) -> float:
        return float(self.schedule.start[self.ids.index(op if isinstance(op, int) else op.id)])

    def end_us(self, op: Op | int) -> float:
        return float(self.schedule.end[self.ids.index(op if isinstance(op, int) else op.id)])


class Selection:
    """Ops chosen by :meth:`WhatIfGraph.select`; :meth:`scale` changes them in place."""

    def __init__(self, graph: WhatIfGraph, ids: list[int]) -> None:
        self.graph = graph
        self.ids = ids

    def __iter__(self):
        return (self.graph.ops[i] for i in self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def scale(self, factor: float, *, gap: bool = False) -> Selection:
        """Multiply the selected ops' own time by ``factor`` (and their host gap with
        ``gap``); ``factor`` < 1 makes them faster."""
        if not factor >= 0:
            raise ValueError(f"scale factor must be >= 0, got {factor}")
        for op in self:
            op.dur *= factor
            if gap:
                op.gap *= factor
        return self

    def set(self, **values) -> Selection:
        """Set fields of every selected op (e.g. ``device=``, ``dur=``)."""
        for op in self:
            for k, v in values.items():
                setattr(op, k, v)
        return self


class WhatIfGraph:
    """A dependency graph of :class:`Op` that the primitives change and :meth:`simulate` replays."""

    def __init__(self) -> None:
        self.ops: dict[int, Op] = {}
        self.succ: dict[int, set[int]] = {}
        self.pred: dict[int, set[int]] = {}
        self.policy: Policy | None = None
        #: the link cost the graph was built with (α µs per ring step, β µs per byte), if any
        self.link_cost: LinkCost | None = None
        #: bytes/µs of the links and ports that ops with ``attrs["links"]`` (the resources
        #: they cross) share max-min fairly in :meth:`simulate` (:mod:`dpro.whatif.fairshare`)
        self.links: dict | None = None
        #: computation and collectives slowing each other on a node (:mod:`dpro.whatif.overlap`)
        self.overlap: Overlap | None = None
        self._next = 0

    # -- building -------------------------------------------------------------------------
    def add(self, op: Op) -> Op:
        """Add ``op`` (no edges); it gets a fresh id. Returns it."""
        op.id = self._next
        self._next += 1
        self.ops[op.id] = op
        self.succ[op.id] = set()
        self.pred[op.id] = set()
        return op

    def connect(self, a: Op | int, b: Op | int) -> None:
        """Add the dependency ``a`` -> ``b``."""
        a, b = self._id(a), self._id(b)
        if a == b:
            raise ValueError("an op cannot depend on itself")
        self.succ[a].add(b)
        self.pred[b].add(a)

    def copy(self) -> WhatIfGraph:
        g = WhatIfGraph()
        g.ops = {i: replace(op, attrs=dict(op.attrs)) for i, op in self.ops.items()}
        g.succ = {i: set(s) for i, s in self.succ.items()}
        g.pred = {i: set(s) for i, s in self.pred.items()}
        g.policy, g.link_cost, g._next = self.policy, self.link_cost, self._next
        g.links = None if self.links is None else dict(self.links)
        g.overlap = self.overlap
        return g

    def _id(self, op: Op | int) -> int:
        i = op if isinstance(op, int) else op.id
        if i not in self.ops:
            raise KeyError(f"no op {i} in the graph")
        return i

    def __len__(self) -> int:
        return len(self.ops)

    def op(self, name: str) -> Op:
        """The op named ``name`` (exactly one)."""
        hit = [op for op in self.ops.values() if op.name == name]
        if len(hit) != 1:
            raise KeyError(f"{len(hit)} ops named {name!r}")
        return hit[0]

    def preds(self, op: Op | int) -> list[Op]:
        return [self.ops[i] for i in sorted(self.pred[self._id(op)])]

    def succs(self, op: Op | int) -> list[Op]:
        return [self.ops[i] for i in sorted(self.succ[self._id(op)])]

    # -- Daydream's primitives ------------------------------------------------------------
    def select(self, predicate: Callable[[Op], bool] | str) -> Selection:
        """The ops for which ``predicate(op)`` is true; a string selects by regex on the name."""
        if isinstance(predicate, str):
            rx = re.compile(predicate)
            return Selection(self, [i for i, op in self.ops.items() if rx.search(op.name)])
        return Selection(self, [i for i, op in self.ops.items() if predicate(op)])

    def insert(self, before: Iterable[Op | int], op: Op, after: Iterable[Op | int] = ()) -> Op:
        """Add ``op`` so that it starts after every op of ``before`` and every op of
        ``after`` starts after it; existing edges stay. Returns the added op."""
        before, after = [self._id(o) for o in before], [self._id(o) for o in after]
        self.add(op)
        for b in before:
            self.connect(b, op.id)
        for a in after:
            self.connect(op.id, a)
        return op

    def remove(self, op: Op | int) -> None:
        """Remove ``op``; its predecessors become predecessors of its successors (the
        dependencies through it are kept)."""
        i = self._id(op)
        ps, ss = self.pred.pop(i), self.succ.pop(i)
        for p in ps:
            self.succ[p].discard(i)
        for s in ss:
            self.pred[s].discard(i)
        for p in ps:
            for s in ss:
                self.connect(p, s)
        del self.ops[i]

    def schedule(self, policy: Policy | str | None) -> None:
        """The order each device runs its ready ops in: ``policy(op)`` gives a priority key
        (lower first) and a free device runs the ready op with the lowest key;
        ``None`` or ``"fifo"``: the replayer's order (first ready first, then the measured
        start offset)."""
        if isinstance(policy, str):
            if policy != "fifo":
                raise ValueError(f"unknown scheduling policy {policy!r} (a callable or 'fifo')")
            policy = None
        self.policy = policy

    def simulate(self) -> WhatIfResult:
        """Replay the graph: :func:`dpro.replayer.engine.simulate` for FIFO devices, the
        priority list scheduler (:mod:`dpro.whatif.priority`) under a :meth:`schedule` policy;
        with :attr:`links`, ops that cross them (``attrs["links"]``) last their own time plus
        their bytes at the max-min fair rate (:func:`dpro.whatif.fairshare.simulate_fluid`)."""
        g, ids = self.compile()
        key = None if self.policy is None else np.array([float(self.policy(self.ops[i])) for i in ids])
        flows = {} if not self.links else {
            k: self.ops[i].attrs["links"] for k, i in enumerate(ids) if self.ops[i].attrs.get("links")}
        if flows and self.overlap is not None:
            raise ValueError("a graph with both shared links and an overlap law: not modelled")
        if flows:
            from dpro.whatif.fairshare import max_min_law, simulate_fluid

            sched = simulate_fluid(g, key, {k: float(self.ops[ids[k]].bytes) for k in flows},
                                   max_min_law({k: tuple(r) for k, r in flows.items()}, self.links))
        elif self.overlap is not None:
            from dpro.whatif.fairshare import simulate_fluid

            sizes, law = self.overlap.flows(self, ids)
            sched = simulate_fluid(g, key, sizes, law, fixed={k: 0.0 for k in sizes})
        elif self.policy is None:
            from dpro.replayer.engine import simulate

            sched = simulate(g)
        else:
            from dpro.whatif.priority import simulate_priority

            sched = simulate_priority(g, key)
        return WhatIfResult(sched.makespan, g, sched, ids)

    # -- conversion -----------------------------------------------------------------------
    def compile(self) -> tuple[CompiledGraph, list[int]]:
        """The graph in the replayer's form, and the op id of each compiled index."""
        from dpro.graph.builder import GraphBuilder

        b = GraphBuilder()
        ids = sorted(self.ops)
        at = {}
        for i in ids:
            op = self.ops[i]
            d = b.add_device(op.device, owner=op.node or op.device, is_comm=op.comm_device)
            at[i] = b.add_op(op.name, dur=op.dur, gap=op.gap, cat=op.cat, device=d, prio=op.prio)
        for i in ids:
            for j in self.succ[i]:
                b.add_edge(at[i], at[j])
        return b.compile({"link_cost": self.link_cost}), ids

    @classmethod
    def from_compiled(cls, g: CompiledGraph, *, bytes_of: Callable[[str], int] | None = None,
                      attrs_of: Callable[[str], dict] | None = None) -> WhatIfGraph:
        """A WhatIfGraph of a compiled graph (e.g. a replay's global DFG)."""
        w = cls()
        w.link_cost = g.meta.get("link_cost")
        for k in range(g.n):
            d = int(g.device[k])
            name = g.names[k]
            w.add(Op(name=name, cat=CATEGORIES[int(g.cat[k])], device=g.devices[d], dur=float(g.dur[k] - g.gap[k]),
                     gap=float(g.gap[k]), node=g.owners[int(g.device_owner[d])], prio=float(g.prio[k]),
                     comm_device=bool(g.device_is_comm[d]), bytes=bytes_of(name) if bytes_of else 0,
                     attrs=attrs_of(name) if attrs_of else {}))
        src, dst = g.edges()
        for a, b in zip(src.tolist(), dst.tolist()):
            w.connect(a, b)
        return w
