"""What a parameter-server job's servers cost, fitted from their own ops in the trace.

* the link: a pull answered to all N workers is ``alpha + beta * N * bytes`` on the
  server's port, a worker's pieces ``beta * bytes`` on its own (busy periods of the
  servers' ``PULL_REQ`` ops, and of the workers' ``PUSH_REQ`` ops when servers outnumber
  workers: :func:`fit_server_link`; pushes and pulls are taken to cost the same, since a
  link is capped alike both ways);
* its update: ``update_alpha + update_beta * bytes`` (the ``update:<param>`` ops).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from dpro.graph.comm_model import LinkCost, lad_link_cost, lad_nonneg
from dpro.graph.intervals import busy_periods
from dpro.gtrace.schema import GTrace, NodeTrace
from dpro.optimizer.ps.layout import base_name


def fit_server_link(gt: GTrace, steps: list[int]) -> LinkCost | None:
    """alpha (µs per message) and beta (µs per byte through one port) from the busy periods
    of every server's answers to pulls (its port carries all N workers' copies).

    With more servers than workers a worker's port binds, the servers' answers queue
    behind it and look slower than the link is; so there the busy periods of every
    worker's pushes (its pieces to every server) are fitted too, and the fit with the
    lower beta (the side that ran at its cap) is taken for every port."""
    servers = [nt for nt in gt.nodes.values() if nt.info.role == "server"]
    workers = [nt for nt in gt.nodes.values() if nt.info.role == "worker"]
    sides = [(servers, _pull_pieces)] + ([(workers, _push_pieces)] if len(servers) > len(workers) else [])
    fits = []
    for nodes, pieces_of in sides:
        rows = [(p.pieces, p.bytes, p.duration_us) for nt in nodes for pieces in pieces_of(nt, steps).values()
                for p in busy_periods([(a, b, nbytes, 0) for a, b, nbytes in pieces])]
        if fit := _lad_link([r for r in rows if r[1] > 0 and r[2] > 0]):
            fits.append(fit)
    return min(fits, key=lambda f: f.beta) if fits else None


def _lad_link(rows: list[tuple[float, float, float]]) -> LinkCost | None:
    """(messages, bytes, µs) rows -> LinkCost (:func:`~dpro.graph.comm_model.lad_link_cost`)."""
    if not rows:
        return None
    A = np.array([[m, b] for m, b, _ in rows], dtype=float)
    return lad_link_cost(A, np.array([t for *_, t in rows], dtype=float))


def _push_pieces(nt: NodeTrace, steps: list[int]) -> dict[int, list[tuple[float, float, int]]]:
    """Per step: (start, end, bytes) of each piece a worker pushed (request to answer)."""
    use = set(steps)
    out: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    for e in nt.events:
        op = nt.ops.get(e.op)
        if e.step in use and op is not None and op.sub_op == "PUSH_REQ":
            out[e.step].append((e.ts, e.ts + e.dur, int(op.bytes)))
    return out


def _pull_pieces(nt: NodeTrace, steps: list[int]) -> dict[int, list[tuple[float, float, int]]]:
    """Per step: (start, end, bytes) of each piece answered, over all workers."""
    use = set(steps)
    span: dict[tuple[int, str], list[float]] = {}
    for e in nt.events:
        op = nt.ops.get(e.op)
        if e.step not in use or op is None or op.sub_op != "PULL_REQ":
            continue
        key = (e.step, (op.txn or op.id).rsplit(".w", 1)[0])
        s = span.setdefault(key, [e.ts, e.ts + e.dur, 0])
        s[0], s[1], s[2] = min(s[0], e.ts), max(s[1], e.ts + e.dur), s[2] + op.bytes
    out: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    for (step, _), (a, b, nbytes) in span.items():
        out[step].append((a, b, int(nbytes)))
    return out


def fit_update(gt: GTrace, steps: list[int]) -> tuple[float, float]:
    """A server's aggregate+update time per piece: (µs, µs per byte), from its ``UPDATE`` ops;
    a piece's bytes are those pushed to that server."""
    use = set(steps)
    rows: list[tuple[float, float]] = []
    for nt in gt.nodes.values():
        if nt.info.role != "server":
            continue
        nbytes: dict[str, int] = {}
        for op in nt.ops.values():
            if op.sub_op == "PUSH_RES" and op.tensor:
                nbytes[base_name(op.tensor)] = op.bytes
        for e in nt.events:
            op = nt.ops.get(e.op)
            if e.step in use and op is not None and op.cat == "UPDATE" and op.id.startswith("update:"):
                b = nbytes.get(op.id.split(":", 1)[1])
                if b:
                    rows.append((float(b), e.dur))
    if not rows:
        return 0.0, 0.0
    A = np.array([[1.0, b] for b, _ in rows])
    y = np.array([t for _, t in rows])
    return lad_nonneg(A, y)
