"""Clock alignment (dpro.alignment): injected skew on real and synthetic traces.

Traces recorded on one machine have one clock: that is the ground truth.  We give the
ranks of a real 4-rank DDP job two different ``host`` values, shift one host's (or both
hosts') timestamps by known amounts, and check that alignment finds the shifts again and
that the replayer's prediction comes back.  Synthetic traces (fine-grained ring SEND/RECV,
parameter server, coarse collectives) are simulated on one true clock and recorded on
skewed ones.  Degenerate inputs must give offsets and a note, never an exception.

What is identifiable from coarse collectives is limited by how closely the ranks'
collective ends agree (docs/alignment.md): on this 2-core machine, gloo's ends differ by
milliseconds, so the real-trace checks are (1) the injected skew is recovered to 50 µs
relative to the alignment of the unskewed trace (the estimator is exactly equivariant),
(2) the absolute error against the true (single) clock is within the identifiability
limit measured for such traces, and (3) the replay comes back within 1 point.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dpro.alignment import AlignOptions, align, apply_offsets, shift_nodes
from dpro.alignment.synthetic import JobSpec, collective_job, ps_job, ring_job
from dpro.gtrace.schema import Event, GTrace, Manifest, NodeInfo, NodeTrace, Op
from dpro.gtrace.validate import validate

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "pytorch" / "ddp_recorder.py"

#: how far the offsets found on a real gloo CPU trace may be from the true (single) clock:
#: the ranks' collective ends disagree by a few ms on a 2-core machine running 4 ranks
#: (measured 0.04 - 3.4 ms over several recordings, 0.13 - 2.4 ms over 12 more, 4.6 ms once
#: in CI, 8.25 ms once in a clean-clone CI run: a tail, not a bound we can derive); see
#: docs/alignment.md. The recovery of injected skew is checked relative to the unskewed
#: alignment (50 µs) and does not depend on this limit.
REAL_IDENTIFIABLE_US = 12000.0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inject(gt: GTrace, per_host_us: dict[str, float]) -> GTrace:
    """``gt`` with every node of host h recorded on a clock ``per_host_us[h]`` ahead."""
    return shift_nodes(gt, {n: per_host_us.get(nt.info.host, 0.0) for n, nt in gt.nodes.items()})


def expected(gt: GTrace, per_host_us: dict[str, float], ref: str) -> dict[str, float]:
    """The offsets that undo ``inject(gt, per_host_us)`` relative to ``ref``."""
    d = {n: per_host_us.get(nt.info.host, 0.0) for n, nt in gt.nodes.items()}
    return {n: -(d[n] - d[ref]) for n in gt.nodes}


def set_hosts(gt: GTrace, hosts: dict[str, str]) -> GTrace:
    out = shift_nodes(gt, {})
    for n, h in hosts.items():
        out.nodes[n].info.host = h
    for info in out.manifest.nodes:
        info.host = hosts.get(info.name, info.host)
    return out


# --------------------------------------------------------------------------- real 4-rank job


@pytest.fixture(scope="module")
def ddp4(tmp_path_factory) -> GTrace:
    """A real 4-rank DDP (gloo) job recorded with `dpro profile` (about 20 s), as two
    hosts of two ranks each (hostA: ranks 0-1, hostB: ranks 2-3)."""
    pytest.importorskip("torch")
    from dpro.gtrace.io import load_gtrace

    out = tmp_path_factory.mktemp("align") / "traces"
    cmd = [sys.executable, "-m", "dpro.cli", "profile", "-o", str(out), "--warmup", "3", "--steps", "10", "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4",
           "--master_addr", "127.0.0.1", "--master_port", str(_port()),
           str(EXAMPLE), "--model", "mlp", "--bucket-cap-mb", "5", "--steps", "14"]
    # every rank records the whole window: the clocks under test are the ranks' own (4 ranks
    # on 2 cores would otherwise take ranks 1-3's later steps from rank 0, shallow ranks)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DPRO_SHALLOW_RANKS": "0"}
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    gt = load_gtrace(out)
    assert len(gt.nodes) == 4
    ranks = {n: nt.info.rank for n, nt in gt.nodes.items()}
    return set_hosts(gt, {n: "hostA" if rk < 2 else "hostB" for n, rk in ranks.items()})


@pytest.mark.slow
def test_real_one_host_is_one_clock(ddp4):
    one = set_hosts(ddp4, {n: "vm" for n in ddp4.nodes})
    res = align(one)
    assert res.status == "trivial" and set(res.offsets_us.values()) == {0.0}
    assert "share its clock" in res.notes[0]


def _forced_us(res, n: str) -> float:
    """How far the dependencies force θ_n away from the recorded clock (0 when they allow it)."""
    lo, hi = res.bounds_us.get(n, (None, None))
    return max(0.0, (lo or 0.0), -(hi if hi is not None else 0.0))


def _host_forced_us(res, gt, n: str) -> float:
    """What the dependencies force on n's host: nodes of one host share a clock (O2 ties them)."""
    host = gt.nodes[n].info.host
    return max(_forced_us(res, m) for m in res.offsets_us if gt.nodes[m].info.host == host)


