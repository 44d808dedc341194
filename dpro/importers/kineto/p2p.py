"""The global peer rank of a point-to-point transfer issued on a process group.

c10d records the peer of ``c10d::send`` / ``c10d::recv_`` as the peer's rank IN THE GROUP
the call ran on (``dist.send(t, dst=3, group=g)`` with g = {2, 3} is recorded as "send to
1"), and the issue does not say which group that was (its process-group argument is an
empty string in ``Concrete Inputs``). So the peer is read through the groups the trace
gives:

* the collective's own group, where its CPU-side events name the group's ranks
  (``Process Group Ranks`` of NCCL's ``record_param_comms``): that group's ranks;
* else every group of the rank in ``distributedInfo.pg_config`` (the default group
  included) gives one candidate, ``ranks[peer]``; one distinct candidate is the peer;
* several candidates (a subgroup's group rank is also a world rank): the join keeps the
  candidate whose trace holds the matching transfer (the other kind, same tag) with this
  rank among ITS candidates (:func:`resolve_open`); where none or several do, or that
  rank is absent, the transfer is not linked and a note says so.

Without ``pg_config`` (older PyTorch) the peer is read as a global rank, as the world
group's ranks are (docs/kineto.md, "Point-to-point in subgroups").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dpro.gtrace.schema import NodeTrace

#: the transaction-id prefix of a transfer whose peer the join has yet to choose
OPEN_P2P = "p2p?/"
#: NodeTrace.meta key of a rank's open transfers (removed by :func:`resolve_open`)
OPEN_META = "_open_p2p"


@dataclass(frozen=True, slots=True)
class OpenP2P:
    """Transfers of one rank with one (kind, group-rank peer, tag) and several candidate peers."""

    kind: str
    raw_peer: int
    tag: int
    candidates: tuple[int, ...]

    @property
    def key(self) -> str:
        return f"{OPEN_P2P}{self.kind}/{self.raw_peer}/tag{self.tag}"


def peer_candidates(raw_peer: int, rank: int, group: Sequence[int] | None,
                    groups: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """Global ranks that a recorded (group-rank) peer may stand for, see the module doc.

    ``group``: the transfer's own group, where the trace names it; ``groups``: the rank's
    groups from ``pg_config`` (empty: unknown, the peer is read as a global rank)."""
    if group and rank in group:
        return (group[raw_peer],) if 0 <= raw_peer < len(group) and group[raw_peer] != rank else ()
    if not groups:
        return (raw_peer,)
    return tuple(sorted({g[raw_peer] for g in groups if rank in g and 0 <= raw_peer < len(g)
                         and g[raw_peer] != rank}))


def p2p_key(kind: str, rank: int, peer: int, tag: int) -> str:
    """Transaction-id prefix of a transfer, the same on both ranks: ``p2p/<src>-><dst>/tag<t>``."""
    return (f"p2p/{rank}->{peer}" if kind == "send" else f"p2p/{peer}->{rank}") + f"/tag{tag}"


def _matches(ops_of: dict[int, set[tuple[str, int, int]]], rank: int, kind: str, peer: int, tag: int) -> bool:
    """Whether rank ``peer`` holds a transfer of the other kind with ``tag`` that may go to ``rank``."""
    other = "recv" if kind == "send" else "send"
    return (other, rank, tag) in ops_of.get(peer, set())


def resolve_open(nodes: dict[int, NodeTrace], notes: list[str]) -> None:
    """Choose the peer of every open transfer across the imported ranks (``nodes``: rank ->
    NodeTrace), rewriting the transaction ids and groups of its ops; unresolved ones
    stay unlinked, with a note."""
    opens = {r: nt.meta.pop(OPEN_META, []) for r, nt in nodes.items()}
    if not any(opens.values()):
        return
    # (kind, possible peer, tag) of every transfer of every rank
    ops_of: dict[int, set[tuple[str, int, int]]] = {r: set() for r in nodes}
    for r, nt in nodes.items():
        for op in nt.ops.values():
            txn = op.txn or ""
            if txn.startswith("p2p/") and op.sub_op in ("SEND", "RECV") and op.group:
                kind = "send" if op.sub_op == "SEND" else "recv"
                peer = next((x for x in op.group if x != r), r)
                ops_of[r].add((kind, peer, int(txn.split("/tag")[1].split(".")[0])))
        for o in opens[r]:
            ops_of[r].update((o.kind, c, o.tag) for c in o.candidates)
    chosen: list[str] = []
    for r, nt in nodes.items():
        for o in opens[r]:
            fits = [c for c in o.candidates if c in nodes and _matches(ops_of, r, o.kind, c, o.tag)]
            taken = {op.txn.rsplit(".", 1)[0] for op in nt.ops.values()
                     if (op.txn or "").startswith("p2p/")}
            what = f"rank {r}'s {o.kind} with peer {o.raw_peer} (a group rank) and tag {o.tag}"
            if len(fits) != 1 or p2p_key(o.kind, r, fits[0], o.tag) in taken:
                absent = [c for c in o.candidates if c not in nodes]
                notes.append(f"{what} may go to global rank {' or '.join(map(str, o.candidates))}"
                             + (f" (rank {', '.join(map(str, absent))} absent)" if absent else "")
                             + ": its process group is unknown; not linked (keeps its measured duration)")
                continue
            key = p2p_key(o.kind, r, fits[0], o.tag)
            for op in nt.ops.values():
                if (op.txn or "").startswith(o.key + "."):
                    op.txn = key + op.txn[len(o.key):]
                    op.group = tuple(sorted((r, fits[0])))
            chosen.append(f"rank {r}'s {o.kind} peer {o.raw_peer} is rank {fits[0]}")
    if chosen:
        notes.append("send/recv peers recorded as ranks in an unnamed process group, each mapped to the only "
                     "candidate global rank whose trace has the matching transfer: " + "; ".join(chosen))
