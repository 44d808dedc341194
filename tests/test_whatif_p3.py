"""P3 on a parameter server (dpro.whatif.p3_ps): slices, the layer a gradient gates, and the
steady-state period of chained iterations, with hand-computed expectations."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpro.whatif.graph import Op, WhatIfGraph
from dpro.whatif.p3_ps import Iteration, mirror_forward, period_us, slices

REC = Path(__file__).resolve().parent / "data" / "golden" / "recordings" / "mxnet_ps_mlp" / "raw"


def test_slices_in_layer_order_placed_like_mxnet_keys():
    got = slices([("a", 10), ("empty", 0), ("b", 25)], 10, 2)
    assert [(s.tensor, s.key, s.bytes) for s in got] == [("a", 0, 10), ("b", 1, 10), ("b", 2, 10), ("b", 3, 5)]
    # server (key * 9973) % 2: 0, 1, 0, 1
    assert [s.server for s in got] == [0, 1, 0, 1]
    assert [s.bytes for s in slices([("a", 7)], 100, 1)] == [7]
    with pytest.raises(ValueError):
        slices([("a", 7)], 0, 1)


def test_mirror_forward_by_mxnet_names():
    g = WhatIfGraph()
    fw = [g.add(Op(f"w0/FullyConnected@cpu:main#{i}", "FW", "w0/cpu", 1.0, node="w0")) for i in range(3)]
    bw = g.add(Op("w0/_backward_FullyConnected@cpu:main#0", "BW", "w0/cpu", 1.0, node="w0"))
    bulk = g.add(Op("w0/ImperativeBulk@cpu:main#0", "BW", "w0/cpu", 1.0, node="w0"))
    assert mirror_forward(g, bw) is fw[2]  # the first backward op is the last layer's
    assert mirror_forward(g, bulk) is None


def _two_layers() -> tuple[WhatIfGraph, dict[str, Op]]:
    """One iteration: forward f0 -> f1, backward b1 -> b0 (10 µs each); b1 produces t1, b0
    t0; after the backward, pushes t0 then t1 on one connection (20 µs each), pulls on the
    other (20 µs each, each after its push)."""
    g = WhatIfGraph()
    o = {}
    for name, cat, dev, dur, prio in [("f0", "FW", "cpu", 10, 0), ("f1", "FW", "cpu", 10, 1),
                                      ("b1", "BW", "cpu", 10, 2), ("b0", "BW", "cpu", 10, 3),
                                      ("push0", "COMM", "up", 20, 4), ("push1", "COMM", "up", 20, 5),
                                      ("pull0", "COMM", "down", 20, 6), ("pull1", "COMM", "down", 20, 7)]:
        o[name] = g.add(Op(name, cat, dev, float(dur), node="w0", prio=float(prio), comm_device=cat == "COMM"))
    for a, b in [("f0", "f1"), ("f1", "b1"), ("b1", "b0"), ("b0", "push0"), ("b0", "push1"), ("b1", "push0"),
                 ("b1", "push1"), ("push0", "pull0"), ("push1", "pull1")]:
        g.connect(o[a], o[b])
    g.schedule(lambda op: op.prio)
    return g, o


def test_period_overlaps_the_next_forward_with_the_last_pulls():
    g, o = _two_layers()
    it = Iteration(producers={o["b0"].id, o["b1"].id}, ready={"t0": {o["pull0"].id}, "t1": {o["pull1"].id}},
                   consumer={"t0": o["f0"].id, "t1": o["f1"].id}, first_forward=o["f0"].id)
    # copy 0: backward ends at 40; pushes 40-60, 60-80; pulls 60-80, 80-100.
    # copy 1: f0 after pull0 (80) 80-90, f1 after pull1 (100) 100-110, b1 110-120, b0 120-130;
    # then every copy the same 90 µs later: the period is 90
    period, first = period_us(g, it)
    assert first == pytest.approx(40.0)
    assert period == pytest.approx(90.0)
    # the whole forward waiting for every pull (a bulked forward): f0 at 100, backward ends 140
    whole = Iteration(producers=it.producers, ready=it.ready, consumer={"t0": None, "t1": None},
                      first_forward=o["f0"].id)
    assert period_us(g, whole)[0] == pytest.approx(100.0)


@pytest.fixture(scope="module")
def ps_trace(tmp_path_factory) -> Path:
    from click.testing import CliRunner

    from dpro.cli import cli

    out = tmp_path_factory.mktemp("p3") / "gtrace"
    r = CliRunner().invoke(cli, ["collect", str(REC), "-o", str(out)])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def ps_job(ps_trace):
    import dpro

    return dpro.open(ps_trace)


def test_p3_on_a_ps_profile_goes_through_the_ps_model(ps_job):
    from dpro.whatif.builtin import p3
    from dpro.whatif.scaleout import Cluster, predict

    plain = predict(ps_job, [Cluster(2)]).points[0]
    one = predict(ps_job, [Cluster(2)], whatifs=[(p3, {"slice_bytes": 1 << 30})]).points[0]
    many = predict(ps_job, [Cluster(2)], whatifs=[(p3, {"slice_bytes": 64 << 10})]).points[0]
    total = sum(op.bytes for nt in ps_job.trace.workers() for op in nt.ops.values()
                if op.sub_op == "PUSH_REQ" and nt.info.rank == 0)
    assert one.breakdown_us["p3_slices"] == 8  # a slice per key: the MLP's 8 parameters
    assert many.breakdown_us["p3_slices"] >= total // (64 << 10)
    assert many.iteration_us == many.breakdown_us["p3_period"] > 0
    assert plain.iteration_us > 0


def test_p3_on_ps_bad_parameters_are_one_line(ps_job):
    from dpro.errors import DproInputError
    from dpro.whatif.builtin import p3
    from dpro.whatif.scaleout import Cluster, predict

    with pytest.raises(DproInputError, match="synchronous"):
        predict(ps_job, [Cluster(2, asynchronous=True)], whatifs=[(p3, {"slice_bytes": 1 << 20})])
    with pytest.raises(DproInputError, match="slice_bytes"):
        predict(ps_job, [Cluster(2)], whatifs=[(p3, {"slice_bytes": 0})])


def test_p3_on_ps_from_the_command_line(ps_trace):
    import json

    from click.testing import CliRunner

    from dpro.cli import cli

    r = CliRunner().invoke(cli, ["whatif", str(ps_trace), "--workers", "2", "--apply", "p3:slice_bytes=65536",
                                 "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["predicted_iteration_us"] == out["breakdown_us"]["p3_period"] > 0
    assert any(n.startswith("P3:") for n in out["notes"])
    r = CliRunner().invoke(cli, ["whatif", str(ps_trace), "--workers", "2", "--async", "--apply", "p3"])
    assert r.exit_code == 2 and "synchronous steps only" in r.output and "Traceback" not in r.output


def test_slice_message_cost_is_the_calibrated_cpu_else_alpha():
    from dpro.whatif.platform import PsCpu, Transfer
    from dpro.whatif.scaleout import slice_message_us

    t = Transfer(500.0, 0.008)
    push, pull = slice_message_us(None, t, 2)
    assert push(131072) == pull(131072) == 500.0  # no calibration: the link's alpha
    cpu = PsCpu(worker=Transfer(140.0, 0.001), server=Transfer(40.0, 0.0005))
    push, pull = slice_message_us(cpu, t, 2)
    assert push(100_000) == pytest.approx(140.0 + 100.0)  # the worker's CPU for its push
    assert pull(100_000) == pytest.approx(2 * (40.0 + 50.0))  # the server's, for both workers' pulls


def _pipelined(stage_us: float, nbytes: int, n: int) -> float:
    """``n`` messages after one op, through one link of 1 byte/µs, each as
    :func:`_pipelined_message` makes it: the makespan."""
    from dpro.whatif.scaleout import _pipelined_message

    g = WhatIfGraph()
    src = g.add(Op("bw", "BW", "cpu", 0.0, node="w0"))
    g.links = {("link", "w0", "out"): 1.0}
    for k in range(n):
        _pipelined_message(g, [src.id], f"w0/push:{k}", "w0", "ps-send:w0", stage_us, "conn:w0->s0", nbytes,
                           float(k), (("link", "w0", "out"),))
    g.schedule(lambda op: op.prio)
    return g.simulate().iteration_us


def test_pipelined_slices_pay_the_per_message_work_only_where_the_wire_waits():
    # wire-bound: stages 0-100, 100-200, 200-300; wires 100-1100, 1100-2100, 2100-3100:
    # the first stage, then the wire (serial alpha + bytes would be 3 x 1100 = 3300)
    assert _pipelined(100.0, 1000, 3) == pytest.approx(100.0 + 3 * 1000.0)
    # CPU-bound: stages end at 1000, 2000, 3000; the last wire 3000-3100
    assert _pipelined(1000.0, 100, 3) == pytest.approx(3 * 1000.0 + 100.0)
    # one message: its stage then its bytes
    assert _pipelined(100.0, 1000, 1) == pytest.approx(1100.0)