def _end_bias_us(gt: GTrace) -> dict[str, float]:
    """Per node, its host's mean lateness of collective ends (µs): each instance's ends
    centred on their mean, averaged over instances, then over the host's nodes.  O3 reads
    a systematic end bias as a clock offset (docs/alignment.md), so the offset found on an
    unskewed trace may differ from 0 by the hosts' difference of this bias."""
    from dpro.alignment.extract import extract

    c = extract(gt).coll
    per: dict[int, list[float]] = {}
    for k in range(c.n):
        lo, hi = c.ptr[k], c.ptr[k + 1]
        e = c.e[lo:hi]
        for i, x in zip(c.node[lo:hi], e - e.mean()):
            per.setdefault(int(i), []).append(float(x) * 1e3)
    names = sorted(gt.nodes, key=lambda n: (gt.nodes[n].info.role != "worker", gt.nodes[n].info.rank, n))
    node_bias = {names[i]: float(np.mean(v)) for i, v in per.items()}
    host_of = {n: gt.nodes[n].info.host for n in gt.nodes}
    return {n: float(np.mean([b for m, b in node_bias.items() if host_of[m] == host_of[n]])) if n in node_bias else 0.0
            for n in gt.nodes}


def _limit_us(base, gt: GTrace, n: str, bias: dict[str, float]) -> float:
    """How far θ_n may be from the true (single) clock on this recording: the measured
    identifiability limit, or the hosts' end-bias difference where it is larger, plus what
    the dependencies force."""
    ref = base.reference
    return max(REAL_IDENTIFIABLE_US, 1.5 * abs(bias[n] - bias[ref])) + _host_forced_us(base, gt, n)


def _consistent(res) -> bool:
    """The recorded (single) clocks satisfy every dependency the alignment used."""
    return all(_forced_us(res, n) <= 1.0 for n in res.offsets_us)


@pytest.mark.slow
def test_real_recovers_injected_skew(ddp4):
    base = align(ddp4)
    ref = base.reference
    assert ref == min(ddp4.nodes, key=lambda n: ddp4.nodes[n].info.rank)
    # off the recorded clock by no more than the identifiability limit, plus what the
    # dependencies force on the node's host (nonzero only when recorded events contradict
    # the single clock)
    bias = _end_bias_us(ddp4)
    for n, v in base.offsets_us.items():
        assert abs(v) <= _limit_us(base, ddp4, n, bias), (n, v, base.bounds_us.get(n), bias, base.notes)
    cases = [
        {"hostB": 750.0},
        {"hostB": 20_000.0},
        {"hostB": -35_000.0},
        {"hostA": -5_000.0, "hostB": 12_000.0},  # the reference's own host moves too
    ]
    for per_host in cases:
        skewed = inject(ddp4, per_host)
        res = align(skewed)
        assert res.reference == ref and res.status.startswith("optimal"), res.notes
        want = expected(ddp4, per_host, ref)
        for n in ddp4.nodes:
            got = res.offsets_us[n] - base.offsets_us[n]
            assert abs(got - want[n]) <= 50.0, (per_host, n, got, want[n])
            assert abs(res.offsets_us[n] - want[n]) <= _limit_us(base, ddp4, n, bias)
        # every dependency holds (to the tolerance) after alignment
        assert res.terms["max_violation_ms"] * 1e3 <= AlignOptions().tolerance_us + 1e-3


