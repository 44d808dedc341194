"""Scale-out of all-reduce jobs (issue #28, Horovod under a bandwidth cap): the ring cost of
a Horovod profile fitted on its fused spans, and ranks computing in lockstep on shared cores.
Hand-computed expectations."""

from __future__ import annotations

import pytest

from dpro.whatif.graph import Op, WhatIfGraph
from dpro.whatif.horovod_spans import SpanFit, fit_spans, give_back_excess
from dpro.whatif.models import Transfer
from dpro.whatif.scaleout import (Cluster, _allreduce_point, _oversubscribed, _simulate_point, deflate_lockstep,
                                  lockstep_factor)


def _group(atoms: list[int], nbytes: int, start: float, end: float, excess: float) -> dict:
    return {"atoms": atoms, "bytes": nbytes, "start_us": start, "end_us": end, "excess_us": excess}


def test_ring_cost_fitted_on_the_typical_fused_span():
    """2 ranks, a ring of m atoms and B bytes costs 2(m*alpha + beta*B/2). A (1 atom, 1000 B,
    30 µs), C (1 atom, 10 kB, 120 µs) and B (2 atoms, 100 kB, 1040 µs) lie on alpha = 10,
    beta = 0.01; the small message ("fast", 100 B) took 5 and 25 µs where that line says 21
    (the importer's envelope would take its 5 µs as the uncontended cost). Least absolute
    deviations follows A, B, C. Gap changes, mean over the 2 steps of (span - cost -
    importer's excess): fast (5-21-0 + 25-21-20)/2 = -16, A 30-30-7 = -7, C 0, B -300."""
    atoms = [{"op": f"c#{i}"} for i in range(5)]
    step = lambda fast_end, fast_excess: [_group([0], 100, 0, fast_end, fast_excess),  # noqa: E731
                                          _group([1], 1000, 10, 40, 7), _group([2], 10_000, 50, 170, 0),
                                          _group([3, 4], 100_000, 200, 1240, 300)]
    fit = fit_spans({"1": step(5, 0), "2": step(25, 20), "9": step(1, 0)}, atoms, 2, ["1", "2"])
    assert fit.samples == 8
    assert (fit.transfer.alpha, fit.transfer.beta) == (pytest.approx(10.0), pytest.approx(0.01))
    assert fit.gap_delta == {"c#0": pytest.approx(-16.0), "c#1": pytest.approx(-7.0), "c#2": pytest.approx(0.0, abs=1e-9),
                             "c#3": pytest.approx(-300.0)}
    assert fit_spans({"1": step(5, 0)}, atoms, 1, ["1"]) is None  # one rank: no ring
    assert fit_spans({"1": [{"atoms": [0]}]}, atoms, 2, ["1"]) is None  # nothing usable


def test_excess_given_back_to_the_collectives_gaps():
    g = WhatIfGraph()
    ar = [g.add(Op(name=f"w0/c#{i}", cat="COMM", device="w0/comm", dur=1.0, gap=gap, node="w0", comm_device=True,
                   attrs={"sub_op": "ALLREDUCE"})) for i, gap in ((0, 30.0), (3, 250.0), (7, 5.0))]
    fw = g.add(Op(name="w0/c#1", cat="FW", device="w0/cpu", dur=1.0, gap=9.0, node="w0"))
    n = give_back_excess(g, SpanFit(Transfer(10.0, 0.01), {"c#0": -16.0, "c#1": -7.0, "c#3": -300.0}, 8))
    assert n == 2
    assert [a.gap for a in ar] == [14.0, 0.0, 5.0]  # never below 0; an op without a change keeps its gap
    assert fw.gap == 9.0  # only all-reduces


@pytest.mark.parametrize("n, cores, pinned, expected", [(2, 2, True, 1.0), (3, 2, True, 2.0), (4, 2, True, 2.0),
                                                        (5, 2, True, 3.0), (3, 2, False, 1.5), (4, 2, False, 2.0),
                                                        (8, None, False, 1.0)])
def test_lockstep_factor(n, cores, pinned, expected):
    assert lockstep_factor(n, cores, pinned) == expected


def _step(gap: float = 10.0) -> tuple[WhatIfGraph, Op, Op]:
    """fw (100 µs own time, 10 µs host gap), then an all-reduce of 400 bytes."""
    g = WhatIfGraph()
    fw = g.add(Op(name="fw", cat="FW", device="cpu", dur=100.0, gap=gap, node="w0"))
    ar = g.insert([fw], Op(name="ar", cat="COMM", device="link", dur=150.0, comm_device=True, bytes=400, node="w0",
                           attrs={"sub_op": "ALLREDUCE"}))
    return g, fw, ar


@pytest.mark.parametrize("n, pinned, expected", [(2, True, 260.0), (3, True, 370.0), (4, True, 370.0),
                                                 (3, False, 315.0), (4, False, 370.0), (5, True, 480.0)])
def test_ranks_compute_in_lockstep(n, pinned, expected):
    """fw then an all-reduce of 150 µs; N ranks on 2 cores compute at the same moment, the
    network waits lend no core: fw takes (dur + gap) * k, k = ceil(N/2) pinned or N/2:
    3 pinned: 2*110 + 150 = 370; 3 free: 1.5*110 + 150 = 315; 5 pinned: 3*110 + 150 = 480.
    The CPU bound (N*110/2, pinned ceil(N/2)*110) is below all of these. Without lockstep
    (a PS job) 4 ranks still take 110 + 150 = 260."""
    g, _, _ = _step()
    c = Cluster(n, host_cores=2, pinned=pinned)
    assert _oversubscribed(g, c, lambda h: _simulate_point(h, n, None), lockstep=True).iteration_us == \
        pytest.approx(expected, rel=1e-4)
    assert _oversubscribed(g, Cluster(4, host_cores=2), lambda h: _simulate_point(h, 4, None)).iteration_us == \
        pytest.approx(260.0, rel=1e-4)


def test_allreduce_point_is_lockstep_and_a_lockstep_profile_is_deflated():
    """The all-reduce's ring at 3 ranks: 2*2*(0 + 0.375*400/3) = 200 µs; 3 pinned ranks on 2
    cores: fw 2*110 = 220, 420 µs. A profile of those 3 ranks (fw measured 200 µs, gap 20)
    is deflated by 2 to the rank alone (100, 10) and replays its own 420 µs again."""
    g, fw, ar = _step()
    c = Cluster(3, host_cores=2, pinned=True)
    assert _allreduce_point(g.copy(), c, Transfer(0.0, 0.375)).iteration_us == pytest.approx(420.0, rel=1e-4)
    prof, pfw, par = _step(gap=20.0)
    pfw.dur = 200.0
    assert deflate_lockstep(prof, c, 3) == 2.0
    assert (pfw.dur, pfw.gap, par.dur) == (100.0, 10.0, 150.0)  # the collective is not computation
    assert _allreduce_point(prof, c, Transfer(0.0, 0.375)).iteration_us == pytest.approx(420.0, rel=1e-4)
    assert deflate_lockstep(g, Cluster(2, host_cores=2, pinned=True), 2) == 1.0
