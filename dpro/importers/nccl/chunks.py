"""One collective seen on all ranks -> SEND/RECV chunk ops paired by transaction id, and the
data dependencies NCCL's algorithms imply between a rank's chunks (package docstring)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from dpro.importers.nccl.read import Coll


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

