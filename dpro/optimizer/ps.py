"""Parameter-server jobs (MXNet kvstore ``dist_*`` over ps-lite): where each gradient's
pieces go, what a server costs, and the one setting that moves them.

MXNet (``src/kvstore/kvstore_dist.h``, ``EncodeDefaultKey``) sends an array of fewer than
``MXNET_KVSTORE_BIGARRAY_BOUND`` elements (default 1 000 000) whole to server
``(key * 9973) % S``, and splits a larger one evenly across all S servers. With a few large
layers this can leave one server with most of the bytes; a lower bound spreads them
(and pipelines a layer's pieces), a higher one sends fewer messages.

A server's costs are fitted from its own ops in the trace:

* the link: a pull answered to all N workers is ``alpha + beta * N * bytes`` on the
  server's port, a worker's pieces ``beta * bytes`` on its own (busy periods of the
  servers' ``PULL_REQ`` ops, and of the workers' ``PUSH_REQ`` ops when servers outnumber
  workers: :func:`fit_server_link`; pushes and pulls are taken to cost the same, since a
  link is capped alike both ways);
* its update: ``update_alpha + update_beta * bytes`` (the ``update:<param>`` ops).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from dpro.graph.comm_model import LinkCost, lad_link_cost, lad_nonneg
from dpro.graph.intervals import busy_periods
from dpro.gtrace.schema import GTrace, NodeTrace

_SERVER_SUFFIX = re.compile(r"@s(\d+)$")
_PIECE_SUFFIX = re.compile(r"\[s\d+\]$")


@dataclass
class PsLayout:
    """Per unit (gradient): its MXNet key, element count and home server; the servers'
    update cost; the bound the job ran with."""

    servers: int
    keys: list[int | None]
    elements: list[int]
    #: the server an unsplit unit goes to
    home: list[int]
    #: ``MXNET_KVSTORE_BIGARRAY_BOUND`` as profiled (elements)
    bound: int
    update_alpha: float = 0.0
    update_beta: float = 0.0

    def partitions(self, bound: int) -> tuple[int, ...]:
        """Pieces per unit under ``bound``: all servers for an array of at least ``bound``
        elements, else 1."""
        return tuple(self.servers if e >= bound and self.servers > 1 else 1 for e in self.elements)

    @property
    def no_split_bound(self) -> int:
        """A bound above every array: nothing is split."""
        return max(self.elements, default=0) + 1

    def candidate_bounds(self) -> list[int]:
        """Bounds that give every distinct split (each unit's size: split it and all larger
        ones; and no split), largest first."""
        return sorted({e for e in self.elements if e > 0} | {self.no_split_bound}, reverse=True)


def mxnet_home(key: int, servers: int) -> int:
    return (key * 9973) % max(1, servers)


def piece_server(home: int, piece: int, servers: int) -> int:
    """The server of piece ``piece`` of a unit whose unsplit home is ``home``."""
    return (home + piece) % max(1, servers)


def base_name(tensor: str) -> str:
    """``dense1_weight[s0]`` (a piece) -> ``dense1_weight``."""
    return _PIECE_SUFFIX.sub("", tensor)


def server_of(op_id: str) -> int | None:
    m = _SERVER_SUFFIX.search(op_id)
    return int(m.group(1)) if m else None


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


def layout(rep: NodeTrace, names: list[str], sizes: list[int], shapes: list[tuple[int, ...]],
           seen: list[list[int]], servers: int, bound: int) -> tuple[PsLayout, list[str]]:
    """The layout of units ``names`` (their bytes, shapes and the servers the profile sent
    them to); notes where the profile does not follow MXNet's placement rule."""
    keymap = rep.meta.get("keys") if isinstance(rep.meta.get("keys"), dict) else {}
    key_of = {str(v): int(k) for k, v in keymap.items() if str(k).isdigit()}
    keys, elements, home, notes = [], [], [], []
    for name, nbytes, shape, srv in zip(names, sizes, shapes, seen):
        key = key_of.get(name)
        keys.append(key)
        elements.append(math.prod(shape) if shape else nbytes // 4)
        h = mxnet_home(key, servers) if key is not None else (srv[0] if srv else 0)
        if len(srv) == 1 and srv[0] != h:
            notes.append(f"{name} went to server {srv[0]}, not to MXNet's (key * 9973) % S = {h}: "
                         "the profile's placement is kept")
            h = srv[0]
        home.append(h)
    return PsLayout(servers, keys, elements, home, bound), notes
