"""Which profiled steps the replayer averages over (dpro.graph.stats.typical_steps)."""

from __future__ import annotations

from types import SimpleNamespace

from dpro.graph.stats import typical_steps


def nodes(*per_node: list[float]) -> list:
    """Node stand-ins with only step durations (typical_steps reads nothing else)."""
    return [SimpleNamespace(steps={s: (0.0, d) for s, d in enumerate(durs)}) for durs in per_node]


def test_trim_drops_a_fifth_from_each_end():
    ns = nodes([100, 101, 102, 103, 104, 105, 106, 107, 108, 109])
    assert typical_steps(ns, list(range(10))) == [2, 3, 4, 5, 6, 7]


def test_staggered_stalls_are_dropped():
    # the stall recorded in CI: rank 1 stalled in step 7 (UPDATE), rank 0 waited for it in
    # step 8; another stall in step 9. By the mean over ranks the trim keeps step 8.
    r0 = [132, 112, 116, 110, 116, 123, 130, 135, 612, 451]
    r1 = [135, 102, 114, 108, 115, 129, 126, 632, 128, 445]
    keep = typical_steps(nodes(r0, r1), list(range(10)))
    assert not {7, 8, 9} & set(keep)
    assert len(keep) == 5
    assert {7, 9} <= set(range(10)) - set(typical_steps(nodes(r0, r1), list(range(10)), stall=100.0))
    assert 8 in typical_steps(nodes(r0, r1), list(range(10)), stall=100.0)


def test_short_or_even_runs_keep_their_steps():
    assert typical_steps(nodes([100, 120, 110, 105]), [0, 1, 2, 3]) == [0, 1, 2, 3]
    assert typical_steps(nodes([]), []) == []
    # a job whose every other step is slow (e.g. a periodic sync) is no stall
    assert len(typical_steps(nodes([100, 250] * 5), list(range(10)))) == 6
