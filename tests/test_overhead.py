"""The recorder's own overhead: measured from its step timings, taken out of the optimizer's ops."""

from __future__ import annotations

import pytest

from dpro.gtrace.schema import NodeInfo, NodeTrace
from dpro.optimizer.job_model import CompOp, remove_host_overhead
from dpro.graph.overhead import Overhead, job_overhead, measured_overhead


def node(walls: list[float], steps: list[int]) -> NodeTrace:
    nt = NodeTrace(NodeInfo("worker0", "worker", 0, "h"))
    nt.meta = {"step_wall_us": walls, "steps": steps}
    return nt


def test_measured_overhead_from_the_recorders_step_timings():
    # 6 warm-up calls (first half skipped: lazy initialisation), 4 profiled (first skipped)
    # the fastest call of each (interference only adds time; warm-up is still speeding up)
    nt = node([900, 500, 130, 100, 102, 98, 300, 121, 119, 140], [6, 7, 8, 9])
    ov = measured_overhead(nt)
    assert ov == Overhead(98.0, 119.0)
    assert ov.pct == pytest.approx(100 * (119 / 98 - 1))
    assert measured_overhead(node([900, 100, 100], [3, 4])) is None  # too few warm-up calls
    assert measured_overhead(NodeTrace(NodeInfo("w", "worker", 0, "h"))) is None  # imported trace: nothing
    assert job_overhead([nt, node([1, 1, 1, 110, 110, 110, 0, 130, 130, 130], [6, 7, 8, 9])]) == Overhead(104.0, 124.5)


def test_calls_after_the_window_are_the_settled_pace():
    """4 warm-up calls still speeding up (140 at best), a window at 150: without the calls
    after the window the overhead looks like 7 %. With >= 3 settled calls after it (first
    two skipped: other ranks writing their traces), medians of those against the window's:
    one rank's single call is no pace in a synchronous job (the 60 and 300 below)."""
    nt = node([900, 500, 160, 140, 300, 150, 150, 152], [4, 5, 6, 7])
    assert measured_overhead(nt) == Overhead(140.0, 150.0)
    nt.meta["step_wall_after_us"] = [400.0, 90.0, 105.0, 100.0, 100.0]
    assert measured_overhead(nt) == Overhead(140.0, 150.0)  # 2 settled calls: not enough
    nt.meta["step_wall_after_us"] = [400.0, 300.0, 200.0, 90.0, 105.0, 60.0, 100.0, 300.0, 98.0]
    assert measured_overhead(nt) == Overhead(100.0, 150.0)
    # no warm-up to speak of: the calls after the window alone
    short = node([900, 150, 150], [1, 2])
    assert measured_overhead(short) is None
    short.meta["step_wall_after_us"] = [400.0, 300.0, 200.0, 110.0, 100.0, 120.0]
    assert measured_overhead(short) == Overhead(110.0, 150.0)


def test_overhead_scales_the_host_side_ops():
    ops = {"a": CompOp("a", "a", "FW", "cpu:main", 10.0, 1.0, 0.0), "b": CompOp("b", "b", "BW", "cpu:main", 10.0, 8.0, 1.0),
           "k": CompOp("k", "k", "FW", "cuda:0", 50.0, 0.0, 2.0)}  # a GPU kernel pays no host-side overhead
    notes = remove_host_overhead(Overhead(100.0, 110.0), ops)  # 110 -> 100 µs per step: x 10/11
    assert (ops["a"].gap, ops["a"].dur) == pytest.approx((10 / 11, 100 / 11))
    assert (ops["b"].gap, ops["b"].dur) == pytest.approx((80 / 11, 100 / 11))
    assert (ops["k"].gap, ops["k"].dur) == (0.0, 50.0)
    assert notes and "+10.0%" in notes[0] and "0.909" in notes[0]
    assert remove_host_overhead(Overhead(100.0, 90.0), ops) == []  # profiled faster: nothing to remove