@pytest.mark.slow
def test_real_replay_with_and_without_alignment(ddp4):
    """The replayer compares two nodes' clocks in one place only: the link-cost fit (a
    collective's busy period runs from the last rank's start to the last rank's end).
    Skew moves that fit, hence the prediction, by an amount that saturates once one host
    is always "last" (0.9 - 14 points on the recordings in docs/alignment.md); alignment
    brings both back to those of the aligned unskewed trace.  The unskewed reference is
    the recorded trace, or, when its events contradict its own single clock (see
    docs/alignment.md), that trace aligned."""
    from dpro.replayer.replay import replay

    r0 = align(ddp4)
    ref_trace = ddp4 if _consistent(r0) else apply_offsets(ddp4, r0.offsets_us)
    base = replay(ref_trace, align_clocks=False)
    chunk = max(o.bytes for nt in ddp4.nodes.values() for o in nt.ops.values() if o.cat == "COMM") / len(ddp4.nodes)

    def step_us(res) -> float:  # the fitted time of one ring step of the largest collective
        return res.build.link_cost.step_us(chunk)

    t0 = step_us(base)
    # what alignment reproduces exactly (it is shift-equivariant) is the aligned unskewed trace.
    # Its prediction is not compared with the raw one: where offsets are not identifiable (up
    # to REAL_IDENTIFIABLE_US) the offset found moves the link fit, and with it the
    # prediction, by an amount the test cannot bound (4.6 ms moved one CI recording by 7.6
    # points; docs/alignment.md, "Replay")
    aligned = replay(apply_offsets(ddp4, r0.offsets_us), align_clocks=False)
    t_aligned = step_us(aligned)
    worst_err = worst_link = 0.0
    for d in (-100_000.0, -30_000.0, -10_000.0, 10_000.0, 30_000.0, 100_000.0):
        skewed = inject(ddp4, {"hostB": d})
        raw = replay(skewed, align_clocks=False)
        fixed = replay(skewed)  # aligned by default
        assert abs(fixed.error_pct - aligned.error_pct) <= 1.0, (d, aligned.error_pct, raw.error_pct, fixed.error_pct)
        assert abs(step_us(fixed) / t_aligned - 1) <= 0.05
        worst_err = max(worst_err, abs(raw.error_pct - base.error_pct))
        worst_link = max(worst_link, abs(step_us(raw) / t0 - 1))
    # skew must move what alignment restores (else the test above proves nothing). How much
    # depends on the recording: its link fit is robust to a few late steps, and on a loaded
    # CI machine a ±100 ms skew moved it by 2.2 % (3-14 % on quiet recordings)
    assert worst_link >= 0.01, worst_link
    assert worst_err >= 0.5, worst_err


@pytest.mark.slow
def test_real_same_host_nodes_stay_together(ddp4):
    def spread(offsets: dict[str, float]) -> float:
        by: dict[str, list[float]] = {}
        for n, v in offsets.items():
            by.setdefault(ddp4.nodes[n].info.host, []).append(v)
        return sum(max(v) - min(v) for v in by.values())

    skewed = inject(ddp4, {"hostB": 20_000.0})
    tied = spread(align(skewed).offsets_us)
    strict = spread(align(skewed, AlignOptions(a2=1e6)).offsets_us)  # as close as the dependencies allow
    free = spread(align(skewed, AlignOptions(a2=0.0)).offsets_us)
    assert tied <= strict + 20.0, (tied, strict)
    assert tied <= free, (tied, free)


