"""The three fusion rules of the search (dPRO §5, restated for our replay model).

Notation: a replayed iteration gives each op its start and end; ``t(s)`` is the time to
synchronise s bytes alone (partial replay, :func:`dpro.optimizer.evaluate.sync_time`);
``slack(x)`` is how long x could start later without lengthening the iteration.
Derivations: docs/optimizer.md.
"""

from __future__ import annotations


def op_fusion_gain(t_a: float, t_b: float, t_ab: float, delays: list[tuple[float, float]]) -> float:
    """Theorem 1 (computation-bound): fuse ops a -> b adjacent on the critical path?

    The path loses ``t_a + t_b - t_ab``; the syncs of a's outputs start ``d = t_ab - t_a``
    later, harmless iff ``d <= slack`` of their launch. ``delays`` lists ``(d, slack)``.
    Returns the gain (µs), ``<= 0`` when fusing does not pay.
    """
    gain = t_a + t_b - t_ab
    if any(d > s + 1e-9 for d, s in delays):
        return 0.0
    return gain


def tensor_fusion_gain(r2: float, e1: float, t2: float, t12: float) -> float:
    """Theorem 2 (communication-bound): sync groups q1 then q2 as one?

    Apart, q2 ends at ``max(e1, r2) + t2`` (it waits for q1 to leave the link and for its
    own gradients, ready at r2); fused, both end at ``r2 + t12`` (r2 >= r1: groups launch
    in order). Returns ``max(e1, r2) + t2 - (r2 + t12)``: fuse iff positive, i.e. iff q2
    was queued behind q1 for longer than fusing adds (``t12 - t2 < e1 - r2``).
    """
    return max(e1, r2) + t2 - (r2 + t12)


def fused_tensor_gain_after_op_fusion(t_a: float, t_b: float, t_ab: float) -> float:
    """Theorem 3: once ops a and b are fused, their gradients are ready together (r1 = r2 =
    r, so e1 = r + t_a), and Theorem 2's gain becomes ``t_a + t_b - t_ab``: fuse their
    syncs iff one sync of both is faster than two (any per-sync overhead alpha > 0)."""
    return t_a + t_b - t_ab
