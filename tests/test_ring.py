"""Ring AllReduce replay against iteration times derived on paper, and the link-cost fit.

Every worker runs FW -> BW -> (host gap G) -> AllReduce of B bytes -> UPDATE.  Durations
come out of the events exactly (dpro.graph.stats: dur = end - max(ts, latest pred end),
gap = max(0, ts - latest pred end); every profiled step is identical so the median/mean
over steps is the value itself).  Expanded into a ring of N ranks, the collective is
2(N-1) steps of t = alpha + beta * B/N on every link ``link:r->r+1``; step s on link j
needs step s-1 on links j-1 and j.  So if link i can start step 0 at S_i (the later of its
two ranks' IN), link j ends step s at max(S_i for the s+1 links j-s..j) + (s+1) t, and
after 2(N-1) >= N-1 steps every link has waited for the slowest rank:

    iteration = F + max_w BW_w + G + 2(N-1)(alpha + beta B/N) + U
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpro.graph.comm_model import LinkCost, fit_link_cost, ring_steps
from dpro.graph.global_dfg import BuildOptions
from dpro.gtrace.schema import Event, GTrace, Manifest, NodeInfo, NodeTrace, Op
from dpro.replayer.critical_path import critical_path_indices
from dpro.replayer.replay import replay

F, BW, G, U = 100.0, 200.0, 5.0, 30.0
ALPHA, BETA = 3.0, 2.0**-10  # µs per step, µs per byte (~1 GB/s)


def ring_trace(n: int, bw: list[float], nbytes: int, coll_us: float = 50.0, steps: int = 3) -> GTrace:
    """N workers, one AllReduce (txn "ar0") each; the collective ends at the same moment on
    every rank, coll_us after the last rank issued it (what the trace of a real one shows)."""
    infos = [NodeInfo(f"worker{w}", "worker", w, "host0") for w in range(n)]
    nodes = {}
    for w, info in enumerate(infos):
        ops = {
            "fw": Op("fw", "conv.fwd", "FW", "cuda:0"),
            "bw": Op("bw", "conv.bwd", "BW", "cuda:0"),
            "ar": Op("ar", "allreduce", "COMM", "comm", sub_op="ALLREDUCE", tensor="grad", bytes=nbytes, txn="ar0"),
            "upd": Op("upd", "sgd", "UPDATE", "cuda:0"),
        }
        nt = NodeTrace(info, ops, [("fw", "bw"), ("bw", "ar"), ("ar", "upd")])
        for s in range(steps):
            t0 = 10_000.0 * s + 7.0 * w  # node clocks need not agree
            last_issue = t0 + F + max(bw) + G
            ar_ts = t0 + F + bw[w] + G
            ar_end = last_issue + coll_us
            nt.events += [
                Event("fw", s, t0, F),
                Event("bw", s, t0 + F, bw[w]),
                Event("ar", s, ar_ts, ar_end - ar_ts),
                Event("upd", s, ar_end, U),
            ]
            nt.steps[s] = (t0, ar_end + U - t0)
        nodes[info.name] = nt
    man = Manifest("pytorch", "allreduce", "gloo", n, infos, list(range(steps)))
    return GTrace(man, nodes)


def step_us(n: int, nbytes: int) -> float:
    return ALPHA + BETA * nbytes / n


def formula(n: int, bw: list[float], nbytes: int) -> float:
    return F + max(bw) + G + ring_steps(n) * step_us(n, nbytes) + U


OPTS = BuildOptions(link_cost=LinkCost(ALPHA, BETA))


@pytest.mark.parametrize("n", [2, 4])
def test_ring_iteration_time(n):
    nbytes = 1 << 20
    bw = [BW] * n
    r = replay(ring_trace(n, bw, nbytes), OPTS)
    assert ring_steps(n) == 2 * (n - 1)
    # n=2: 100 + 200 + 5 + 2 * (3 + 512) + 30 = 1365;  n=4: 335 + 6 * (3 + 256) = 1889
    assert r.predicted_iteration_us == pytest.approx({2: 1365.0, 4: 1889.0}[n], abs=1e-9)
    assert r.predicted_iteration_us == pytest.approx(formula(n, bw, nbytes), abs=1e-9)
    g = r.graph
    # per worker fw, bw, upd, IN, OUT; the ring: 2(N-1) steps on N links
    assert g.n == 5 * n + 2 * (n - 1) * n
    assert {2: 14, 4: 44}[n] == g.n
    # per worker fw->bw, bw->IN, OUT->upd; two inputs per ring op; OUT waits for two links
    assert len(g.succ_idx) == 3 * n + 2 * 2 * (n - 1) * n + 2 * n
    assert sorted(d for d in g.devices if d.startswith("link:")) == sorted(f"link:{r_}->{(r_ + 1) % n}" for r_ in range(n))
    assert r.build.expanded == 1 and r.build.kept_coarse == 0
    ring = [i for i, name in enumerate(g.names) if "/ring" in name]
    assert len(ring) == 2 * (n - 1) * n
    assert np.allclose(g.dur[ring], step_us(n, nbytes))
    # the measured trace had the collective take 50 µs; the model says otherwise
    assert r.measured_iteration_us == pytest.approx(F + BW + G + 50.0 + U)


@pytest.mark.parametrize("n,slow", [(2, 1), (4, 0), (4, 2)])
def test_ring_waits_for_the_slowest_rank(n, slow):
    nbytes = 1 << 16
    delta = 40.0
    bw = [BW + (delta if w == slow else 0.0) for w in range(n)]
    r = replay(ring_trace(n, bw, nbytes), OPTS)
    assert r.predicted_iteration_us == pytest.approx(formula(n, bw, nbytes), abs=1e-9)
    assert r.predicted_iteration_us == pytest.approx(F + BW + delta + G + ring_steps(n) * step_us(n, nbytes) + U)
    g, s = r.graph, r.schedule
    t = step_us(n, nbytes)
    issue = [F + bw[w] + G for w in range(n)]  # when rank w's IN ends
    start0 = [max(issue[j], issue[(j + 1) % n]) for j in range(n)]
    idx = {name: i for i, name in enumerate(g.names)}
    for step in range(ring_steps(n)):
        for j in range(n):
            i = idx[f"ar0/ring{step}/{j}->{(j + 1) % n}"]
            expect = max(start0[(j - k) % n] for k in range(min(step + 1, n))) + step * t
            assert s.start[i] == pytest.approx(expect, abs=1e-9), (step, j)
    # every rank leaves the collective at the same moment
    outs = [s.end[idx[f"worker{w}/ar:OUT"]] for w in range(n)]
    assert outs == pytest.approx([F + BW + delta + G + ring_steps(n) * t] * n)
    # the critical path starts on the slow rank and crosses all 2(N-1) ring steps
    path = [g.names[i] for i in critical_path_indices(s)]
    assert path[:3] == [f"worker{slow}/fw", f"worker{slow}/bw", f"worker{slow}/ar:IN"]
    assert sum("/ring" in p for p in path) == ring_steps(n)
    assert path[-2].endswith("ar:OUT") and path[-1].endswith("/upd")
    assert [p.name for p in r.critical_path] == path


def test_no_expansion_keeps_measured_collective():
    n, nbytes = 4, 1 << 16
    r = replay(ring_trace(n, [BW] * n, nbytes, coll_us=80.0), BuildOptions(expand_collectives=False))
    assert r.graph.n == 4 * n
    assert r.build.expanded == 0 and r.build.kept_coarse == 1
    assert r.predicted_iteration_us == pytest.approx(F + BW + G + 80.0 + U)


@pytest.mark.parametrize("n", [2, 4])
def test_fitted_link_cost_reproduces_the_measured_iteration(n):
    # One collective size only: the fit is bandwidth-only and the ring lasts exactly as long
    # as the measured collective did (from the last rank's issue to its end).
    nbytes = 1 << 20
    coll = 64.0
    bw = [BW] * n
    bw[-1] += 16.0
    r = replay(ring_trace(n, bw, nbytes, coll_us=coll), BuildOptions())
    lc = r.build.link_cost
    assert lc is not None
    assert ring_steps(n) * lc.step_us(nbytes / n) == pytest.approx(coll)
    assert r.predicted_iteration_us == pytest.approx(r.measured_iteration_us)
    assert r.predicted_iteration_us == pytest.approx(F + BW + 16.0 + G + coll + U)


# ---------------------------------------------------------------- fit_link_cost
# samples: (collectives m in the busy period, total bytes B, ranks N, duration µs), the
# model: T = 2(N-1) * (m * alpha + beta * B / N).


def model(m: int, b: int, n: int, alpha: float, beta: float) -> float:
    return ring_steps(n) * (m * alpha + beta * b / n)


def test_fit_recovers_alpha_beta():
    alpha, beta = 4.0, 0.002
    samples = [(m, b, n, model(m, b, n, alpha, beta)) for m in (1, 3) for b in (10_000, 100_000, 1_000_000) for n in (2, 4, 8)]
    lc = fit_link_cost(samples)
    assert lc is not None
    assert lc.alpha == pytest.approx(alpha, rel=1e-9)
    assert lc.beta == pytest.approx(beta, rel=1e-9)
    assert lc.samples == len(samples)
    assert lc.fit_error == pytest.approx(0.0, abs=1e-9)


def test_fit_is_robust_to_one_slow_sample():
    alpha, beta = 4.0, 0.002
    samples = [(1, b, 4, model(1, b, 4, alpha, beta)) for b in (10_000, 50_000, 100_000, 500_000, 1_000_000)] * 3
    samples.append((1, 100_000, 4, 10 * model(1, 100_000, 4, alpha, beta)))
    lc = fit_link_cost(samples)
    assert lc.alpha == pytest.approx(alpha, rel=1e-6) and lc.beta == pytest.approx(beta, rel=1e-6)


def test_fit_pure_latency_and_pure_bandwidth():
    lc = fit_link_cost([(1, b, 4, model(1, b, 4, 0.0, 0.001)) for b in (4096, 65536, 1 << 20)])
    assert lc.alpha == pytest.approx(0.0, abs=1e-12) and lc.beta == pytest.approx(0.001)
    lc = fit_link_cost([(1, b, 4, model(1, b, 4, 7.0, 0.0)) for b in (4096, 65536, 1 << 20)])
    assert lc.alpha == pytest.approx(7.0) and lc.beta == pytest.approx(0.0, abs=1e-12)


def test_fit_one_size_only_is_bandwidth_only():
    # 2 ranks, 2048 bytes, 4096 µs: 2 steps of 1024 bytes -> beta = 2 µs/byte, alpha = 0
    lc = fit_link_cost([(1, 2048, 2, 4096.0)] * 3)
    assert (lc.alpha, lc.beta) == (0.0, 2.0)
    assert lc.samples == 3 and lc.fit_error == 0.0


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**8), st.integers(2, 128), st.floats(0.5, 1e6), st.integers(1, 4))
def test_fit_one_size_only_is_bandwidth_only_whatever_the_rounding(nbytes, n, t, copies):
    # both one-coefficient fits are exact here; the tie must not be decided by rounding
    # (it once was: fit_link_cost([(1, 1011, 4, 30.0)]) came out latency-only)
    lc = fit_link_cost([(1, nbytes, n, t)] * copies)
    assert lc.alpha == 0.0
    assert lc.beta == pytest.approx(t / (ring_steps(n) * nbytes / n), rel=1e-12)


@pytest.mark.parametrize(
    "samples",
    [
        [],
        [(1, 0, 4, 100.0)],  # zero bytes
        [(1, 1 << 20, 1, 100.0)],  # single rank
        [(1, 1 << 20, 4, 0.0)],  # zero duration
        [(0, 1 << 20, 4, 100.0)],  # no collective
        [(1, 0, 4, 100.0), (1, 1 << 20, 1, 50.0)],
    ],
)
def test_fit_degenerate_is_none(samples):
    assert fit_link_cost(samples) is None


def test_fit_ignores_unusable_samples():
    good = [(1, b, 4, model(1, b, 4, 2.0, 0.01)) for b in (1000, 100_000)]
    lc = fit_link_cost(good + [(1, 0, 4, 5.0), (1, 1000, 1, 5.0)])
    assert lc.samples == 2
    assert lc.alpha == pytest.approx(2.0) and lc.beta == pytest.approx(0.01)


def test_fit_counts_shapes_latency_known_only_with_two():
    one = fit_link_cost([(1, 2048, 2, 4096.0)] * 3)
    assert one.shapes == 1 and not one.latency_known
    two = fit_link_cost([(1, b, 4, model(1, b, 4, 2.0, 0.01)) for b in (1000, 100_000)])
    assert two.shapes == 2 and two.latency_known
    assert LinkCost(1.0, 0.001).latency_known  # given, not fitted
