"""Cross-file checks of a loaded gTrace: acyclic DFGs and paired transaction ids."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import networkx as nx

from dpro.errors import DproInputError
from dpro.gtrace.schema import COARSE_SUB_OPS, GTrace

#: producer sub-op -> consumer sub-op, paired by transaction id across nodes.
PAIRS = {"SEND": "RECV", "PUSH_REQ": "PUSH_RES", "PULL_REQ": "PULL_RES"}


def _where(gt: GTrace, node: str, which: str) -> str:
    info = gt.nodes[node].info
    fname = info.dfg if which == "dfg" else info.events
    return str(Path(gt.source) / fname) if gt.source and fname else node


def check_acyclic(gt: GTrace) -> None:
    """Each local DFG must be a DAG; the error names one cycle."""
    for name, nt in gt.nodes.items():
        g = nx.DiGraph(nt.edges)
        try:
            cyc = nx.find_cycle(g)
        except nx.NetworkXNoCycle:
            continue
        path = " -> ".join([u for u, _ in cyc] + [cyc[0][0]])
        raise DproInputError(_where(gt, name, "dfg"), f"the DFG has a cycle: {path}")


def check_transactions(gt: GTrace) -> None:
    """Every producer's transaction id has its consumer on a present peer, and back."""
    present = {nt.info.rank for nt in gt.nodes.values() if nt.info.role == "worker"}
    by_sub: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    coarse: dict[str, set[int]] = defaultdict(set)
    groups: dict[str, tuple[int, ...]] = {}
    for name, nt in gt.nodes.items():
        for op in nt.ops.values():
            if op.cat != "COMM" or op.txn is None:
                continue
            if op.sub_op in COARSE_SUB_OPS:
                coarse[op.txn].add(nt.info.rank)
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
                raise DproInputError(_where(gt, node, "dfg"), f"unmatched transaction id '{txn}' ({a} op '{op_id}' has no {b})")
    for txn, ranks in coarse.items():
        group = set(groups.get(txn) or range(gt.manifest.world_size))
        missing = (group & present) - ranks
        if missing:
            node = next(n for n, nt in gt.nodes.items() if nt.info.rank in ranks)
            raise DproInputError(
                _where(gt, node, "dfg"), f"collective '{txn}' is missing on present rank(s) {sorted(missing)}"
            )


def validate(gt: GTrace) -> None:
    """Run every cross-file check; raises DproInputError on the first problem."""
    check_acyclic(gt)
    check_transactions(gt)
