"""A DAG in flat arrays (CSR successors), the form the replayer runs on."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dpro.gtrace.schema import CATEGORIES

CAT_CODE = {c: i for i, c in enumerate(CATEGORIES)}


@dataclass
class CompiledGraph:
    """Ops 0..n-1 with durations, device queues and successor lists.

    ``dur`` is what the replayer charges (own time + host gap before the op);
    ``gap`` the host-gap part of it; ``prio`` breaks FIFO ties on a device (lower first,
    the op's measured start offset within the step).
    """

    names: list[str]
    dur: np.ndarray
    gap: np.ndarray
    cat: np.ndarray
    device: np.ndarray
    prio: np.ndarray
    succ_ptr: np.ndarray
    succ_idx: np.ndarray
    devices: list[str]
    #: index into ``owners`` for each device (the node that owns it, for breakdowns)
    device_owner: np.ndarray
    owners: list[str]
    #: devices that are communication links / queues (not compute)
    device_is_comm: np.ndarray
    meta: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.names)

    def indegree(self) -> np.ndarray:
        return np.bincount(self.succ_idx, minlength=self.n).astype(np.int64)

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        src = np.repeat(np.arange(self.n), np.diff(self.succ_ptr))
        return src, self.succ_idx

    def subgraph(self, keep: np.ndarray) -> tuple["CompiledGraph", np.ndarray]:
        """The graph restricted to ops where ``keep`` is True; returns it and old indices."""
        old = np.flatnonzero(keep)
        new_of = np.full(self.n, -1, dtype=np.int64)
        new_of[old] = np.arange(len(old))
        src, dst = self.edges()
        m = keep[src] & keep[dst]
        g = compile_graph(
            names=[self.names[i] for i in old],
            dur=self.dur[old], gap=self.gap[old], cat=self.cat[old], device=self.device[old], prio=self.prio[old],
            src=new_of[src[m]], dst=new_of[dst[m]],
            devices=self.devices, device_owner=self.device_owner, owners=self.owners,
            device_is_comm=self.device_is_comm, meta=dict(self.meta),
        )
        return g, old


def compile_graph(
    *,
    names: list[str],
    dur, cat, device, prio,
    src, dst,
    devices: list[str],
    device_owner,
    owners: list[str],
    device_is_comm,
    gap=None,
    meta: dict | None = None,
) -> CompiledGraph:
    """Build the CSR form from edge lists (duplicate edges are removed).

    Per op: ``names``, ``dur`` (charged µs, host gap included), ``gap`` (that gap; default
    none), ``cat`` (:data:`CAT_CODE`), ``device`` (index into ``devices``), ``prio``; edges
    ``src[i] -> dst[i]``; per device: ``device_owner`` (index into ``owners``) and
    ``device_is_comm``. :class:`dpro.graph.builder.GraphBuilder` builds these lists."""
    n = len(names)
    if gap is None:
        gap = np.zeros(n)
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if len(src):
        key = np.sort(src * n + dst)  # np.unique's result (it would import numpy.ma, ~20 ms)
        key = key[np.r_[True, key[1:] != key[:-1]]]
        src, dst = key // n, key % n
    counts = np.bincount(src, minlength=n)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return CompiledGraph(
        names=names,
        dur=np.asarray(dur, dtype=np.float64),
        gap=np.asarray(gap, dtype=np.float64),
        cat=np.asarray(cat, dtype=np.int8),
        device=np.asarray(device, dtype=np.int64),
        prio=np.asarray(prio, dtype=np.float64),
        succ_ptr=ptr,
        succ_idx=dst,  # already sorted by src thanks to np.unique on src*n+dst
        devices=devices,
        device_owner=np.asarray(device_owner, dtype=np.int64),
        owners=owners,
        device_is_comm=np.asarray(device_is_comm, dtype=bool),
        meta=meta or {},
    )
