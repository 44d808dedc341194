"""Traces of dpro's NCCL profiler plugin (``native/nccl_patch``) -> fine-grained gTrace ops.

The plugin writes one JSON-lines file per rank (format: ``native/nccl_patch/README.md``):
every collective NCCL ran on each communicator (sequence number, size, algorithm,
protocol, channels), every proxy send/receive op per channel, and every network step
(chunk) of those ops with its size and timestamps (CLOCK_REALTIME, ns).  This module

* reads them (:func:`read_plugin_file`, :func:`read_plugin_dir`);
* turns one collective, seen on all ranks, into chunk ops (:func:`collective_chunks`):
  a ``SEND`` per network step on the sender and a ``RECV`` per step on the receiver with
  the same transaction id, ``<collective txn>/c<channel>/<src>><dst>/s<step>`` (``#<k>``
  appended for the k-th (k>0) op between the same two ranks on one channel), so rank
  r's send of step i on channel c pairs with rank p's receive of step i on channel c
  from r.  NCCL numbers the steps of a proxy op from 0 on both sides, so this pairs
  exactly, for rings, trees and anything else that goes through the proxy;
* replaces, in a gTrace imported from Kineto, each rank's coarse NCCL collective by
  ``IN`` -> chunk ops -> ``OUT`` with the measured chunk times
  (:func:`replace_collectives`), so that the replayer uses them instead of its
  alpha + beta * bytes ring expansion.

Linkage, plugin collective <-> framework collective (per rank, on one communicator,
by default the one spanning the whole job): the gTrace numbers the collectives of a
step ``<coll>.<k>`` in issue order; the plugin knows NCCL's per-communicator,
per-function sequence number, which is the same on every rank for one collective.
Step ``s``'s collectives of function f, in order, are the plugin's collectives of f
assigned to step ``s``, in sequence-number order, where a plugin collective belongs to

1. the step whose ``dpro_nccl_trace_mark_step(s)`` (called by the training loop at the
   start of step s) last precedes its enqueue time, when the file has step marks; else
2. the step whose window on the node's clock holds its enqueue time, given
   ``time_offset_us`` (plugin µs + offset = the node's clock; for Kineto traces
   ``-baseTimeNanoseconds / 1000``, see :func:`kineto_time_offsets`); else
3. ``seq_base``: the sequence number of f's first collective in the first profiled step,
   the steps being consecutive with the same collectives each.

Counts must agree per step, and the sequence numbers linked to one (txn, step) must be
equal on all ranks; anything that does not fit keeps the coarse op (with a note).

Chunk times on the node's clock: plugin time + ``time_offset_us`` when given, else an
offset estimated per rank as the median, over linked collectives, of (kernel end - end of
the last received chunk), i.e. assuming the NCCL kernel ends right after consuming the
last chunk it receives (its last sends may complete on the network after it ended).

What a chunk op's event is (so that dpro.graph.stats charges the right time):
``SEND`` runs from the moment the proxy posts the step to the network (``SendWait``)
to its completion; ``RECV`` from the data's arrival (``RecvFlushWait``) to its being
visible to the GPU (``RecvGPUWait``).  The time before a SEND (waiting for the GPU to
produce the chunk, i.e. the reduction of the chunk just received) is its host gap.

Local dependencies inside a replaced collective on one rank: IN -> first chunk op of each
(channel, direction, peer) queue; the steps of a queue in order; the last -> OUT; and the
data dependencies NCCL's algorithms imply, where both ends are network steps of this rank:

* RING AllReduce / AllGather / ReduceScatter: send i <- recv i - S unless step i starts a
  ring loop's first ring step (own data): S = network steps per ring step = 2 for the
  SIMPLE protocol (NCCL's chunkSteps / sliceSteps), 1 for LL / LL128; a loop has
  2(N-1) ring steps (AllReduce) or N-1 (AllGather, ReduceScatter);
* RING Broadcast / Reduce (a pipeline): send i <- recv i;
* TREE: per channel, a peer is this rank's parent when this rank's send of step 0 to it
  starts before its receive of step 0 from it arrives (up the tree first, then down);
  send to the parent i <- recv from each child i; send to a child i <- recv from the
  parent i, or at the root <- recv from each child i;
* anything else (NVLS, CollNet, PAT, a ring whose other hop on this rank is intra-node and
  so invisible to the proxy): queue order only.
"""

from __future__ import annotations

import bisect
import re
import statistics
from collections import defaultdict
from fractions import Fraction
from dataclasses import dataclass, field, replace
from pathlib import Path

import orjson

from dpro.errors import DproInputError
from dpro.gtrace.schema import Event, GTrace, NodeTrace, Op
from dpro.jsonio import read_bytes

FORMAT_NAME = "dpro-nccl-trace"
FORMAT_VERSION = 1

#: gTrace coarse sub-op -> NCCL function name (what the plugin records)
NCCL_FUNC = {
    "ALLREDUCE": "AllReduce",
    "ALLGATHER": "AllGather",
    "REDUCESCATTER": "ReduceScatter",
    "BROADCAST": "Broadcast",
}

