"""Turn a gTrace into the observations alignment needs (numpy arrays, ms).

Times are converted to milliseconds relative to ``t0`` (the earliest timestamp of the
trace) so that the optimisation is well scaled.  Two kinds of observation:

* **receive instances** — one per step of every fine-grained producer/consumer pair on two
  different nodes (SEND->RECV, PUSH_REQ->PUSH_RES, PULL_REQ->PULL_RES, paired by ``txn``):
  consumer node r, producer node s, consumer start a, producer start b, consumer end e;
  a *family* is (consumer node, producer node, consumer op) across steps;
* **collective instances** — one per step of every coarse all-to-all-dependent collective
  (ALLREDUCE, ALLGATHER, REDUCESCATTER, ALLTOALL, BARRIER) present on two or more nodes:
  its members' starts and ends (CSR layout); a family is the collective (``txn``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from dpro.gtrace.schema import GTrace
from dpro.gtrace.validate import PAIRS

log = logging.getLogger(__name__)

#: collectives in which no rank can finish before every rank has started
SYNC_COLLECTIVES = ("ALLREDUCE", "ALLGATHER", "REDUCESCATTER", "ALLTOALL", "BARRIER")


@dataclass
class RecvObs:
    fam: np.ndarray  # family index per instance
    r: np.ndarray  # consumer node
    s: np.ndarray  # producer node
    a: np.ndarray  # consumer start (ms)
    b: np.ndarray  # producer start (ms)
    e: np.ndarray  # consumer end (ms)
    families: list[tuple[str, str, str]] = field(default_factory=list)
    step: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def n(self) -> int:
        return int(self.fam.size)


@dataclass
class CollObs:
    fam: np.ndarray  # family (txn) index per instance
    ptr: np.ndarray  # CSR pointers into node/s/e, one row per instance
    node: np.ndarray
    s: np.ndarray
    e: np.ndarray
    families: list[str] = field(default_factory=list)
    step: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def n(self) -> int:
        return int(self.fam.size)


@dataclass
class AlignData:
    names: list[str]
    hosts: list[str]
    #: time origin (µs, on each node's own clock)
    t0: float
    recv: RecvObs
    coll: CollObs
    notes: list[str] = field(default_factory=list)


def _empty_recv() -> RecvObs:
    z = np.zeros(0)
    zi = np.zeros(0, dtype=np.int64)
    return RecvObs(zi, zi, zi, z, z, z)


def extract(gt: GTrace) -> AlignData:
    """Observations of ``gt`` for alignment (see the module docstring)."""
    names = sorted(gt.nodes, key=lambda n: (gt.nodes[n].info.role != "worker", gt.nodes[n].info.rank, n))
    index = {n: i for i, n in enumerate(names)}
    hosts = [gt.nodes[n].info.host for n in names]
    notes: list[str] = []

    # Which ops matter: fine-grained pairs and synchronising collectives.
    by_txn: dict[tuple[str, str], tuple[str, str]] = {}
    coll_members: dict[str, list[tuple[str, str]]] = defaultdict(list)
    skipped_coarse: set[str] = set()
    for name in names:
        for op in gt.nodes[name].ops.values():
            if op.cat != "COMM" or op.txn is None or op.sub_op is None:
                continue
            if op.sub_op in SYNC_COLLECTIVES:
                coll_members[op.txn].append((name, op.id))
            elif op.sub_op in PAIRS or op.sub_op in PAIRS.values():
                by_txn[(op.sub_op, op.txn)] = (name, op.id)
            elif op.sub_op not in ("IN", "OUT"):
                skipped_coarse.add(op.sub_op)
    if skipped_coarse:
        notes.append(
            f"collectives {', '.join(sorted(skipped_coarse))} do not synchronise every rank (or their "
            "peers are unknown): not used for alignment"
        )
    wanted: dict[str, set[str]] = defaultdict(set)
    pairs: list[tuple[tuple[str, str], tuple[str, str]]] = []
    for prod, cons in PAIRS.items():
        for (sub, txn), key in by_txn.items():
            if sub == prod and (cons, txn) in by_txn:
                ckey = by_txn[(cons, txn)]
                if ckey[0] != key[0]:
                    pairs.append((key, ckey))
                    wanted[key[0]].add(key[1])
                    wanted[ckey[0]].add(ckey[1])
    for txn, members in list(coll_members.items()):
        if len({n for n, _ in members}) < 2:
            del coll_members[txn]
            continue
        for n, o in members:
            wanted[n].add(o)

    # One pass over each node's events: (op, step) -> (ts, end) for the ops that matter.
    t0 = min(
        (min((e.ts for e in nt.events), default=np.inf) for nt in gt.nodes.values()),
        default=0.0,
    )
    if not np.isfinite(t0):
        t0 = 0.0
    ev: dict[str, dict[str, dict[int, tuple[float, float]]]] = {}
    for name in names:
        w = wanted.get(name)
        d: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
        if w:
            for e in gt.nodes[name].events:
                if e.op in w:
                    ts = (e.ts - t0) * 1e-3
                    d[e.op][e.step] = (ts, ts + e.dur * 1e-3)
        ev[name] = d

    recv = _recv_obs(pairs, ev, index)
    coll = _coll_obs(coll_members, ev, index)
    log.debug("alignment data: %d nodes, %d receive instances, %d collective instances", len(names), recv.n, coll.n)
    return AlignData(names, hosts, float(t0), recv, coll, notes)


def _recv_obs(pairs, ev, index) -> RecvObs:
    fam_of: dict[tuple[str, str, str], int] = {}
    rows: list[tuple[int, int, int, float, float, float, int]] = []
    for (pn, po), (cn, co) in pairs:
        pe = ev[pn].get(po, {})
        for step, (a, e) in ev[cn].get(co, {}).items():
            x = pe.get(step)
            if x is None:
                continue
            key = (cn, pn, co)
            f = fam_of.setdefault(key, len(fam_of))
            rows.append((f, index[cn], index[pn], a, x[0], e, step))
    if not rows:
        return _empty_recv()
    arr = np.array(rows, dtype=float)
    fams = [None] * len(fam_of)
    for k, v in fam_of.items():
        fams[v] = k
    ii = arr[:, :3].astype(np.int64)
    return RecvObs(ii[:, 0], ii[:, 1], ii[:, 2], arr[:, 3], arr[:, 4], arr[:, 5], fams,  # type: ignore[arg-type]
                   arr[:, 6].astype(np.int64))


def _coll_obs(coll_members, ev, index) -> CollObs:
    fams: list[str] = []
    fam, ptr, node, s, e, stp = [], [0], [], [], [], []
    for txn in sorted(coll_members):
        members = coll_members[txn]
        steps: dict[int, list[tuple[int, float, float]]] = defaultdict(list)
        for n, o in members:
            for step, (ts, end) in ev[n].get(o, {}).items():
                steps[step].append((index[n], ts, end))
        f = len(fams)
        used = False
        for step in sorted(steps):
            m = steps[step]
            if len(m) < 2:
                continue
            used = True
            m.sort()
            fam.append(f)
            stp.append(step)
            for i, ts, end in m:
                node.append(i)
                s.append(ts)
                e.append(end)
            ptr.append(len(node))
        if used:
            fams.append(txn)
    return CollObs(
        np.array(fam, dtype=np.int64), np.array(ptr, dtype=np.int64), np.array(node, dtype=np.int64),
        np.array(s, dtype=float), np.array(e, dtype=float), fams, np.array(stp, dtype=np.int64),
    )


def drop_inconsistent(data: AlignData, tol_ms: float) -> AlignData:
    """Drop the instances whose recorded times contradict a clock they share.

    Nodes of one host share a clock, so a dependency violated between two of them (a
    receive that ends before its same-host producer started, a collective rank that ends
    before a same-host rank started) is an error of the recorded events, not clock skew;
    such an instance would force every offset by the size of the error.  It is left out
    (of the constraints and the objective), with a note.
    """
    if len(set(data.hosts)) == len(data.hosts):
        return data  # no two nodes share a clock: nothing to check
    ids = {h: i for i, h in enumerate(sorted(set(data.hosts)))}
    host = np.array([ids[h] for h in data.hosts], dtype=np.int64)
    notes: list[str] = []
    rv = data.recv
    if rv.n:
        bad = (host[rv.r] == host[rv.s]) & (rv.e < rv.b - tol_ms)
        if bad.any():
            k = int(np.argmax(np.where(bad, rv.b - rv.e, -np.inf)))
            r, s, op = rv.families[rv.fam[k]]
            notes.append(
                f"inconsistent events: {int(bad.sum())} receive instance(s) end before their producer on the same "
                f"host started (up to {(rv.b - rv.e)[bad].max() * 1e3:.0f} µs, e.g. {op} on {r} from {s} in step "
                f"{rv.step[k]}), which a shared clock rules out; left out of the alignment"
            )
            keep = ~bad
            data.recv = RecvObs(rv.fam[keep], rv.r[keep], rv.s[keep], rv.a[keep], rv.b[keep], rv.e[keep],
                                rv.families, rv.step[keep])
    co = data.coll
    if co.n:
        # worst same-host violation of every instance, vectorised per member set and host
        viol = np.full(co.n, -np.inf)
        groups: dict[tuple[int, ...], list[int]] = {}
        for k in range(co.n):
            groups.setdefault(tuple(co.node[co.ptr[k] : co.ptr[k + 1]].tolist()), []).append(k)
        for members, ks in groups.items():
            idx = np.asarray(members)
            kk = np.asarray(ks)
            rows = co.ptr[kk][:, None] + np.arange(idx.size)[None, :]
            for hid in sorted(set(host[idx].tolist())):  # np.unique's order, without importing numpy.ma
                cols = np.nonzero(host[idx] == hid)[0]
                if cols.size < 2:
                    continue
                S, E = co.s[rows[:, cols]], co.e[rows[:, cols]]
                gap = S[:, None, :] - E[:, :, None]  # > 0: rank r ended before rank q started
                viol[kk] = np.maximum(viol[kk], gap.max(axis=(1, 2)))
        bad_inst = np.nonzero(viol > tol_ms)[0].tolist()
        worst = float(viol.max()) if bad_inst else 0.0
        example = int(np.argmax(viol)) if bad_inst else None
        if bad_inst:
            k = example
            names = [data.names[i] for i in co.node[co.ptr[k] : co.ptr[k + 1]]]
            notes.append(
                f"inconsistent events: in {len(bad_inst)} collective instance(s) a rank ends before a rank of the "
                f"same host started (up to {worst * 1e3:.0f} µs, e.g. {co.families[co.fam[k]]} in step {co.step[k]} on "
                f"{', '.join(names)}), which a shared clock rules out; left out of the alignment"
            )
            keep = np.ones(co.n, dtype=bool)
            keep[bad_inst] = False
            sizes = np.diff(co.ptr)
            rows = np.repeat(keep, sizes)
            data.coll = CollObs(co.fam[keep], np.r_[0, np.cumsum(sizes[keep])].astype(np.int64), co.node[rows],
                                co.s[rows], co.e[rows], co.families, co.step[keep])
    data.notes += notes
    return data
