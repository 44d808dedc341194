"""Where a parameter-server job's gradients go: MXNet's placement of each key's pieces.

MXNet (``src/kvstore/kvstore_dist.h``, ``EncodeDefaultKey``) sends an array of fewer than
``MXNET_KVSTORE_BIGARRAY_BOUND`` elements (default 1 000 000) whole to server
``(key * 9973) % S``, and splits a larger one evenly across all S servers. With a few large
layers this can leave one server with most of the bytes; a lower bound spreads them
(and pipelines a layer's pieces), a higher one sends fewer messages. What a server costs:
:mod:`dpro.optimizer.ps.costs`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from dpro.gtrace.schema import NodeTrace

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


def key_index(rep: NodeTrace | None) -> dict[str, int]:
    """Tensor name -> its kvstore key, from the key map the recorder kept in ``rep.meta``
    (empty without one)."""
    keymap = rep.meta.get("keys") if rep is not None and isinstance(rep.meta.get("keys"), dict) else {}
    return {str(v): int(k) for k, v in keymap.items() if str(k).isdigit()}


def layout(rep: NodeTrace, names: list[str], sizes: list[int], shapes: list[tuple[int, ...]],
           seen: list[list[int]], servers: int, bound: int) -> tuple[PsLayout, list[str]]:
    """The layout of units ``names`` (their bytes, shapes and the servers the profile sent
    them to); notes where the profile does not follow MXNet's placement rule."""
    key_of = key_index(rep)
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