DTYPE_BYTES = {
    "ncclInt8": 1, "ncclUint8": 1, "ncclFloat8e4m3": 1, "ncclFloat8e5m2": 1,
    "ncclFloat16": 2, "ncclBfloat16": 2,
    "ncclInt32": 4, "ncclUint32": 4, "ncclFloat32": 4,
    "ncclInt64": 8, "ncclUint64": 8, "ncclFloat64": 8,
}


# --------------------------------------------------------------------------- records


@dataclass(slots=True)
class Step:
    """One network step (chunk) of a proxy op; times in ns since the epoch (None: not seen).

    Send: ``t0`` buffer posted, ``s1`` waiting for the GPU, ``s2`` data ready (waiting for
    the receiver's credit), ``s3`` posted to the network, ``t1`` completed.
    Receive: ``t0`` started, ``s1`` receive posted, ``s2`` data arrived, ``s3`` visible to
    the GPU, ``t1`` consumed by the GPU.
    """

    index: int
    bytes: int
    t0: int | None
    s1: int | None
    s2: int | None
    s3: int | None
    t1: int | None
    open: bool = False

    def span(self, is_send: bool) -> tuple[int, int] | None:
        """(start, end) ns of the step as a chunk op (see the module doc), or None."""
        if is_send:
            start = self.s3 if self.s3 is not None else self.s2 if self.s2 is not None else self.t0
            end = self.t1
        else:
            start = self.s2 if self.s2 is not None else self.t1
            end = self.s3 if self.s3 is not None else start
        if start is None or end is None:
            return None
        return start, max(start, end)


@dataclass(slots=True)
class ProxyOp:
    """A channel's network sends to (or receives from) one peer for one collective."""

    id: int
    coll: int
    channel: int
    peer: int
    is_send: bool
    nsteps: int
    chunk: int
    remote: bool
    t0: int | None
    t1: int | None
    open: bool = False
    steps: dict[int, Step] = field(default_factory=dict)


@dataclass(slots=True)
class Coll:
    """A collective (or, with ``p2p``, a send/recv) as NCCL enqueued it on one rank."""

    id: int
    seq: int
    func: str
    count: int
    dtype: str
    root: int
    algo: str
    proto: str
    nch: int
    rank: int
    t0: int | None
    t1: int | None
    p2p: bool = False
    open: bool = False
    ops: list[ProxyOp] = field(default_factory=list)
    kernel_channels: list[dict] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return self.count * DTYPE_BYTES.get(self.dtype, 0)


@dataclass
class Comm:
    """One communicator as one process saw it."""

    serial: int
    hash: str
    name: str
    nnodes: int
    nranks: int
    rank: int
    interface: str
    t: int
    colls: dict[int, Coll] = field(default_factory=dict)
    summary: dict | None = None

    def collectives(self) -> list[Coll]:
        """The collectives (not p2p), in enqueue order."""
        return sorted((c for c in self.colls.values() if not c.p2p), key=lambda c: (c.t0 or 0, c.id))


