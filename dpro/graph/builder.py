"""Build a :class:`~dpro.graph.compiled.CompiledGraph` op by op.

One builder for every graph dpro replays: the global DFG of a trace
(:mod:`dpro.graph.global_dfg`) and the optimizer's one-worker graph of a strategy
(:mod:`dpro.optimizer.worker_graph`).
"""

from __future__ import annotations

from dpro.graph.compiled import CAT_CODE, CompiledGraph, compile_graph


class GraphBuilder:
    """Accumulates devices, ops and edges, then compiles them (:meth:`compile`)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        #: what the replayer charges: own time + host gap
        self.dur: list[float] = []
        self.gap: list[float] = []
        self.cat: list[int] = []
        self.device: list[int] = []
        self.prio: list[float] = []
        self.src: list[int] = []
        self.dst: list[int] = []
        self.devices: list[str] = []
        self.dev_index: dict[str, int] = {}
        self.device_owner: list[int] = []
        self.device_is_comm: list[bool] = []
        self.owners: list[str] = []
        self.owner_index: dict[str, int] = {}

    @property
    def n(self) -> int:
        return len(self.names)

    def add_device(self, name: str, *, owner: str, is_comm: bool) -> int:
        """The index of device ``name``, added (owned by node ``owner``) on first use."""
        d = self.dev_index.get(name)
        if d is None:
            if owner not in self.owner_index:
                self.owner_index[owner] = len(self.owners)
                self.owners.append(owner)
            d = self.dev_index[name] = len(self.devices)
            self.devices.append(name)
            self.device_owner.append(self.owner_index[owner])
            self.device_is_comm.append(is_comm)
        return d

    def add_op(self, name: str, *, dur: float, gap: float = 0.0, cat: str, device: int, prio: float) -> int:
        """Add an op of own time ``dur`` after a host gap ``gap`` (µs) on ``device``; its index."""
        self.names.append(name)
        self.dur.append(dur + gap)
        self.gap.append(gap)
        self.cat.append(CAT_CODE[cat])
        self.device.append(device)
        self.prio.append(prio)
        return len(self.names) - 1

    def add_ops(self, names: list[str], dur: list[float], gap: list[float], cat: list[int], device: list[int],
                prio: list[float]) -> None:
        """:meth:`add_op` for many ops at once (``cat`` as codes, :data:`CAT_CODE`): the
        global DFG adds a trace's ops this way (one call per op was ~10 % of a replay)."""
        self.names.extend(names)
        self.dur.extend([d + g for d, g in zip(dur, gap)])
        self.gap.extend(gap)
        self.cat.extend(cat)
        self.device.extend(device)
        self.prio.extend(prio)

    def copy_op(self, i: int, *, name: str, prio: float) -> int:
        """Add a copy of op ``i`` (same time, category and device) named ``name``; its index."""
        self.names.append(name)
        for lst in (self.dur, self.gap, self.cat, self.device):
            lst.append(lst[i])
        self.prio.append(prio)
        return len(self.names) - 1

    def add_edge(self, src: int, dst: int) -> None:
        self.src.append(src)
        self.dst.append(dst)

    def compile(self, meta: dict | None = None) -> CompiledGraph:
        return compile_graph(
            names=self.names, dur=self.dur, gap=self.gap, cat=self.cat, device=self.device, prio=self.prio,
            src=self.src, dst=self.dst, devices=self.devices, device_owner=self.device_owner, owners=self.owners,
            device_is_comm=self.device_is_comm, meta=meta,
        )
