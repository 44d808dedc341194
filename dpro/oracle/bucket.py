"""A token bucket (a ``tc tbf`` cap, a NIC's burst credit) over the messages of a step.

A bucket of depth K bytes refills at the capped rate 1/β (bytes per µs) up to K; a message
of b bytes takes the tokens there are and goes at the line rate (``beta_burst`` µs per
byte) while they last, the rest at the capped rate β (during which every token that
arrives is spent at once: the bucket stays empty). Between two messages the bucket refills
for the idle time g: the compute between them and the calls' per-call α (the ranks'
wake-up and handshake, when no byte moves). So the wire time of a message depends on the
level the messages before it left, not on one gap alone:

    level = min(K, level + g/β);  fast = min(b, level);  level -= fast
    W = β_b·fast + β·(b − fast)

A step repeats: :func:`steady_wires` runs the step's messages in turn until the level at
the step's start comes back (the steady state of a long training run) and gives each
message its wire time there. :func:`stream_alpha` inverts the same recursion for a
calibration sample of back-to-back calls. Units: µs, bytes. The cost objects are
:class:`dpro.oracle.calibration.Cost` (``alpha``, ``beta``, ``burst``, ``beta_burst``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dpro.oracle.calibration import Cost

#: bisection steps for the steady state's level (the bucket's depth / 2**50: far below a byte)
BISECT = 50


@dataclass(frozen=True, slots=True)
class Message:
    """A collective as the bucket of one rank's link sees it: ``cost`` (its kind's fit),
    ``calls`` per-call α (ring steps) before its bytes, ``sent`` bytes through the link;
    ``times``: how often the step charges it, ``through``: how often it passes one rank's
    link per step (a pipeline's transfers: the critical path charges 2(p+S−2), one stage's
    link carries S or 2S; else ``times``)."""

    cost: Cost
    calls: float
    sent: float
    times: int = 1
    through: int = 1


def key(cost: Cost, sent: float) -> tuple[Cost, int]:
    """A message's key in :func:`steady_wires`' table (bytes rounded: the same message
    computed in another order of float operations is the same message)."""
    return cost, round(sent)


def send(cost: Cost, level: float, idle_us: float, sent: float) -> tuple[float, float]:
    """(wire µs, level after) of one message of ``sent`` bytes after ``idle_us`` of
    refill, the bucket holding ``level`` bytes before it. A cost without a bucket: βS,
    the level untouched."""
    if cost.burst <= 0 or cost.beta <= 0:
        return cost.beta * sent, level
    level = min(cost.burst, level + max(0.0, idle_us) / cost.beta)
    fast = min(sent, level)
    return cost.beta_burst * fast + cost.beta * (sent - fast), level - fast


def drain(cost: Cost, level: float, idle_us: float, sent: float, n: int) -> tuple[float, float]:
    """(total wire µs, level after) of ``n`` equal messages, each after ``idle_us``:
    :func:`send` ``n`` times, the runs where every message goes whole at the line rate and
    the level moves by the same R − b each time taken in one step (R = idle/β the refill),
    and the rest once the level stops moving."""
    if n <= 0:
        return 0.0, level
    if cost.burst <= 0 or cost.beta <= 0:
        return n * cost.beta * sent, level
    K, R = cost.burst, max(0.0, idle_us) / cost.beta
    total, left = 0.0, n
    while left > 0:
        top = level + R
        if sent <= top <= K and R != sent:  # every message fast, the level drifts by d
            d = R - sent
            k = math.floor((K - top) / d) + 1 if d > 0 else math.floor((top - sent) / -d) + 1
            k = max(1, min(k, left))
            total += k * cost.beta_burst * sent
            level = min(K, max(0.0, level + k * d))
            left -= k
            continue
        w, after = send(cost, level, idle_us, sent)
        total += w
        left -= 1
        if abs(after - level) <= 1e-9 * K:  # a fixed point: the rest go the same way
            total += left * w
            left = 0
        level = after
    return total, level


def _cycle(msgs: list[Message], gap_us: float, level: float) -> tuple[float, dict[tuple[Cost, int], tuple[float, int]]]:
    """One step from ``level``: (level after, {key: (total wire µs, messages)})."""
    got: dict[tuple[Cost, int], tuple[float, int]] = {}
    for m in msgs:
        w, level = drain(m.cost, level, gap_us + m.calls * m.cost.alpha, m.sent, m.through)
        k = key(m.cost, m.sent)
        s, n = got.get(k, (0.0, 0))
        got[k] = (s + w, n + m.through)
    return level, got


def steady_wires(msgs: list[Message], gap_us: float) -> dict[tuple[Cost, int], float]:
    """The mean wire time (µs) per message (by :func:`key`) of a step that sends ``msgs``
    in this order, each ``through`` times, and repeats: before each message the bucket
    refills for ``gap_us`` (the compute between two messages) + the message's per-call α
    (``calls · alpha``). The steady state is the level L at the step's start that the step
    gives back: the step maps L to a level F(L), monotone and moving by at most as much as
    L, so F(L) − L falls with L, is ≤ 0 at the full bucket and ≥ 0 at the empty one; a long
    run from a full bucket settles at its largest root, found by bisection."""
    depth = max((m.cost.burst for m in msgs), default=0.0)
    lo, hi = 0.0, depth
    if _cycle(msgs, gap_us, depth)[0] >= depth - 1e-9 * depth:
        lo = depth  # the step gives the full bucket back
    for _ in range(BISECT if lo < depth else 0):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _cycle(msgs, gap_us, mid)[0] >= mid else (lo, mid)
    got = _cycle(msgs, gap_us, lo)[1]
    return {k: s / n for k, (s, n) in got.items() if n}


def stream_wire(cost: Cost, steps: float, sent: float, calls: int, alpha: float) -> float:
    """Total wire µs of ``calls`` back-to-back calls of ``sent`` bytes each from a full
    bucket (a calibration sample after its idle), the bucket refilling during each call's
    ``steps · alpha``."""
    return drain(cost, cost.burst, steps * alpha, sent, calls)[0]


def stream_alpha(cost: Cost, steps: float, sent: float, calls: int, t_us: float) -> float:
    """α of a sample of ``calls`` back-to-back calls taking ``t_us`` per call: the root of
    ``calls·steps·α + W(α) = calls·t`` (:func:`stream_wire`; increasing in α, since a µs
    of α refills at most a µs of capped wire). Below its value at α = 0 (the calls took
    less than the wire model allows): the shortfall per step, negative, as the samples
    are averaged."""
    total = calls * t_us

    def f(a: float) -> float:
        return calls * steps * a + stream_wire(cost, steps, sent, calls, a)

    f0 = f(0.0)
    if total <= f0:
        return (total - f0) / (calls * steps)
    lo, hi = 0.0, total / (calls * steps)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < total else (lo, mid)
    return (lo + hi) / 2
