"""The cost models of scale-out what-ifs (µs, bytes).

* **Collectives** (:func:`allreduce_us`): a ring all-reduce of B bytes over N ranks is
  2(N-1) steps of ``alpha + beta * B/N`` (dpro.graph.comm_model); a tree (reduce, then
  broadcast, whole message per level) is 2⌈log2 N⌉ steps of ``alpha + beta * B``.
* **Stream multiplexing** (:func:`multiplex`), the asynchronous-SGD simulator's model of
  several streams (tensors) on one connection: each stream is first sent up to the control
  window, in the order the streams arrived; then the streams still pending run to
  completion, one after another in that order.
* **Bandwidth sharing** (:func:`share_bandwidth`): the flows through one port in the same
  phase share its bandwidth equally (processor sharing): while n flows are active each
  moves ``bandwidth / n`` bytes per µs.
"""

from __future__ import annotations

import heapq
import math

from dpro.graph.platform import Transfer
from dpro.whatif.fairshare import transfer_ends

_PORT = "port"



def allreduce_us(nbytes: float, n: int, cost: Transfer, algorithm: str = "ring") -> float:
    """Time of one all-reduce of ``nbytes`` over ``n`` ranks (0 for one rank)."""
    if n <= 1:
        return 0.0
    if algorithm == "ring":
        return 2 * (n - 1) * cost.us(nbytes / n)
    if algorithm == "tree":
        return 2 * math.ceil(math.log2(n)) * cost.us(nbytes)
    raise ValueError(f"unknown all-reduce algorithm {algorithm!r} (ring, tree)")


def multiplex(streams: list[tuple[float, float]], window: float, cost: Transfer) -> list[float]:
    """End time of each stream ``(arrival µs, bytes)`` sent over one connection.

    The connection sends one piece at a time: a stream's first ``window`` bytes (its head)
    as soon as it is the earliest arrived head waiting, and the rest (its tail) only when no
    head waits, tails in arrival order. A head costs ``cost.us(bytes)`` (the message's
    overhead ``alpha`` is paid once, with its head), a tail ``beta * bytes``. With every stream arrived at 0 this is the simulator's
    model: each stream up to the window, then the pending ones to completion."""
    order = sorted(range(len(streams)), key=lambda i: (streams[i][0], i))
    heads = [(streams[i][0], i) for i in order]
    heapq.heapify(heads)
    tails: list[tuple[float, int]] = []  # (arrival, index): ready since its head ended
    ends = [0.0] * len(streams)
    t = 0.0
    while heads or tails:
        if heads and (heads[0][0] <= t or not tails):
            arr, i = heapq.heappop(heads)
            size = streams[i][1]
            t = max(t, arr) + cost.us(min(size, window))
            if size > window:
                heapq.heappush(tails, (arr, i))
            else:
                ends[i] = t
        else:
            _, i = heapq.heappop(tails)
            t += cost.beta * (streams[i][1] - window)
            ends[i] = t
    return ends


def share_bandwidth(flows: list[tuple[float, float]], bandwidth: float) -> list[float]:
    """End time of each flow ``(start µs, bytes)`` through one port of ``bandwidth``
    bytes/µs shared equally among the flows active at each moment (the one-resource case
    of :func:`dpro.whatif.fairshare.transfer_ends`)."""
    return transfer_ends([(start, size, (_PORT,)) for start, size in flows], {_PORT: bandwidth})