# --------------------------------------------------------------------------- synthetic


@pytest.mark.parametrize(
    "hosts,per_host",
    [
        (["a", "a", "b", "b"], {"b": 12_345.0}),
        (["a", "a", "b", "b"], {"a": 3.0, "b": -40_000.0}),
        (["a", "b", "c", "d"], {"b": -250.0, "c": 8_000.0, "d": 31_000.0}),
    ],
)
def test_ring_send_recv_recovers_offsets(hosts, per_host):
    true = ring_job(JobSpec(nodes=4, hosts=hosts, seed=3))
    gt = inject(true, per_host)
    validate(gt)
    res = align(gt)
    assert res.recv_instances == 4 * 6 * 5 * 10 and res.status == "optimal"
    want = expected(gt, per_host, res.reference)
    for n in gt.nodes:
        assert abs(res.offsets_us[n] - want[n]) <= 50.0, (n, res.offsets_us[n], want[n])
    # the aligned trace: every RECV ends after its SEND started, and starts no earlier
    aligned = apply_offsets(gt, res.offsets_us)
    send = {}
    for n, nt in aligned.nodes.items():
        for e in nt.events:
            op = nt.ops[e.op]
            if op.sub_op == "SEND":
                send[(op.txn, e.step)] = e.ts
    checked = 0
    for n, nt in aligned.nodes.items():
        for e in nt.events:
            op = nt.ops[e.op]
            if op.sub_op == "RECV":
                s = send[(op.txn, e.step)]
                assert e.ts + e.dur >= s - 1.0
                assert e.ts >= s - 1e-6
                checked += 1
    assert checked == res.recv_instances


def test_parameter_server_recovers_offsets():
    skew = {"worker0": 300.0, "worker1": -8_000.0, "worker2": 25_000.0, "server0": -1_234.0}
    gt = ps_job(JobSpec(nodes=3, hosts=["a", "b", "c"], skew_us=skew, tensor_bytes=[1 << 20] * 4, seed=1))
    validate(gt)
    res = align(gt)
    assert res.reference == "worker0"
    for n, v in res.offsets_us.items():
        assert abs(v + skew[n] - skew["worker0"]) <= 50.0, (n, v)


def test_coarse_collectives_recover_offsets():
    hosts = [f"h{i // 2}" for i in range(8)]
    per_host = {"h0": 0.0, "h1": -15.0, "h2": 4_321.0, "h3": -27_000.0}
    gt = inject(collective_job(JobSpec(nodes=8, hosts=hosts, seed=2)), per_host)
    res = align(gt)
    assert res.collective_instances == 5 * 10 and res.recv_instances == 0
    want = expected(gt, per_host, res.reference)
    for n in gt.nodes:
        assert abs(res.offsets_us[n] - want[n]) <= 50.0


def test_alignment_is_equivariant_under_injected_skew():
    gt = ring_job(JobSpec(nodes=4, hosts=["a", "a", "b", "b"], seed=5))
    r0 = align(gt)
    for shift in (7.0, -900.0, 60_000.0):
        r = align(inject(gt, {"b": shift}))
        for n in gt.nodes:
            w = -shift if gt.nodes[n].info.host == "b" else 0.0
            assert abs(r.offsets_us[n] - r0.offsets_us[n] - w) <= 1.0


def test_o2_pulls_same_host_nodes_together():
    # worker1 shares worker0's host but its data say its clock is 600 µs off: with O2 the
    # host's clock wins, without it the data do
    gt = collective_job(JobSpec(nodes=4, hosts=["a", "a", "b", "b"], seed=4, skew_us={"worker1": 600.0}))
    with_o2 = align(gt).offsets_us
    without = align(gt, AlignOptions(a2=0.0)).offsets_us
    assert abs(with_o2["worker1"] - with_o2["worker0"]) < 0.05 * abs(without["worker1"] - without["worker0"])
    assert abs(without["worker1"] + 600.0) <= 50.0