def test_replay_without_the_overhead_by_hand():
    """Ops a (gap 4, own 10) -> b (gap 2, own 20) per 36 µs step; the recorder measured
    36 µs/step unprofiled vs 40 profiled: every op's gap and own time x 0.9."""
    from dpro.graph.global_dfg import BuildOptions
    from dpro.gtrace.schema import Event, GTrace, Manifest, Op
    from dpro.replayer.replay import replay

    nt = NodeTrace(NodeInfo("worker0", "worker", 0, "h"))
    nt.ops = {"a": Op("a", "a", "FW", "cpu:main"), "b": Op("b", "b", "BW", "cpu:main")}
    nt.edges = [("a", "b")]
    nt.steps = {k: (1000.0 * k, 40.0) for k in (5, 6)}
    nt.events = [e for k in (5, 6) for e in (Event("a", k, 1000.0 * k + 4, 10.0), Event("b", k, 1000.0 * k + 16, 20.0))]
    nt.meta = {"steps": [5, 6], "step_wall_us": [90, 80, 36, 37, 36, 40, 40]}
    gt = GTrace(Manifest("pytorch", "allreduce", "gloo", 1, [nt.info], [5, 6]), {"worker0": nt})
    assert replay(gt, align_clocks=False).predicted_iteration_us == pytest.approx(36.0)
    r = replay(gt, BuildOptions(remove_overhead=True), align_clocks=False)
    assert r.predicted_iteration_us == pytest.approx(32.4)
    assert any("profiling overhead +11.1%" in n and "scaled by 0.900" in n for n in r.notes)


@pytest.mark.parametrize("accelerator", [False, True])
def test_collectives_scale_only_in_a_cpu_job(accelerator):
    """Gloo or Horovod on CPU: a collective's own part is the CPU's work and slowed with the
    rest; in a job with a GPU stream, NCCL's time is not the host's."""
    from dpro.graph.overhead import stats_without_overhead as remove
    from dpro.graph.stats import OpStats
    from dpro.gtrace.schema import GTrace, Manifest, Op

    nt = node([90, 80, 100, 100, 100, 125, 125], [5, 6])  # 100 -> 125: x 0.8
    nt.ops = {"a": Op("a", "a", "FW", "cpu:main"), "c": Op("c", "c", "COMM", "comm")}
    if accelerator:
        nt.ops["k"] = Op("k", "k", "FW", "gpu0:s7")
    stats = {"worker0": {k: OpStats(10.0, 5.0, 0.0, {}) for k in nt.ops}}
    out, notes = remove(GTrace(Manifest("pytorch", "allreduce", "gloo", 1, [nt.info], [5, 6]), {"worker0": nt}), stats)
    s = out["worker0"]
    assert all((x.dur, x.gap) == (10.0, 5.0) for x in stats["worker0"].values())  # scaled copies
    assert (s["a"].dur, s["a"].gap) == pytest.approx((8.0, 4.0))
    assert (s["c"].dur, s["c"].gap) == ((10.0, 5.0) if accelerator else pytest.approx((8.0, 4.0)))
    if accelerator:
        assert (s["k"].dur, s["k"].gap) == (10.0, 5.0)
    assert any("scaled by 0.800" in n for n in notes)


def test_overhead_both_ways_when_the_window_changed_the_job():
    """MXNet's recorder with --mxnet-unbulk turns operator bulking off for the window: a slower pace after it is
    the job's own (the bulked job), so the prediction of the unprofiled job grows."""
    from dpro.graph.overhead import scale_overhead

    nt = node([900, 500, 100, 100, 100, 100, 100], [5, 6])
    nt.meta["step_wall_after_us"] = [300.0, 200.0, 110.0, 110.0, 110.0, 110.0]
    assert measured_overhead(nt).factor == 1.0  # slower outside the window: noise, nothing scaled
    nt.meta["window_changes_job"] = "MXNet operator bulking off in the window"
    ov = measured_overhead(nt)
    assert ov == Overhead(110.0, 100.0, True) and ov.factor == pytest.approx(1.1)
    ops = [CompOp("a", "a", "FW", "cpu:main", 10.0, 2.0, 0.0)]
    assert scale_overhead(ov, ops) == pytest.approx(1.1)
    assert (ops[0].dur, ops[0].gap) == pytest.approx((11.0, 2.2))
    assert job_overhead([nt, node([1, 1, 1, 1, 1, 100, 100], [5, 6])]).both_ways
    assert ov.to_json()["window_changes_job"] is True
