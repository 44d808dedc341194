"""Cross-file checks of a loaded gTrace: acyclic DFGs and paired transaction ids."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from dpro.errors import DproInputError
from dpro.gtrace.schema import COARSE_SUB_OPS, GTrace

#: producer sub-op -> consumer sub-op, paired by transaction id across nodes.
PAIRS = {"SEND": "RECV", "PUSH_REQ": "PUSH_RES", "PULL_REQ": "PULL_RES"}


def _error(gt: GTrace, node: str, which: str, problem: str) -> DproInputError:
    """An error naming the node's file; for a trace not loaded from a gTrace directory
    (e.g. just imported from Kineto) the source directory and the node."""
    info = gt.nodes[node].info
    fname = info.dfg if which == "dfg" else info.events
    if gt.source and fname:
        return DproInputError(Path(gt.source) / fname, problem)
    meta = gt.manifest.meta or {}
    files = meta.get("files")  # node -> the file it was imported from, when an importer says
    if isinstance(files, dict) and isinstance(files.get(node), str):
        return DproInputError(files[node], f"{node} (rank {info.rank}): {problem}")
    source = gt.source or meta.get("source")
    return DproInputError(source or node, f"{node} (rank {info.rank}): {problem}" if source else problem)


def find_cycle(edges: list[tuple[str, str]]) -> list[str] | None:
    """One cycle of the directed graph as [a, b, ..., a], or None when it is acyclic."""
    succ: dict[str, list[str]] = defaultdict(list)
    for u, v in edges:
        succ[u].append(v)
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done
    for start in list(succ):
        if start in state:
            continue
        stack = [(start, iter(succ[start]))]
        path = [start]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                state[node] = 2
                continue
            st = state.get(nxt)
            if st == 1:
                return path[path.index(nxt):] + [nxt]
            if st is None:
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(succ.get(nxt, ()))))
    return None


def check_acyclic(gt: GTrace) -> None:
    """Each local DFG must be a DAG; the error names one cycle."""
    for name, nt in gt.nodes.items():
        cyc = find_cycle(nt.edges)
        if cyc is not None:
            raise _error(gt, name, "dfg", f"the DFG has a cycle: {' -> '.join(cyc)}")


def check_references(gt: GTrace) -> None:
    """Edges and events name ops of their node's DFG; durations are not negative.

    (load_gtrace checks these per file already; this covers traces built in memory,
    e.g. by an importer, before they are replayed or written.)
    """
    for name, nt in gt.nodes.items():
        for i, (u, v) in enumerate(nt.edges):
            for x in (u, v):
                if x not in nt.ops:
                    raise _error(gt, name, "dfg", f"edges[{i}]: unknown op '{x}'")
        for ev in nt.events:
            if ev.op not in nt.ops:
                raise _error(gt, name, "events", f"an event names op '{ev.op}', which is not in the node's DFG")
            if not ev.dur >= 0:
                raise _error(gt, name, "events", f"op '{ev.op}' (step {ev.step}): negative duration {ev.dur}")


def check_transactions(gt: GTrace) -> None:
    """Every producer's transaction id has its consumer on a present peer, and back."""
    present = {nt.info.rank for nt in gt.nodes.values() if nt.info.role == "worker"}
    by_sub: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    coarse: dict[str, set[int]] = defaultdict(set)
    coarse_op: dict[str, tuple[str, str]] = {}
    groups: dict[str, tuple[int, ...]] = {}
    for name, nt in gt.nodes.items():
        for op in nt.ops.values():
            if op.cat != "COMM" or op.txn is None:
                continue
            if op.sub_op in COARSE_SUB_OPS:
                coarse[op.txn].add(nt.info.rank)
                coarse_op.setdefault(op.txn, (name, op.id))
                if op.group:
                    groups[op.txn] = op.group
            else:
                by_sub[op.sub_op][op.txn] = (name, op.id)
    for prod, cons in PAIRS.items():
        for a, b in ((prod, cons), (cons, prod)):
            for txn, (node, op_id) in by_sub.get(a, {}).items():
                if txn in by_sub.get(b, {}):
                    continue
                peer = gt.nodes[node].ops[op_id].peer
                if peer is not None and peer not in present and gt.manifest.scheme == "allreduce":
                    continue  # the peer's trace is simply not in this directory
                raise _error(
                    gt, node, "dfg",
                    f"unmatched transaction id '{txn}' ({a} op '{op_id}' has no {b}"
                    + (f" on peer rank {peer})" if peer is not None else ")"),
                )
    for txn, ranks in coarse.items():
        group = set(groups.get(txn) or range(gt.manifest.world_size))
        missing = (group & present) - ranks
        if missing:
            node, op_id = coarse_op[txn]
            raise _error(
                gt, node, "dfg",
                f"unmatched transaction id '{txn}': collective op '{op_id}' is missing on present rank(s) "
                f"{sorted(missing)} (found on rank(s) {sorted(ranks)})",
            )


def validate(gt: GTrace) -> None:
    """Run every cross-file check; raises DproInputError on the first problem."""
    check_references(gt)
    check_acyclic(gt)
    check_transactions(gt)
