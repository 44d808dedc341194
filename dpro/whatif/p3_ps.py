"""P3 on a parameter server (Jayarajan et al., MLSys'19): sliced keys, layer order, steady state.

The ``p3`` what-if on a PS scale-out (``dpro whatif PS-TRACE --workers N --apply
p3:slice_bytes=B``) re-costs a synchronous worker's step as P3 runs it:

* every gradient is cut into slices of at most ``B`` bytes, each its own key (placed on
  the servers as MXNet places a key: ``(key*9973) % M``, keys numbered in layer order);
  each slice is a push message, the server's update of it and a pull message, on the
  same connections and links as :func:`~dpro.whatif.scaleout._ps_point`'s messages;
* a slice message pays its per-message cost as ps-lite does: the sender's work on it
  (ps-lite's calibrated CPU per message, ``--cpu-cost``; else the link's ``alpha``), one
  message at a time, then its bytes on the wire, so the next slice's work overlaps this
  one's bytes (:func:`~dpro.whatif.scaleout.slice_message_us`): the per-message cost is
  not charged serially with the wire (a fitted intercept charged per slice made the
  prediction follow the fit, not the job);
* the slices are handed to the library once the backward has produced every gradient,
  first layer first, and each connection sends them in that order (a slice at a time:
  stock ps-lite sends first-in first-out what it was given, and P3's rule puts the first
  layer first);
* there is no barrier between steps: the next forward's layer waits only for its own
  parameters' slices (and the pulls of the last layers overlap the first layers' forward).

One iteration's graph cannot show that overlap (it ends with the last pull), so the step
is the **steady-state period** of :data:`ITERATIONS` chained copies of the iteration:
copy ``k+1``'s forward starts after copy ``k``'s backward, and each of its layers after
copy ``k``'s pulls (and copy) of that layer's parameters. The period is the time between
the ends of the last two copies' backward passes, where the P3 job takes its step's
wall clock too (examples/mxnet/train_ps.py ``--p3``).

A layer's forward op is found by name as the mirror of the backward op that produced its
gradient (MXNet: ``_backward_X#j`` of ``n`` ops ``X`` -> ``X#(n-1-j)``); a gradient
without one (a bulked segment) gates the whole forward (the first forward op).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dpro.whatif.graph import Op, WhatIfGraph

#: chained copies of the iteration; the period is measured between the last two
ITERATIONS = 4
#: priority offset between copies (µs-sized keys of one copy stay below it)
_COPY = 1e12

_BACKWARD = re.compile(r"^(?P<node>.*/)_backward_(?P<op>[^@#/]+)(?P<dev>@[^#]*)#(?P<i>\d+)$")


@dataclass
class Slice:
    """One P3 key: ``bytes`` of tensor ``tensor`` on server ``server``; ``key`` is its
    global index in layer order (its send order)."""

    tensor: str
    key: int
    server: int
    bytes: int


def slices(tensors: list[tuple[str, int]], slice_bytes: int, servers: int) -> list[Slice]:
    """``tensors`` ``(name, bytes)`` in layer order cut into slices of at most
    ``slice_bytes`` (the last of a tensor takes the rest), keys numbered in that order,
    each on server ``(key*9973) % servers`` (MXNet's placement of a key)."""
    from dpro.optimizer.ps.layout import mxnet_home

    if slice_bytes < 1:
        raise ValueError(f"p3: slice_bytes must be >= 1, got {slice_bytes}")
    out: list[Slice] = []
    for name, nbytes in tensors:
        if nbytes <= 0:
            continue
        for a in range(0, nbytes, slice_bytes):
            k = len(out)
            out.append(Slice(name, k, mxnet_home(k, servers), min(slice_bytes, nbytes - a)))
    return out


def mirror_forward(g: WhatIfGraph, producer: Op) -> Op | None:
    """The forward op of the layer whose backward op is ``producer`` (MXNet's names:
    ``_backward_X#j`` of ``n`` ops ``X`` on the node -> ``X#(n-1-j)``), or None."""
    m = _BACKWARD.match(producer.name)
    if not m:
        return None
    stem = f"{m['node']}{m['op']}{m['dev']}#"
    fw = {op.name: op for op in g.ops.values() if op.cat == "FW" and op.name.startswith(stem)}
    n = len(fw)
    return fw.get(f"{stem}{n - 1 - int(m['i'])}") if n else None


@dataclass
class Iteration:
    """What the chaining needs of one iteration's P3 graph (op ids in it)."""

    #: the ops that produce the gradients (the step's sync point waits for them)
    producers: set[int]
    #: per tensor: the ops after which its new parameters are in place (its pulls' copies or pulls)
    ready: dict[str, set[int]]
    #: per tensor: the forward op that reads it (None: the whole forward)
    consumer: dict[str, int | None]
    #: the iteration's first forward op
    first_forward: int


def chain(g: WhatIfGraph, it: Iteration, copies: int = ITERATIONS) -> tuple[WhatIfGraph, list[dict[int, int]]]:
    """``copies`` copies of ``g`` in one graph, copy ``k+1`` after copy ``k`` as P3 runs
    them: its first forward op after copy ``k``'s producers, each tensor's consumer (or
    the first forward op) after copy ``k``'s ``ready`` ops of it. Each copy's ops get
    ``k * _COPY`` added to their priority (one copy's sends before the next's). Returns
    the graph and, per copy, the map from ``g``'s op ids to the chained graph's."""
    out = WhatIfGraph()
    out.link_cost, out.links, out.policy = g.link_cost, None if g.links is None else dict(g.links), g.policy
    maps: list[dict[int, int]] = []
    for k in range(copies):
        m = {}
        for i in sorted(g.ops):
            op = g.ops[i]
            c = Op(name=f"{op.name}~{k}" if k else op.name, cat=op.cat, device=op.device, dur=op.dur, gap=op.gap,
                   node=op.node, bytes=op.bytes, prio=op.prio + k * _COPY, comm_device=op.comm_device,
                   attrs=dict(op.attrs))
            m[i] = out.add(c).id
        for i, ss in g.succ.items():
            for j in ss:
                out.connect(m[i], m[j])
        if maps:
            prev = maps[-1]
            for p in it.producers:
                out.connect(prev[p], m[it.first_forward])
            for name, ready in it.ready.items():
                dst = it.consumer.get(name)
                for r in ready:
                    out.connect(prev[r], m[it.first_forward if dst is None else dst])
        maps.append(m)
    return out, maps


def period_us(g: WhatIfGraph, it: Iteration, copies: int = ITERATIONS) -> tuple[float, float]:
    """The steady-state step of P3 (µs): the mean time between the ends of the last
    copies' gradient producers in :func:`chain`, over ``copies - 2`` periods (the first
    copy starts cold), and the end of the first copy's backward (µs)."""
    if copies < 3:
        raise ValueError("p3: at least 3 chained iterations")
    h, maps = chain(g, it, copies)
    r = h.simulate()

    def end(k: int) -> float:
        return max(r.end_us(maps[k][p]) for p in it.producers)

    return (end(copies - 1) - end(1)) / (copies - 2), end(0)