def test_apply_offsets_shifts_a_copy():
    gt = ring_job(JobSpec(nodes=4, seed=1))
    before = [(e.ts, e.dur) for e in gt.nodes["worker2"].events]
    steps = dict(gt.nodes["worker2"].steps)
    out = apply_offsets(gt, {"worker2": 1500.0}, correct_recv=False)
    assert [(e.ts, e.dur) for e in gt.nodes["worker2"].events] == before  # input untouched
    got = np.array([(e.ts - 1500.0, e.dur) for e in out.nodes["worker2"].events])
    assert np.allclose(got, np.array(before), rtol=0, atol=1e-6)
    for s, (t, d) in out.nodes["worker2"].steps.items():
        assert t - 1500.0 == pytest.approx(steps[s][0]) and d == steps[s][1]
    assert out.manifest.meta["clock_offsets_us"] == {"worker2": 1500.0}
    assert "clock_offsets_us" not in gt.manifest.meta
    # RECV correction: starts move to the SEND's start, ends stay
    fixed = apply_offsets(gt, {})
    for n in gt.nodes:
        for a, b in zip(gt.nodes[n].events, fixed.nodes[n].events):
            assert b.ts >= a.ts and b.ts + b.dur == pytest.approx(a.ts + a.dur)


def test_result_is_json():
    res = align(collective_job(JobSpec(nodes=4, hosts=["a", "a", "b", "b"])))
    d = json.loads(json.dumps(res.to_json()))
    assert set(d["offsets_us"]) == {f"worker{i}" for i in range(4)}
    assert d["solver"] == "CLARABEL" and d["variables"] > 0 and d["constraints"] > 0


# --------------------------------------------------------------------------- degenerate input


def _manual(nodes: dict[str, tuple[str, list[Op], list[Event]]], scheme: str = "allreduce") -> GTrace:
    infos, nts = [], {}
    for r, (name, (host, ops, events)) in enumerate(nodes.items()):
        info = NodeInfo(name, "worker", r, host)
        infos.append(info)
        nts[name] = NodeTrace(info, {o.id: o for o in ops}, [], events, {0: (0.0, 1000.0), 1: (1000.0, 1000.0)})
    return GTrace(Manifest("pytorch", scheme, "test", len(nodes), infos, [0, 1]), nts)


def test_one_node_only():
    gt = ring_job(JobSpec(nodes=2))
    one = GTrace(gt.manifest, {"worker0": gt.nodes["worker0"]})
    res = align(one)
    assert res.offsets_us == {"worker0": 0.0} and res.status == "trivial"
    assert "one node" in res.notes[0]


def test_node_without_cross_node_dependencies():
    gt = collective_job(JobSpec(nodes=4, hosts=["a", "a", "b", "b"], seed=1, skew_us={"worker2": 5e3, "worker3": 5e3}))
    lone = NodeTrace(NodeInfo("worker4", "worker", 4, "c"), {"x": Op("x", "x", "BW", "cpu")}, [],
                     [Event("x", 0, 123.0, 5.0)], {0: (100.0, 50.0)})
    mate = NodeTrace(NodeInfo("worker5", "worker", 5, "b"), {"x": Op("x", "x", "BW", "cpu")}, [],
                     [Event("x", 0, 123.0, 5.0)], {0: (100.0, 50.0)})
    gt.nodes["worker4"], gt.nodes["worker5"] = lone, mate
    gt.manifest.nodes += [lone.info, mate.info]
    res = align(gt)
    assert res.offsets_us["worker4"] == 0.0
    assert any("worker4" in n and "cannot be aligned" in n for n in res.notes)
    # a node with no dependency of its own takes its host's clock (O2)
    assert abs(res.offsets_us["worker5"] - res.offsets_us["worker2"]) <= 1.0
    assert abs(res.offsets_us["worker2"] + 5e3) <= 50.0


