"""CPU contention between computation and collectives (dpro.replayer.cpu_contention), on
graphs and numbers computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from dpro.graph.compiled import compile_graph
from dpro.graph.intervals import overlap, union_length
from dpro.gtrace.schema import NodeTrace
from dpro.replayer.cpu_contention import CpuShare, host_cpus, measured_share, simulate_contended


def test_overlap_with_a_union_of_intervals():
    busy_s, busy_e = np.array([2.0, 4.0, 15.0, 25.0]), np.array([5.0, 7.0, 18.0, 40.0])  # union [2,7] [15,18] [25,40]
    got = overlap(np.array([0.0, 5.0, 10.0, 0.0, 50.0]), np.array([10.0, 6.0, 20.0, 30.0, 60.0]), busy_s, busy_e)
    assert got.tolist() == [5.0, 1.0, 3.0, 13.0, 0.0]
    assert overlap(np.array([0.0]), np.array([1.0]), np.array([]), np.array([])).tolist() == [0.0]
    assert union_length(busy_s, busy_e) == 5.0 + 3.0 + 15.0


@pytest.mark.parametrize("share,loss", [
    (CpuShare(1.0, 1, 0.5), 1 / 3),   # 1.5 cores wanted, 1 had: both at 2/3 pace
    (CpuShare(2.0, 1, 0.5), 0.0),     # a spare core: no contention
    (CpuShare(1.5, 1, 1.0), 0.25),
    (CpuShare(1.0, 4, 0.5), 1 / 3),   # 4 threads on 1 core: the computation wants the core it has
])
def test_loss(share, loss):
    assert share.loss == pytest.approx(loss)


def _two_parallel(comp_us: float, xfer_us: float):
    """One host op and one transfer, independent: the two overlap from time 0."""
    return compile_graph(names=["comp", "xfer"], dur=[comp_us, xfer_us], cat=[0, 0], device=[0, 1], prio=[0.0, 0.0],
                         src=[], dst=[], devices=["cpu", "link"], device_owner=np.zeros(2, dtype=np.int64),
                         owners=["worker"], device_is_comm=np.array([False, True]))


@pytest.mark.parametrize("comp,xfer,comp_end,xfer_end", [
    (10_000.0, 10_000.0, 15_000.0, 15_000.0),  # both at 2/3 pace throughout
    (10_000.0, 4_000.0, 12_000.0, 6_000.0),    # the transfer's 4 ms at 2/3 pace: 6 ms; then the op alone
])
def test_replay_matches_processor_sharing(comp, xfer, comp_end, xfer_end):
    """With loss 1/3 (1.5 cores wanted on 1), fluid processor sharing gives these ends."""
    g = _two_parallel(comp, xfer)
    s = simulate_contended(g, np.array([True, False]), np.array([False, True]), 1 / 3)
    assert s.end[0] == pytest.approx(comp_end, rel=2e-3) and s.end[1] == pytest.approx(xfer_end, rel=2e-3)
    plain = simulate_contended(g, np.array([True, False]), np.array([False, True]), 0.0)
    assert plain.end.tolist() == [comp, xfer]


def test_measured_share_from_the_recorder_facts():
    meta = {"cpu": {"cores": 2, "threads": 1},
            "cpu_after_us": {"process": 1_500_000.0, "thread": 1_200_000.0, "calls": 20}}
    # 15 ms of other threads' CPU per call over 25 ms of collectives per step: 0.6 cores
    share = measured_share(meta, local_ranks=2, comm_busy_us=25_000.0)
    assert share == CpuShare(1.0, 1, pytest.approx(0.6))
    assert share.loss == pytest.approx(1 - 1 / 1.6)
    assert measured_share({**meta, "cpu": {"cores": 2, "threads": 2}}, 2, 25_000.0) is None  # not attributable
    assert measured_share({"cpu": meta["cpu"]}, 2, 25_000.0) is None  # an older trace
    assert measured_share(meta, 2, 0.0) is None


def test_pinned_ranks_get_a_core_each():
    """Two ranks pinned one per core each record one CPU; together they have the host's two,
    so each gets one core (not 1 / 2), as two unpinned ranks on two cores do."""
    after = {"process": 1_500_000.0, "thread": 1_200_000.0, "calls": 20}
    pinned = [{"cpu": {"cores": 1, "affinity": [r], "threads": 1}, "cpu_after_us": after} for r in (0, 1)]
    cpus = host_cpus(pinned)
    assert cpus == 2
    share = measured_share(pinned[0], 2, 25_000.0, cpus)
    assert share == CpuShare(1.0, 1, pytest.approx(0.6))
    # both ranks pinned to the same core: half a core each
    same = [{"cpu": {"cores": 1, "affinity": [0], "threads": 1}, "cpu_after_us": after}] * 2
    assert measured_share(same[0], 2, 25_000.0, host_cpus(same)).cores == 0.5
    # one rank without the fact (an older recorder): the rank's own affinity stands for the host's
    assert host_cpus([pinned[0], {"cpu": {"cores": 2, "threads": 1}}]) is None


def _worker(rank: int, cpu: dict | None) -> NodeTrace:
    """a (BW, 10 µs) produces the gradient; its all-reduce c (30 µs) runs beside d (BW, 30 µs)."""
    from dpro.gtrace.schema import Event, NodeInfo, Op

    nt = NodeTrace(NodeInfo(f"worker{rank}", "worker", rank, "h"))
    nt.ops = {"a": Op("a", "a", "BW", "cpu:main"), "d": Op("d", "d", "BW", "cpu:main"),
              "c": Op("c", "c", "COMM", "comm", sub_op="ALLREDUCE", tensor="g", bytes=4000, txn="t0")}
    nt.edges = [("a", "d"), ("a", "c")]
    steps = (5, 6, 7)
    nt.steps = {k: (1000.0 * k, 40.0) for k in steps}
    nt.events = [e for k in steps for e in (Event("a", k, 1000.0 * k, 10.0), Event("d", k, 1000.0 * k + 10, 30.0),
                                            Event("c", k, 1000.0 * k + 10, 30.0))]
    nt.meta = {"steps": list(steps), **(cpu or {})}
    return nt


@pytest.mark.parametrize("facts", [True, False])
def test_trace_is_taken_back_to_uncontended_times(facts):
    """The collectives' threads used 15 µs of CPU per 30 µs collective (kappa 0.5) on a rank
    with 1 core (2 cores, 2 ranks on the host): loss 1/3. d overlapped c for all its 30 µs:
    20 µs alone; the link cost is the collective's 30 -> 20 µs too. Without the recorder's
    facts nothing changes."""
    from dpro.graph.comm_model import LinkCost
    from dpro.gtrace.schema import GTrace, Manifest
    from dpro.optimizer.evaluate import iteration_us
    from dpro.optimizer.job_model import job_model
    from dpro.optimizer.strategy import Strategy

    cpu = {"cpu": {"cores": 2, "threads": 1}, "cpu_after_us": {"process": 400.0, "thread": 250.0, "calls": 10}}
    ws = [_worker(r, cpu if facts else None) for r in (0, 1)]
    gt = GTrace(Manifest("pytorch", "allreduce", "gloo", 2, [w.info for w in ws], [5, 6, 7]), {w.info.name: w for w in ws})
    m = job_model(gt, LinkCost(3.0, 0.003), [5, 6, 7])
    if not facts:
        assert m.cpu is None and m.ops["d"].dur == 30.0 and m.link == LinkCost(3.0, 0.003)
        return
    assert m.cpu == CpuShare(1.0, 1, pytest.approx(0.5))
    assert m.ops["d"].dur == pytest.approx(20.0)
    assert (m.link.alpha, m.link.beta) == pytest.approx((2.0, 0.002))
    assert any("CPU contention" in n and "0.50 cores" in n for n in m.notes)
    # Replayed: a, then d (20 µs) beside the two ring steps of 2000 B (2 x (2 + 0.002 x 2000)
    # = 12 µs), both at 2/3 pace while they overlap: the transfer ends at 18 µs, d (12 µs
    # done by then) at 26 µs.
    assert iteration_us(m, Strategy.from_groups(m.baseline_groups)) == pytest.approx(10.0 + 26.0, rel=1e-3)


def test_representative_worker_agrees_best_with_the_full_replay():
    """Worker 1 computes 3x longer before its collective: the one-worker model of each
    worker is compared with the full replay of the job as profiled, and the closest is
    kept (dpro.optimizer.optimize.representative)."""
    from dpro.gtrace.schema import GTrace, Manifest
    from dpro.optimizer.evaluate import iteration_us
    from dpro.optimizer.job_model import job_model
    from dpro.optimizer.optimize import representative
    from dpro.optimizer.strategy import Strategy
    from dpro.replayer.replay import replay as full_replay

    ws = [_worker(r, None) for r in (0, 1)]
    for e in ws[1].events:  # a 30 µs on worker 1; d and c start after it
        if e.op == "a":
            e.dur = 30.0
        else:
            e.ts += 20.0
    for w in ws:
        w.steps = {k: (1000.0 * k, 60.0) for k in w.steps}
    gt = GTrace(Manifest("pytorch", "allreduce", "gloo", 2, [w.info for w in ws], [5, 6, 7]), {w.info.name: w for w in ws})
    r = full_replay(gt, align_clocks=False)
    gaps = {}
    for name in ("worker0", "worker1"):
        m = job_model(gt, r.build.link_cost, r.steps, worker=name)
        gaps[name] = abs(iteration_us(m, Strategy.from_groups(m.baseline_groups)) - r.predicted_iteration_us)
    assert gaps["worker0"] != pytest.approx(gaps["worker1"]), gaps
    assert representative(gt, r).worker == min(gaps, key=gaps.get)


def test_no_term_for_horovod():
    """Horovod's background thread negotiates every cycle: the CPU beside the training
    thread is not the collectives', so the facts are not used."""
    from dpro.graph.comm_model import LinkCost
    from dpro.gtrace.schema import GTrace, Manifest
    from dpro.optimizer.job_model import job_model

    cpu = {"cpu": {"cores": 2, "threads": 1}, "cpu_after_us": {"process": 400.0, "thread": 250.0, "calls": 10}}
    ws = [_worker(r, cpu) for r in (0, 1)]
    gt = GTrace(Manifest("pytorch", "allreduce", "horovod", 2, [w.info for w in ws], [5, 6, 7]), {w.info.name: w for w in ws})
    m = job_model(gt, LinkCost(3.0, 0.003), [5, 6, 7])
    assert m.cpu is None and m.ops["d"].dur == 30.0