@dataclass
class PluginFile:
    """One rank's (one process's) trace file."""

    path: Path
    pid: int
    host: str
    #: the job rank from the environment (RANK, ...), -1 if it was not set
    rank: int
    comms: dict[int, Comm] = field(default_factory=dict)
    #: (step, ns since the epoch) from dpro_nccl_trace_mark_step
    marks: list[tuple[int, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def dropped(self) -> dict[str, int]:
        """Drops per reason over the file's communicators (from their summaries)."""
        out: dict[str, int] = defaultdict(int)
        for c in self.comms.values():
            for k, v in ((c.summary or {}).get("dropped") or {}).items():
                out[k] += int(v)
        return dict(out)


def _rel(v: object, base: int, where: str) -> int | None:
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{where}: not an integer time ({v!r})")
    return base + v


def read_plugin_file(path: str | Path) -> PluginFile:
    """Parse one plugin output file (``.jsonl``, optionally gzipped)."""
    path = Path(path)
    lines = read_bytes(path).splitlines()
    pf: PluginFile | None = None
    steps: list[tuple[int, int, Step]] = []  # (comm, op id, step)
    ops: list[tuple[int, ProxyOp]] = []
    kchs: list[tuple[int, int, dict]] = []
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            d = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            if n == len(lines) and pf is not None:
                pf.notes.append(f"{path.name}: last line truncated (writer killed?); ignored")
                break
            raise DproInputError(path, f"line {n}: invalid JSON ({e})") from None
        if not isinstance(d, dict):
            raise DproInputError(path, f"line {n}: not a JSON object")
        typ = d.get("type")
        try:
            if pf is None:
                if typ != "header" or d.get("format") != FORMAT_NAME:
                    raise DproInputError(path, f"line {n}: not a dpro NCCL plugin trace (no '{FORMAT_NAME}' header)")
                if int(d.get("version", 0)) > FORMAT_VERSION:
                    raise DproInputError(path, f"format version {d['version']} is newer than this reader ({FORMAT_VERSION})")
                pf = PluginFile(path, int(d.get("pid", 0)), str(d.get("host", "")), int(d.get("rank", -1)))
                continue
            if typ == "header":
                continue
            if typ == "mark":
                pf.marks.append((int(d["step"]), int(d["t"])))
                continue
            cm = int(d["comm"])
            if typ == "comm":
                pf.comms[cm] = Comm(cm, str(d.get("hash", "")), str(d.get("name", "")), int(d.get("nnodes", 0)),
                                    int(d.get("nranks", 0)), int(d.get("rank", -1)), str(d.get("interface", "")),
                                    int(d["t"]))
                continue
            comm = pf.comms.get(cm)
            if comm is None:
                raise DproInputError(path, f"line {n}: record of communicator {cm} before its 'comm' line")
            base = comm.t
            if typ in ("coll", "p2p"):
                c = Coll(
                    id=int(d["id"]), seq=int(d.get("seq", 0)), func=str(d["func"]), count=int(d.get("count", 0)),
                    dtype=str(d.get("dtype", "")), root=int(d.get("root", d.get("peer", -1))),
                    algo=str(d.get("algo", "")), proto=str(d.get("proto", "")), nch=int(d.get("nch", 0)),
                    rank=int(d.get("rank", comm.rank)), t0=_rel(d.get("t0"), base, "t0"), t1=_rel(d.get("t1"), base, "t1"),
                    p2p=typ == "p2p", open=bool(d.get("open")),
                )
                comm.colls[c.id] = c
            elif typ == "op":
                ops.append((cm, ProxyOp(
                    id=int(d["id"]), coll=int(d["coll"]), channel=int(d["ch"]), peer=int(d["peer"]),
                    is_send=bool(d["send"]), nsteps=int(d.get("nsteps", 0)), chunk=int(d.get("chunk", 0)),
                    remote=bool(d.get("remote")), t0=_rel(d.get("t0"), base, "t0"), t1=_rel(d.get("t1"), base, "t1"),
                    open=bool(d.get("open")),
                )))
            elif typ == "step":
                t = d["t"]
                if not isinstance(t, list) or len(t) != 5:
                    raise ValueError("'t' must be a list of 5 times")
                steps.append((cm, int(d["op"]), Step(
                    int(d["step"]), int(d.get("bytes", 0)), *(_rel(x, base, "t") for x in t), open=bool(d.get("open")),
                )))
            elif typ == "kch":
                kchs.append((cm, int(d["coll"]), {
                    "channel": int(d["ch"]), "gpu0": int(d.get("gpu0") or 0), "gpu1": int(d.get("gpu1") or 0),
                    "t0": _rel(d.get("t0"), base, "t0"), "t1": _rel(d.get("t1"), base, "t1"),
                }))
            elif typ == "summary":
                comm.summary = d
            # other types: newer writers; ignored
        except DproInputError:
            raise
        except (KeyError, ValueError, TypeError) as e:
            raise DproInputError(path, f"line {n} ({typ}): bad record ({type(e).__name__}: {e})") from None
    if pf is None:
        raise DproInputError(path, "empty file: no header line")
    by_op: dict[tuple[int, int], ProxyOp] = {}
    for cm, op in ops:
        by_op[(cm, op.id)] = op
        coll = pf.comms[cm].colls.get(op.coll)
        if coll is not None:
            coll.ops.append(op)
    orphans = 0
    for cm, op_id, st in steps:
        op = by_op.get((cm, op_id))
        if op is None:
            orphans += 1
            continue
        op.steps[st.index] = st
    for cm, coll_id, k in kchs:
        coll = pf.comms[cm].colls.get(coll_id)
        if coll is not None:
            coll.kernel_channels.append(k)
    if orphans:
        pf.notes.append(f"{path.name}: {orphans} step record(s) without their proxy op (dropped or PXN)")
    for comm in pf.comms.values():
        for c in comm.colls.values():
            c.ops.sort(key=lambda o: (o.channel, not o.is_send, o.peer, o.t0 or 0, o.id))
    pf.marks.sort(key=lambda m: m[1])
    return pf


def read_plugin_dir(path: str | Path) -> list[PluginFile]:
    """Every plugin file (``*.jsonl``, ``*.jsonl.gz``) of a directory, or one file."""
    path = Path(path)
    if path.is_file():
        return [read_plugin_file(path)]
    if not path.is_dir():
        raise DproInputError(path, "no such file or directory")
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith((".jsonl", ".jsonl.gz")))
    if not files:
        raise DproInputError(path, "no NCCL plugin traces (*.jsonl) in this directory")
    return [read_plugin_file(p) for p in files]


# --------------------------------------------------------------------------- communicators


@dataclass
class RankView:
    """One rank's side of the chosen communicator."""

    rank: int
    file: PluginFile
    comm: Comm


def select_comm(files: list[PluginFile], nranks: int | None = None, comm: str | None = None) -> dict[int, RankView]:
    """rank -> its view of one communicator present in the files.

    ``comm``: a communicator hash (``0x...``) or name; default: among communicators with
    ``nranks`` ranks (default: the largest), the one with the most collectives. Ranks are
    the communicator's own (the job's ranks for the default process group).
    """
    groups: dict[str, list[tuple[PluginFile, Comm]]] = defaultdict(list)
    for f in files:
        for c in f.comms.values():
            key = c.hash if c.hash.strip("0x") else f"n{c.nranks}:{c.name}"  # v3 has no hash
            groups[key].append((f, c))
    if not groups:
        raise DproInputError(files[0].path if files else None, "no communicator in the NCCL plugin traces")
    if comm is not None:
        cands = {k: v for k, v in groups.items() if k == comm or any(c.name == comm for _, c in v)}
        if not cands:
            raise DproInputError(None, f"no communicator '{comm}' in the NCCL plugin traces (have {sorted(groups)})")
    else:
        want = nranks or max(c.nranks for v in groups.values() for _, c in v)
        cands = {k: v for k, v in groups.items() if any(c.nranks == want for _, c in v)} or groups
    key = max(cands, key=lambda k: (sum(len(c.collectives()) for _, c in cands[k]), k))
    out: dict[int, RankView] = {}
    for f, c in cands[key]:
        r = c.rank if c.rank >= 0 else f.rank
        if r in out:
            raise DproInputError(f.path, f"rank {r} of communicator {key} also in {out[r].file.path.name}")
        out[r] = RankView(r, f, c)
    return out


# --------------------------------------------------------------------------- chunk ops


@dataclass(slots=True)
class Chunk:
    """One SEND or RECV chunk op of one collective on one rank."""

    sub_op: str          # "SEND" | "RECV"
    rank: int
    peer: int
    channel: int
    occ: int             # k-th op between the same two ranks on this channel (usually 0)
    step: int
    bytes: int
    txn: str
    #: ns since the epoch on the rank's clock, or None when the step was not seen
    start: int | None
    end: int | None

    @property
    def queue(self) -> tuple[int, str, int, int]:
        return (self.channel, self.sub_op, self.peer, self.occ)

    @property
    def key(self) -> tuple[int, str, int, int, int]:
        return (self.channel, self.sub_op, self.peer, self.occ, self.step)


def chunk_txn(coll_txn: str, channel: int, src: int, dst: int, step: int, occ: int = 0) -> str:
    """Transaction id of step ``step`` sent by ``src`` to ``dst`` on ``channel``."""
    return f"{coll_txn}/c{channel}/{src}>{dst}/s{step}" + (f"#{occ}" if occ else "")


def rank_chunks(rank: int, coll: Coll, coll_txn: str) -> list[Chunk]:
    """The chunk ops of one rank's collective (all of its proxy ops' steps)."""
    out: list[Chunk] = []
    occ: dict[tuple[int, bool, int], int] = defaultdict(int)
    for op in coll.ops:
        k = occ[(op.channel, op.is_send, op.peer)]
        occ[(op.channel, op.is_send, op.peer)] += 1
        src, dst = (rank, op.peer) if op.is_send else (op.peer, rank)
        for i in range(max(op.nsteps, max(op.steps, default=-1) + 1)):
            st = op.steps.get(i)
            span = st.span(op.is_send) if st is not None and not st.open else None
            nbytes = st.bytes if st is not None and st.bytes else op.chunk
            out.append(Chunk(
                "SEND" if op.is_send else "RECV", rank, op.peer, op.channel, k, i, int(nbytes),
                chunk_txn(coll_txn, op.channel, src, dst, i, k),
                span[0] if span else None, span[1] if span else None,
            ))
    return out


@dataclass
class PairedCollective:
    """One collective instance on all ranks, as chunks; ``problems`` empty when complete."""

    txn: str
    func: str
    algo: str
    proto: str
    nranks: int
    chunks: dict[int, list[Chunk]]
    problems: list[str] = field(default_factory=list)


def collective_chunks(colls: dict[int, Coll], coll_txn: str, nranks: int | None = None) -> PairedCollective:
    """Chunks of one collective given each rank's record of it, with the pairing checked:
    every SEND has the RECV of the same transaction on its peer and back, every step was
    seen (not dropped, not left open), and all ranks agree on the sequence number."""
    first = colls[min(colls)]
    pc = PairedCollective(coll_txn, first.func, first.algo, first.proto, nranks or len(colls), {})
    seqs = {c.seq for c in colls.values()}
    if len(seqs) > 1:
        pc.problems.append(f"ranks disagree on the sequence number ({sorted(seqs)})")
    for r, c in colls.items():
        if (c.func, c.algo, c.proto) != (first.func, first.algo, first.proto):
            pc.problems.append(f"rank {r} ran {c.func}/{c.algo}/{c.proto}, rank {min(colls)} {first.func}/{first.algo}/{first.proto}")
        pc.chunks[r] = rank_chunks(r, c, coll_txn)
    by_txn: dict[tuple[str, str], Chunk] = {}
    for ch in (x for v in pc.chunks.values() for x in v):
        by_txn[(ch.sub_op, ch.txn)] = ch
        if ch.start is None:
            pc.problems.append(f"rank {ch.rank}: {ch.sub_op} {ch.txn} was not recorded completely (dropped or open)")
    for (sub, txn), ch in by_txn.items():
        other = "RECV" if sub == "SEND" else "SEND"
        if (other, txn) not in by_txn and ch.peer in colls:
            pc.problems.append(f"rank {ch.rank}: {sub} {txn} has no {other} on rank {ch.peer}")
    if len(pc.problems) > 8:
        pc.problems[8:] = [f"... and {len(pc.problems) - 8} more"]
    return pc


# --------------------------------------------------------------------------- dependencies


def slices_per_ring_step(func: str, proto: str) -> int:
    """Network steps per ring step: NCCL's chunkSteps / sliceSteps (2 for SIMPLE rings of
    AllReduce, AllGather, ReduceScatter; 1 otherwise)."""
    return 2 if proto.upper() == "SIMPLE" and func in ("AllReduce", "AllGather", "ReduceScatter") else 1


def data_dependencies(pc: PairedCollective, rank: int) -> tuple[list[tuple[Chunk, Chunk]], str | None]:
    """(recv chunk, send chunk) pairs of ``rank`` where the send forwards what was received,
    by NCCL's algorithm (module doc); and a note when none could be derived."""
    chunks = pc.chunks.get(rank, [])
    by_queue: dict[tuple[int, str, int, int], dict[int, Chunk]] = defaultdict(dict)
    for c in chunks:
        by_queue[c.queue][c.step] = c
    channels = sorted({c.channel for c in chunks})
    deps: list[tuple[Chunk, Chunk]] = []
    note = None
    algo = pc.algo.upper()
    for ch in channels:
        sends = {q: v for q, v in by_queue.items() if q[0] == ch and q[1] == "SEND"}
        recvs = {q: v for q, v in by_queue.items() if q[0] == ch and q[1] == "RECV"}
        if not sends or not recvs:
            continue  # this rank only sends or only receives over the network here
        if algo == "RING":
            if len(sends) != 1 or len(recvs) != 1:
                note = f"{pc.txn}: rank {rank} channel {ch}: {len(sends)} send / {len(recvs)} recv queues in a ring; queue order only"
                continue
            sq, rq = next(iter(sends.values())), next(iter(recvs.values()))
            if pc.func in ("AllReduce", "AllGather", "ReduceScatter"):
                s = slices_per_ring_step(pc.func, pc.proto)
                loop = (2 if pc.func == "AllReduce" else 1) * (pc.nranks - 1)
                for i, snd in sq.items():
                    if (i // s) % loop != 0 and (i - s) in rq:
                        deps.append((rq[i - s], snd))
            else:  # Broadcast, Reduce: a pipeline
                deps += [(rq[i], snd) for i, snd in sq.items() if i in rq]
        elif algo == "TREE":
            peers = {q[2] for q in sends} & {q[2] for q in recvs}
            parent = [p for p in peers if _is_parent(sends, recvs, p)]
            if len(parent) > 1:
                note = f"{pc.txn}: rank {rank} channel {ch}: more than one tree parent ({parent}); queue order only"
                continue
            children = {q[2] for q in list(sends) + list(recvs)} - set(parent)
            up_in = [v for q, v in recvs.items() if q[2] in children]
            for q, sq in sends.items():
                if parent and q[2] == parent[0]:
                    srcs = up_in
                elif parent:
                    srcs = [v for q2, v in recvs.items() if q2[2] == parent[0]]
                else:
                    srcs = up_in
                for i, snd in sq.items():
                    deps += [(src[i], snd) for src in srcs if i in src]
        else:
            note = f"{pc.txn}: algorithm {pc.algo}: no data dependencies between chunks (queue order only)"
    return deps, note


def _is_parent(sends: dict, recvs: dict, peer: int) -> bool:
    """On a tree link, the peer is our parent when our step-0 send to it starts before our
    step-0 receive from it arrives (data goes up first, then comes down)."""
    votes = 0
    for (_, _, p, _), sq in sends.items():
        if p != peer:
            continue
        for (_, _, p2, _), rq in recvs.items():
            if p2 != peer:
                continue
            for i in sorted(set(sq) & set(rq))[:4]:
                a, b = sq[i].start, rq[i].start
                if a is not None and b is not None:
                    votes += 1 if a < b else -1
    return votes > 0


# --------------------------------------------------------------------------- linkage


def kineto_time_offsets(path: str | Path) -> dict[int, float]:
    """rank -> what to add to plugin µs to get the rank's Kineto ``ts``: the trace's
    ``-baseTimeNanoseconds / 1000`` (both clocks are CLOCK_REALTIME)."""
    from dpro.importers.kineto.read import DEFAULT_RANK_PATTERN, trace_files

    out: dict[int, float] = {}
    for i, p in enumerate(trace_files(Path(path))):
        raw = read_bytes(p)
        m = re.search(rb'"baseTimeNanoseconds"\s*:\s*(\d+)', raw)
        if not m:
            continue
        r = re.search(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)', raw)
        if r:
            rank = int(r.group(1))
        else:
            mm = re.search(DEFAULT_RANK_PATTERN, p.name)
            rank = int(mm.group(1)) if mm else i
        out[rank] = -int(m.group(1)) / 1000.0
    return out


@dataclass
class _Instance:
    """One execution of a coarse collective op on a node in one step."""

    step: int
    op: Op
    ts: float
    dur: float


def _txn_index(txn: str) -> int:
    try:
        return int(txn.rsplit(".", 1)[1])
    except (IndexError, ValueError):
        return 0


def _node_instances(nt: NodeTrace, steps: list[int]) -> dict[int, list[_Instance]]:
    """step -> the node's coarse NCCL collectives in that step, in gTrace order (txn index)."""
    want = set(steps)
    out: dict[int, list[_Instance]] = defaultdict(list)
    for e in nt.events:
        op = nt.ops.get(e.op)
        if op is None or e.step not in want or op.cat != "COMM" or op.sub_op not in NCCL_FUNC or op.txn is None:
            continue
        out[e.step].append(_Instance(e.step, op, e.ts, e.dur))
    for v in out.values():
        v.sort(key=lambda x: (_txn_index(x.op.txn or ""), x.ts))
    return out


def _assign_steps(
    view: RankView, steps: list[int], windows: dict[int, tuple[float, float]], offset_us: float | None,
    seq_base: dict[str, int] | None, per_step: dict[str, int],
) -> tuple[dict[tuple[int, str], list[Coll]], str]:
    """(step, NCCL func) -> the rank's plugin collectives of that step in seq order; and how."""
    colls = view.comm.collectives()
    out: dict[tuple[int, str], list[Coll]] = defaultdict(list)
    marks = sorted(view.file.marks, key=lambda m: m[1])
    if marks:
        times = [t for _, t in marks]
        for c in colls:
            i = bisect.bisect_right(times, c.t0 or 0) - 1
            if i >= 0 and marks[i][0] in windows:
                out[(marks[i][0], c.func)].append(c)
        how = "step marks"
    elif offset_us is not None:
        off = _us_to_ns(offset_us)
        for c in colls:
            t = ((c.t0 or 0) + off) / 1000.0
            for s, (t0, dur) in windows.items():
                if t0 <= t < t0 + dur:
                    out[(s, c.func)].append(c)
                    break
        how = "step windows (time offset)"
    elif seq_base is not None:
        by_seq = {(c.func, c.seq): c for c in colls}
        s0 = min(steps)
        for s in steps:
            for func, m in per_step.items():
                base = seq_base.get(func)
                if base is None:
                    continue
                for j in range(m):
                    c = by_seq.get((func, base + (s - s0) * m + j))
                    if c is not None:
                        out[(s, func)].append(c)
        how = "sequence base"
    else:
        raise DproInputError(
            view.file.path,
            "cannot link NCCL collectives to training steps: the trace has no step marks "
            "(call dpro_nccl_trace_mark_step() in the training loop), and no time_offset_us or seq_base was given",
        )
    for v in out.values():
        v.sort(key=lambda c: c.seq)
    return out, how


# --------------------------------------------------------------------------- replacement


@dataclass
class ReplaceResult:
    """What :func:`replace_collectives` did."""

    gtrace: GTrace
    #: collective txns replaced by chunk ops on every rank
    replaced: list[str] = field(default_factory=list)
    #: txn -> why it kept its coarse op
    kept: dict[str, str] = field(default_factory=dict)
    #: rank -> the time offset used (plugin µs + offset = node µs) and how it was found
    offsets: dict[int, tuple[float, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def replace_collectives(
    gt: GTrace,
    plugin: str | Path | list[PluginFile],
    *,
    time_offset_us: float | dict[int, float] | None = None,
    seq_base: int | dict[str, int] | None = None,
    comm: str | None = None,
    steps: list[int] | None = None,
) -> ReplaceResult:
    """A copy of ``gt`` whose coarse NCCL collectives are replaced, on every rank, by
    IN -> measured SEND/RECV chunk ops -> OUT (see the module doc).

    ``plugin``: the plugin's output directory (or file, or parsed files).
    ``time_offset_us``: plugin µs + offset = node clock µs, one number or per rank (e.g.
    :func:`kineto_time_offsets`); default: estimated from the collectives' ends.
    ``seq_base``: sequence number of the first profiled step's first collective (per NCCL
    function name, or one for all) when the files have no step marks and no offset is given.
    ``comm``: the communicator (hash or name); default: the one spanning the job.
    ``steps``: steps to use (default: the manifest's). A collective is replaced only when
    every rank of it is in ``gt``, every step is linked, and every chunk of every step was
    recorded with the same structure; otherwise it keeps its coarse op (``kept`` says why).
    """
    from dpro.gtrace.validate import validate

    files = plugin if isinstance(plugin, list) else read_plugin_dir(plugin)
    res = ReplaceResult(gtrace=gt)
    for f in files:
        res.notes += f.notes
        drops = {k: v for k, v in f.dropped().items() if v and k != "paused"}
        if drops:
            res.notes.append(f"{f.path.name}: the plugin dropped events ({', '.join(f'{k}: {v}' for k, v in sorted(drops.items()))})")
    workers = {nt.info.rank: nt for nt in gt.workers()}
    views = select_comm(files, nranks=gt.manifest.world_size, comm=comm)
    use_steps = sorted(steps or gt.manifest.steps or sorted(set.intersection(*(set(nt.steps) for nt in workers.values()))))
    if isinstance(seq_base, int):
        seq_base = {f: seq_base for f in NCCL_FUNC.values()}

    # 1. per rank: instances per step, and the plugin collectives linked to them
    linked: dict[tuple[str, int], dict[int, tuple[_Instance, Coll]]] = defaultdict(dict)  # (txn, step) -> rank -> ...
    inst_by_rank: dict[int, dict[int, list[_Instance]]] = {}
    kept: dict[str, str] = {}
    for r, nt in workers.items():
        inst = _node_instances(nt, use_steps)
        inst_by_rank[r] = inst
        if r not in views:
            for v in inst.values():
                for x in v:
                    kept.setdefault(x.op.txn, f"no NCCL plugin trace for rank {r}")
            continue
        per_step: dict[str, int] = defaultdict(int)
        first = inst.get(use_steps[0], []) if use_steps else []
        for x in first:
            per_step[NCCL_FUNC[x.op.sub_op]] += 1
        off = time_offset_us.get(r) if isinstance(time_offset_us, dict) else time_offset_us
        windows = {s: nt.steps[s] for s in use_steps if s in nt.steps}
        assigned, how = _assign_steps(views[r], use_steps, windows, off, seq_base, per_step)
        for s in use_steps:
            by_func: dict[str, list[_Instance]] = defaultdict(list)
            for x in inst.get(s, []):
                by_func[NCCL_FUNC[x.op.sub_op]].append(x)
            for func, xs in by_func.items():
                cs = assigned.get((s, func), [])
                if len(cs) != len(xs):
                    for x in xs:
                        kept.setdefault(x.op.txn, f"rank {r} step {s}: {len(xs)} {func} in the gTrace, "
                                                  f"{len(cs)} in the NCCL trace (linked by {how})")
                    continue
                for x, c in zip(xs, cs):
                    # (AllGather / ReduceScatter count per-rank elements on one side only)
                    if func in ("AllReduce", "Broadcast") and c.bytes and x.op.bytes and c.bytes != x.op.bytes:
                        kept.setdefault(x.op.txn, f"rank {r} step {s}: {x.op.txn} has {x.op.bytes} bytes, "
                                                  f"NCCL seq {c.seq} {c.bytes} (linked by {how})")
                    linked[(x.op.txn, s)][r] = (x, c)

    # 2. per collective txn: all ranks, all steps, same structure
    txns = sorted({x.op.txn for inst in inst_by_rank.values() for v in inst.values() for x in v})
    plans: dict[str, dict[int, PairedCollective]] = {}
    for txn in txns:
        if txn in kept:
            continue
        ranks_with = sorted(r for r, inst in inst_by_rank.items() if any(x.op.txn == txn for v in inst.values() for x in v))
        op0 = next(x.op for x in (y for v in inst_by_rank[ranks_with[0]].values() for y in v) if x.op.txn == txn)
        group = list(op0.group) if op0.group else list(range(gt.manifest.world_size))
        if any(g not in workers for g in group):
            kept[txn] = f"ranks {[g for g in group if g not in workers]} of its group are not in the trace"
            continue
        per_step: dict[int, PairedCollective] = {}
        why = None
        for s in use_steps:
            got = linked.get((txn, s), {})
            if set(got) != set(group):
                why = f"step {s}: linked on ranks {sorted(got)} of {group}"
                break
            pc = collective_chunks({r: c for r, (_, c) in got.items()}, txn, nranks=len(group))
            if pc.problems:
                why = f"step {s}: {pc.problems[0]}"
                break
            if not any(pc.chunks.values()):
                why = f"step {s}: no network steps recorded (intra-node only, or proxy events off)"
                break
            per_step[s] = pc
        if why is None and per_step:
            shapes = {s: {r: sorted(c.key for c in v) for r, v in pc.chunks.items()} for s, pc in per_step.items()}
            ref = shapes[use_steps[0]]
            diff = [s for s, sh in shapes.items() if sh != ref]
            if diff:
                why = f"steps {diff} have other chunks (channels / steps) than step {use_steps[0]}"
        if why is not None or not per_step:
            kept[txn] = why or "no profiled steps"
            continue
        plans[txn] = per_step

    # 3. time offsets, in integer ns (plugin times are ~1.8e18 ns: as float µs they would
    #    keep only 0.25 µs)
    off_ns: dict[int, int] = {}
    for r in workers:
        given = time_offset_us.get(r) if isinstance(time_offset_us, dict) else time_offset_us
        if given is not None:
            off_ns[r] = _us_to_ns(given)
            res.offsets[r] = (float(given), "given")
            continue
        est = []
        for txn, per_step in plans.items():
            for s, pc in per_step.items():
                x = linked[(txn, s)][r][0]
                mine = [c for c in pc.chunks.get(r, []) if c.end is not None]
                ends = [c.end for c in mine if c.sub_op == "RECV"] or [c.end for c in mine]
                if ends:
                    est.append(_us_to_ns(x.ts + x.dur) - max(ends))
        if est:
            off_ns[r] = int(statistics.median_low(est))
            res.offsets[r] = (off_ns[r] / 1000.0, f"estimated from {len(est)} collective end(s)")

    # 4. rewrite the nodes
    if not plans:
        res.kept = kept
        res.notes.append("no NCCL collective could be replaced by measured chunks")
        return res
    new_nodes = dict(gt.nodes)
    for r, nt in workers.items():
        mine = {txn: p for txn, p in plans.items() if r in p[use_steps[0]].chunks}
        if not mine:
            continue
        new_nodes[nt.info.name] = _rewrite_node(nt, mine, linked, r, off_ns.get(r, 0), use_steps, res.notes)
    new_gt = replace(gt, nodes=new_nodes, notes=list(gt.notes))
    summary = f"NCCL plugin: {len(plans)} collective(s) replaced by measured chunks"
    if kept:
        summary += f", {len(kept)} kept coarse"
    new_gt.notes.append(summary)
    validate(new_gt)
    res.gtrace = new_gt
    res.replaced = sorted(plans)
    res.kept = kept
    return res


def _us_to_ns(us: float) -> int:
    """µs (a float, exactly as given) -> the nearest integer ns, without float rounding."""
    return round(Fraction(us) * 1000)


def _rewrite_node(
    nt: NodeTrace, plans: dict[str, dict[int, PairedCollective]],
    linked: dict[tuple[str, int], dict[int, tuple[_Instance, Coll]]], rank: int, offset_ns: int,
    steps: list[int], notes: list[str],
) -> NodeTrace:
    ops = dict(nt.ops)
    edges = list(nt.edges)
    events = [e for e in nt.events]
    replaced_ops: dict[str, str] = {}  # coarse op id -> txn
    for txn in plans:
        x0 = linked[(txn, steps[0])][rank][0]
        replaced_ops[x0.op.id] = txn
    preds: dict[str, list[str]] = defaultdict(list)
    succs: dict[str, list[str]] = defaultdict(list)
    for u, v in nt.edges:
        preds[v].append(u)
        succs[u].append(v)
    edges = [(u, v) for u, v in edges if u not in replaced_ops and v not in replaced_ops]
    events = [e for e in events if e.op not in replaced_ops]
    for op_id, txn in replaced_ops.items():
        x = nt.ops[op_id]
        per_step = plans[txn]
        pc0 = per_step[steps[0]]
        del ops[op_id]
        in_id, out_id = f"{op_id}/IN", f"{op_id}/OUT"
        common = dict(cat="COMM", tensor=x.tensor, layer=x.layer)
        ops[in_id] = Op(in_id, f"{x.name}:IN", device=x.device, sub_op="IN", bytes=x.bytes, txn=x.txn, group=None, **common)
        ops[out_id] = Op(out_id, f"{x.name}:OUT", device=x.device, sub_op="OUT", bytes=x.bytes, txn=x.txn, group=None, **common)
        edges += [(u, in_id) for u in preds[op_id] if u not in replaced_ops]
        edges += [(out_id, v) for v in succs[op_id] if v not in replaced_ops]
        # between two replaced collectives: OUT of the first -> IN of the second
        edges += [(f"{u}/OUT", in_id) for u in preds[op_id] if u in replaced_ops]
        edges.append((in_id, out_id))  # (a rank may have no network step at all)
        chunk_id = {}
        queues: dict[tuple, list] = defaultdict(list)
        for c in pc0.chunks[rank]:
            direction = f"send>{c.peer}" if c.sub_op == "SEND" else f"recv<{c.peer}"
            occ = f"#{c.occ}" if c.occ else ""
            cid = f"{op_id}/c{c.channel}/{direction}{occ}/s{c.step}"
            chunk_id[c.key] = cid
            ops[cid] = Op(cid, f"nccl:{c.sub_op.lower()}", device=f"nccl:c{c.channel}:{direction}", sub_op=c.sub_op,
                          bytes=c.bytes, txn=c.txn, peer=c.peer, **common)
            queues[c.queue].append(c)
        for q in queues.values():
            q.sort(key=lambda c: c.step)
            edges.append((in_id, chunk_id[q[0].key]))
            edges += [(chunk_id[a.key], chunk_id[b.key]) for a, b in zip(q, q[1:])]
            edges.append((chunk_id[q[-1].key], out_id))
        deps, note = data_dependencies(pc0, rank)
        if note and note not in notes:
            notes.append(note)
        edges += [(chunk_id[a.key], chunk_id[b.key]) for a, b in deps]
        for s in steps:
            inst = linked[(txn, s)][rank][0]
            events.append(Event(in_id, s, inst.ts, 0.0))
            events.append(Event(out_id, s, inst.ts + inst.dur, 0.0))
            for c in per_step[s].chunks[rank]:
                events.append(Event(chunk_id[c.key], s, (c.start + offset_ns) / 1000.0, (c.end - c.start) / 1000.0))
    return NodeTrace(
        info=nt.info, ops=ops, edges=sorted(set(edges)), events=events, steps=dict(nt.steps),
        tensors=list(nt.tensors), meta=dict(nt.meta),
    )
