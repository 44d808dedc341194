"""Cross-file checks of a loaded gTrace: acyclic DFGs and paired transaction ids."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from dpro.errors import DproInputError
from dpro.gtrace.schema import COARSE_SUB_OPS, GTrace
from dpro.jsonio import current_read_options

#: times (ts, ts + dur) must stay below 2^53 µs (285 years): float64 holds them to the µs
MAX_TIME_US = float(2**53)
#: byte counts and step numbers must fit a signed 64-bit integer
INT64_MAX = 2**63 - 1
#: the largest world_size accepted (a bigger one is a corrupt manifest, not a job)
MAX_WORLD_SIZE = 2**17

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
            if not (math.isfinite(ev.ts) and abs(ev.ts) + ev.dur < MAX_TIME_US):
                raise _error(gt, name, "events", f"op '{ev.op}' (step {ev.step}): time {ev.ts:g} + {ev.dur:g} µs is out of "
                             f"range (|ts| + dur must be below 2^53 µs)")
            if not -INT64_MAX <= ev.step <= INT64_MAX:
                raise _error(gt, name, "events", f"op '{ev.op}': step number does not fit a 64-bit integer")
        for step, (ts, dur) in nt.steps.items():
            if not (-INT64_MAX <= step <= INT64_MAX and math.isfinite(ts) and dur >= 0 and abs(ts) + dur < MAX_TIME_US):
                raise _error(gt, name, "events", f"step marker {step if abs(step) < 10**30 else '(huge)'}: step number, "
                             f"time or duration out of range")
        for op in nt.ops.values():
            if op.bytes is not None and not 0 <= op.bytes <= INT64_MAX:
                raise _error(gt, name, "dfg", f"op '{op.id}': bytes out of range (0 to 2^63-1)")
        for t in nt.tensors:
            if not 0 <= t.bytes <= INT64_MAX or not all(0 <= x <= INT64_MAX for x in t.shape):
                raise _error(gt, name, "dfg", f"tensor '{t.name}': bytes or shape out of range (0 to 2^63-1)")


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (f", ... ({len(ranks)} in all)" if len(ranks) > 8 else "")


def _source(gt: GTrace) -> str:
    return gt.source or str((gt.manifest.meta or {}).get("source") or "trace")


def check_ranks(gt: GTrace) -> None:
    """``world_size`` is plausible and every worker rank below it has a node; a missing rank
    is an error unless ``allow_missing_ranks`` (then a note says so)."""
    ws = gt.manifest.world_size
    if not 1 <= ws <= MAX_WORLD_SIZE:
        raise DproInputError(_source(gt), f"world_size {ws} is out of range (1 to {MAX_WORLD_SIZE})")
    present = {nt.info.rank for nt in gt.nodes.values() if nt.info.role == "worker"}
    missing = [r for r in range(ws) if r not in present]
    if not missing:
        return
    what = f"{len(present)} of {ws} worker ranks present; missing rank(s) {_ranks_text(missing)}"
    if not current_read_options().allow_missing_ranks:
        raise DproInputError(_source(gt), f"{what} (to go on with the ranks present: dpro --allow-missing-ranks COMMAND ..., "
                             "an option before the command, or DPRO_ALLOW_MISSING_RANKS=1)")
    if not any(n.startswith(f"{len(present)} of {ws} ranks present") for n in gt.notes):  # the importer's own note
        gt.notes.append(f"{len(present)} of {ws} ranks present (--allow-missing-ranks); missing rank(s) "
                        f"{_ranks_text(missing)}")


def check_steps(gt: GTrace) -> None:
    """The manifest lists at least one step, and every step it lists is in the events."""
    steps = gt.manifest.steps
    if not steps:
        held = {name: sorted(nt.steps)[:5] for name, nt in gt.nodes.items() if nt.info.role == "worker"}
        raise DproInputError(_source(gt), f"no step is common to all ranks (steps per node: {held})")
    held_any: set[int] = set()
    for nt in gt.nodes.values():
        held_any |= set(nt.steps)
        held_any |= {ev.step for ev in nt.events}
    absent = [s for s in steps if s not in held_any]
    if absent:
        raise DproInputError(_source(gt), f"the manifest lists step(s) {_ranks_text(absent)}, which no events hold")


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
        group = groups.get(txn)
        missing = ({r for r in present if r in group} if group else {r for r in present if r < gt.manifest.world_size}) - ranks
        if missing:
            node, op_id = coarse_op[txn]
            raise _error(
                gt, node, "dfg",
                f"unmatched transaction id '{txn}': collective op '{op_id}' is missing on present rank(s) "
                f"{sorted(missing)} (found on rank(s) {sorted(ranks)})",
            )


def validate(gt: GTrace) -> None:
    """Run every cross-file check; raises DproInputError on the first problem."""
    check_ranks(gt)
    check_references(gt)
    check_steps(gt)
    check_acyclic(gt)
    check_transactions(gt)