def test_disconnected_groups():
    a = collective_job(JobSpec(nodes=2, hosts=["a", "b"], seed=1))
    b = collective_job(JobSpec(nodes=2, hosts=["c", "d"], seed=2))
    nodes = {"worker0": a.nodes["worker0"], "worker1": a.nodes["worker1"]}
    for old, new in (("worker0", "worker2"), ("worker1", "worker3")):
        nt = b.nodes[old]
        nt.info = NodeInfo(new, "worker", int(new[-1]), nt.info.host)
        for op in nt.ops.values():
            if op.txn:
                op.txn = "other." + op.txn
        nodes[new] = nt
    gt = GTrace(Manifest("pytorch", "allreduce", "test", 4, [n.info for n in nodes.values()], a.manifest.steps), nodes)
    res = align(gt)
    assert res.offsets_us["worker2"] == 0.0 or res.offsets_us["worker3"] == 0.0
    assert any("no dependency links them" in n for n in res.notes)


def test_contradictory_dependencies():
    # each RECV ends before its SEND starts, in both directions: no offsets can fix that
    ops0 = [Op("s", "send", "COMM", "comm", sub_op="SEND", txn="ab"), Op("r", "recv", "COMM", "comm", sub_op="RECV", txn="ba")]
    ops1 = [Op("s", "send", "COMM", "comm", sub_op="SEND", txn="ba"), Op("r", "recv", "COMM", "comm", sub_op="RECV", txn="ab")]
    ev = lambda: [Event("s", s, 500.0 + 1000 * s, 10.0) for s in (0, 1)] + [Event("r", s, 50.0 + 1000 * s, 50.0) for s in (0, 1)]  # noqa: E731
    gt = _manual({"w0": ("a", ops0, ev()), "w1": ("b", ops1, ev())})
    res = align(gt)
    assert any("contradictory dependencies" in n for n in res.notes), res.notes
    assert all(np.isfinite(v) for v in res.offsets_us.values())
    assert abs(res.offsets_us["w1"]) <= 1000.0


def test_solver_time_is_bounded():
    gt = ring_job(JobSpec(nodes=4, hosts=["a", "a", "b", "b"], seed=1, skew_us={"worker2": 9e3, "worker3": 9e3}))
    t = time.perf_counter()
    res = align(gt, AlignOptions(time_limit_s=0.01))
    assert time.perf_counter() - t < 5.0
    assert all(np.isfinite(v) for v in res.offsets_us.values())
    res = align(gt, AlignOptions(max_iters=0))
    assert res.iterations == 0 and res.status == "optimal"


def test_unknown_reference_and_bad_options():
    gt = ring_job(JobSpec(nodes=2))
    with pytest.raises(ValueError, match="reference"):
        align(gt, AlignOptions(reference="nope"))
    with pytest.raises(ValueError, match="a2"):
        align(gt, AlignOptions(a2=-1.0))
    res = align(gt, AlignOptions(reference="worker1", force=True))
    assert res.reference == "worker1" and res.offsets_us["worker1"] == 0.0


def test_events_that_contradict_a_shared_clock_are_left_out():
    per_host = {"b": 9_000.0}
    gt = inject(collective_job(JobSpec(nodes=4, hosts=["a", "a", "b", "b"], seed=6)), per_host)
    # corrupt one instance: worker0 "ends" 5 ms before its host-mate worker1 started
    w1 = {(e.op, e.step): e.ts for e in gt.nodes["worker1"].events}
    for e in gt.nodes["worker0"].events:
        if e.op == "allreduce2" and e.step == 4:
            e.dur = max(0.0, w1[(e.op, e.step)] - 5_000.0 - e.ts)
            e.ts = min(e.ts, w1[(e.op, e.step)] - 5_000.0)
    res = align(gt)
    assert any(n.startswith("inconsistent events") and "allreduce.2 in step 4" in n for n in res.notes), res.notes
    assert res.collective_instances == 5 * 10 - 1
    want = expected(gt, per_host, res.reference)
    for n in gt.nodes:
        assert abs(res.offsets_us[n] - want[n]) <= 50.0
