"""Which collective the exposed communication belongs to.

A worker's exposed communication (:func:`dpro.replayer.breakdown.worker_breakdown`'s
``exposed_COMM``) is the time its communication runs while none of its compute does. Each
exposed instant is shared equally among the collectives running then on that worker's
devices and links; summed over the workers and divided by their number, the shares add up
to the breakdown's mean ``exposed_COMM``.
"""

from __future__ import annotations

import numpy as np

from dpro.graph.compiled import CAT_CODE, CompiledGraph
from dpro.graph.intervals import merge
from dpro.replayer.engine import Schedule


def collective_of(name: str) -> str:
    """The collective an op of the global DFG belongs to: a ring step
    ``allreduce.3/ring1/0->1`` -> ``allreduce.3``; a local op ``worker0/gloo:all_reduce#2:IN``
    -> ``gloo:all_reduce#2`` (the same name on every worker)."""
    if "/ring" in name:
        return name.split("/ring", 1)[0]
    op = name.split("/", 1)[-1]
    return op.rsplit(":", 1)[0] if op.endswith((":IN", ":OUT")) else op


def _exposed_per_op(c_start: np.ndarray, c_end: np.ndarray, busy: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Each comm interval's share of the time when comm runs and compute does not."""
    bs, be = busy
    pts = np.unique(np.concatenate([c_start, c_end, bs, be]))
    if len(pts) < 2:
        return np.zeros(len(c_start))
    seg = np.diff(pts)
    i0, i1 = np.searchsorted(pts, c_start), np.searchsorted(pts, c_end)
    active = np.zeros(len(pts))
    np.add.at(active, i0, 1)
    np.add.at(active, i1, -1)
    active = np.cumsum(active)[:-1]
    cover = np.zeros(len(pts))
    np.add.at(cover, np.searchsorted(pts, bs), 1)
    np.add.at(cover, np.searchsorted(pts, be), -1)
    computing = np.cumsum(cover)[:-1] > 0
    w = np.where((active > 0) & ~computing, seg / np.maximum(active, 1), 0.0)
    pre = np.concatenate([[0.0], np.cumsum(w)])
    return pre[i1] - pre[i0]


def exposed_by_collective(g: CompiledGraph, sched: Schedule, owners: list[int]) -> list[dict]:
    """``[{"collective", "exposed_us", "share"}]``, largest first: the mean per worker of the
    exposed communication each collective accounts for, and its share of the total."""
    comm_dev = g.device_is_comm[g.device]
    on_gpu = np.array([d.split("/", 1)[-1].startswith("gpu") for d in g.devices], dtype=bool)[g.device]
    start, end = np.asarray(sched.start, float), np.asarray(sched.end, float)
    owner = np.asarray(g.device_owner)[g.device]
    wanted = np.isin(owner, owners)
    comm_all = np.flatnonzero(wanted & (comm_dev | (g.cat == CAT_CODE["COMM"])) & (end > start))
    keys, cid = np.unique([collective_of(g.names[i]) for i in comm_all], return_inverse=True)
    compute_all = np.flatnonzero(wanted & ~comm_dev)
    comm_by = _split_by(owner, comm_all)
    compute_by = _split_by(owner, compute_all)
    pos_by = _split_by(owner, comm_all, positions=True)
    acc = np.zeros(len(keys))
    for o in owners:
        comm, pos = comm_by.get(o), pos_by.get(o)
        if comm is None:
            continue
        compute = compute_by.get(o, np.zeros(0, np.int64))
        if on_gpu[compute].any():
            compute = compute[on_gpu[compute]]  # on a GPU worker the host only launches: count the streams
        per = _exposed_per_op(start[comm], end[comm], merge(start[compute], end[compute]))
        acc += np.bincount(cid[pos], weights=per, minlength=len(keys))
    n = max(1, len(owners))
    total = float(acc.sum())
    rows = [{"collective": str(k), "exposed_us": float(v) / n, "share": float(v) / total if total else 0.0}
            for k, v in zip(keys, acc) if v > 0]
    return sorted(rows, key=lambda r: -r["exposed_us"])


def _split_by(owner: np.ndarray, idx: np.ndarray, positions: bool = False) -> dict[int, np.ndarray]:
    """``idx`` grouped by the owner of each op (or, with ``positions``, their positions in ``idx``)."""
    if not len(idx):
        return {}
    order = np.argsort(owner[idx], kind="stable")
    own = owner[idx][order]
    cuts = np.flatnonzero(np.diff(own)) + 1
    vals = order if positions else idx[order]
    return {int(own[c[0]]): v for c, v in zip(np.split(np.arange(len(own)), cuts), np.split(vals, cuts))}
