"""What-if primitives, built-ins and models on tiny graphs with hand-computed results."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from dpro.whatif.builtin import compute_speed, fused_optimizer, mixed_precision, network, p3
from dpro.whatif.graph import Op, WhatIfGraph
from dpro.whatif.models import Transfer, allreduce_us, multiplex, share_bandwidth
from dpro.whatif.platform import parse_bandwidth, parse_time_us, parse_workers
from dpro.whatif.scaleout import simulate_async

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp_gloo_2rank_mlp"


def _op(g: WhatIfGraph, name: str, dur: float, device: str = "d0", cat: str = "FW", **kw) -> Op:
    return g.add(Op(name=name, cat=cat, device=device, dur=dur, node="w0", **kw))


def test_select_and_scale():
    g = WhatIfGraph()
    a, b = _op(g, "a", 10), _op(g, "b", 20, cat="BW")
    g.connect(a, b)
    assert g.simulate().iteration_us == 30
    sel = g.select(lambda op: op.cat == "BW")
    assert [op.name for op in sel] == ["b"]
    sel.scale(0.5)
    assert g.simulate().iteration_us == 20  # 10 + 20*0.5
    assert len(g.select("^a$")) == 1
    with pytest.raises(ValueError):
        g.select("a").scale(-1)


def test_insert_between_devices():
    g = WhatIfGraph()
    a, b = _op(g, "a", 10), _op(g, "b", 5, device="d1")
    c = g.insert([a], Op(name="c", cat="COMM", device="link", dur=7), [b])
    r = g.simulate()
    assert r.start_us(c) == 10 and r.start_us(b) == 17 and r.iteration_us == 22


def test_remove_keeps_dependencies_through_the_op():
    g = WhatIfGraph()
    a, c, b = _op(g, "a", 10), _op(g, "c", 3, device="d1"), _op(g, "b", 5, device="d2")
    g.connect(a, c)
    g.connect(c, b)
    assert g.simulate().iteration_us == 18
    g.remove(c)
    assert [p.name for p in g.preds(b)] == ["a"]
    assert g.simulate().iteration_us == 15


def _contended() -> tuple[WhatIfGraph, Op, Op]:
    """A link busy 0-20 (q); y becomes ready at 10, z at 5; w (10 µs) waits for y."""
    g = WhatIfGraph()
    _op(g, "q", 20, device="L", prio=0)
    r, s = _op(g, "r", 10, device="d0"), _op(g, "s", 5, device="d1")
    y, z = _op(g, "y", 5, device="L", prio=1), _op(g, "z", 5, device="L", prio=2)
    w = _op(g, "w", 10, device="d2")
    g.connect(r, y)
    g.connect(s, z)
    g.connect(y, w)
    return g, y, z


def test_schedule_policy_changes_the_order():
    g, y, z = _contended()
    fifo = g.simulate()  # first ready first: z 20-25, y 25-30, w 30-40
    assert (fifo.start_us(z), fifo.start_us(y), fifo.iteration_us) == (20, 25, 40)
    g.schedule(lambda op: {"y": 0, "z": 1}.get(op.name, 5))  # y first: y 20-25, w 25-35, z 25-30
    pr = g.simulate()
    assert (pr.start_us(y), pr.start_us(z), pr.iteration_us) == (20, 25, 35)
    g.schedule("fifo")
    assert g.simulate().iteration_us == 40
    with pytest.raises(ValueError):
        g.schedule("lifo")


def test_compute_speed_and_network():
    g = WhatIfGraph()
    a = _op(g, "a", 10)
    c = g.insert([a], Op(name="ar", cat="COMM", device="link", dur=8, comm_device=True,
                         attrs={"sub_op": "ALLREDUCE"}))
    compute_speed(g, factor=2.0)
    assert g.simulate().iteration_us == 13  # 10/2 + 8
    network(g, bandwidth=4.0)
    assert g.ops[c.id].dur == 2 and g.simulate().iteration_us == 7



def _amp_graph() -> WhatIfGraph:
    g = WhatIfGraph()
    ops = [_op(g, "w0/aten::linear#0", 10), _op(g, "w0/aten::linear#1", 30), _op(g, "w0/aten::relu#2", 5),
           _op(g, "w0/autograd::engine::evaluate_function: AddmmBackward0#3", 20, cat="BW")]
    for a, b in zip(ops, ops[1:]):
        g.connect(a, b)
    return g


def test_mixed_precision_factors_and_absolute(tmp_path, monkeypatch):
    g = _amp_graph()
    mixed_precision(g, factors={"matmul": {"FW": 2.0, "BW": 10.0}})
    assert g.simulate().iteration_us == pytest.approx(20 + 60 + 5 + 200)
    # absolute: the class's ops get the calibrated time in all, each its share of the profile's
    cal = tmp_path / "amp.json"
    cal.write_text('{"factors": {"matmul": {"FW": 2, "BW": 10}}, "times_us": {"matmul": {"FW": 200, "BW": 1000}}}')
    monkeypatch.setenv("DPRO_AMP_FACTORS", str(cal))
    g = _amp_graph()
    mixed_precision(g, absolute=1)
    assert [round(op.dur, 6) for op in sorted(g.select(lambda o: True), key=lambda o: o.id)] == [50, 150, 5, 1000]
    assert g.simulate().iteration_us == pytest.approx(1205)
    # auto: forward native (autocast 60 < fp32 80 µs: x0.75 on the profile's 10 + 30), backward
    # emulated (1000 > fp32 100: the calibrated 1000 in all, as absolute)
    cal.write_text('{"factors": {"matmul": {"FW": 0.75, "BW": 10}}, "times_us": {"matmul": '
                   '{"FW": 60, "BW": 1000, "FW_fp32": 80, "BW_fp32": 100}}}')
    g = _amp_graph()
    mixed_precision(g, auto=1)
    assert [round(op.dur, 6) for op in sorted(g.select(lambda o: True), key=lambda o: o.id)] == [7.5, 22.5, 5, 1000]
    assert g.simulate().iteration_us == pytest.approx(1035)
    g = _amp_graph()  # without fp32 times (an older calibration): absolute
    cal.write_text('{"factors": {"matmul": {"FW": 2, "BW": 10}}, "times_us": {"matmul": {"FW": 200, "BW": 1000}}}')
    mixed_precision(g, auto=1)
    assert g.simulate().iteration_us == pytest.approx(1205)
    cal.write_text('{"factors": {"matmul": {"FW": 2, "BW": 10}}}')
    from dpro.errors import DproInputError

    with pytest.raises(DproInputError, match="times_us"):
        mixed_precision(_amp_graph(), absolute=1)

def test_fused_optimizer_one_launch():
    g = WhatIfGraph()
    bw = _op(g, "bw", 10, cat="BW")
    ups = [_op(g, f"u{i}", d, cat="UPDATE", gap=1.0, prio=i) for i, d in enumerate((3, 4, 5))]
    end = _op(g, "end", 0, device="d1", cat="OTHER")
    for u in ups:
        g.connect(bw, u)
        g.connect(u, end)
    assert g.simulate().iteration_us == 10 + 3 * 1 + 12
    fused_optimizer(g)
    assert len(g.select(lambda o: o.cat == "UPDATE")) == 1
    assert g.simulate().iteration_us == 10 + 1 + 12  # one host gap


def test_p3_slices_and_prioritises_layer_order():
    g = WhatIfGraph()
    # two gradients: g_late produced first (late layer), g_early produced later (first layer)
    b1, b2 = _op(g, "bw_late", 1, cat="BW"), _op(g, "bw_early", 1, cat="BW")
    g.connect(b1, b2)
    g.insert([b1], Op(name="push_late", cat="COMM", device="L", dur=40, bytes=40, prio=1, comm_device=True,
                      attrs={"sub_op": "PUSH_REQ"}))
    early = g.insert([b2], Op(name="push_early", cat="COMM", device="L", dur=10, bytes=10, prio=2, comm_device=True,
                              attrs={"sub_op": "PUSH_REQ"}))
    fw = _op(g, "next_fw_layer1", 5, device="d9")
    g.connect(early, fw)
    r = g.simulate()  # FIFO: late 1-41, early 41-51, fw 51-56
    assert r.iteration_us == 56
    p3(g, slice_bytes=10)  # late -> 4 slices of 10 µs; early jumps ahead after the first slice
    assert len(g.select("push_late/slice")) == 4
    r = g.simulate()  # slice0 1-11, early 11-21, fw 21-26, slices 1..3 21-51
    assert r.end_us(g.op("next_fw_layer1")) == 26 and r.iteration_us == 51


def test_allreduce_models():
    t = Transfer(alpha=1.0, beta=0.1)
    assert allreduce_us(400, 4, t) == pytest.approx(6 * (1 + 10))
    assert allreduce_us(400, 4, t, "tree") == pytest.approx(4 * (1 + 40))
    assert allreduce_us(400, 1, t) == 0


def test_multiplexing_model():
    # window 64 B, 1 µs/B: heads 64 (100), 30 (30 done at 94), 64 (250); then tails 36 -> 194, 186 -> 380
    assert multiplex([(0, 100), (0, 30), (0, 250)], 64, Transfer(0, 1)) == [194, 94, 380]
    # a head arriving later goes before the pending tails; alpha paid once, with the head:
    # head0 0-51, head1 (10 B, arrived at 10) 51-62, tail0 (50 B) 62-112
    assert multiplex([(0, 100), (10, 10)], 50, Transfer(1, 1)) == [112, 62]


def test_bandwidth_sharing_model():
    assert share_bandwidth([(0, 100), (0, 100)], 1.0) == [200, 200]
    # alone for 50 µs (50 B), then 0.5 B/µs each: first ends at 150, second alone from 150 to 200
    assert share_bandwidth([(0, 100), (50, 100)], 1.0) == pytest.approx([150, 200])
    assert share_bandwidth([(0, 10), (100, 10)], 1.0) == [10, 110]


def test_async_simulation_throughput():
    t = Transfer(0.0, 1.0)  # 1 B/µs per direction of the server port
    # one worker: 100 compute + 50 push + 50 pull -> 200 µs a step
    assert simulate_async(1, [100.0], [50], [1], t, 0, 0, 100) == pytest.approx(5000)
    # two workers in lockstep share each direction: 100 + 100 (push) + 100 (pull) = 300 µs per pair
    assert simulate_async(2, [100.0], [50], [1], t, 0, 0, 1000) == pytest.approx(2e6 / 300)
    # a 10 µs update per message, serial on the server: worker 0's 200-210, worker 1's 210-220;
    # worker 0 pulls alone 210-220 (10 B), then both share: worker 0 ends at 300, worker 1 at 310
    assert simulate_async(2, [100.0], [50], [1], t, 10, 0.0, 2) == pytest.approx(2e6 / 310, rel=1e-6)



def test_async_simulation_shared_cores():
    t = Transfer(0.0, 1.0)
    # one worker, two servers of 50 B each: both pushes cross the worker's own link (1 B/µs),
    # 0.5 B/µs each, 100 µs; the pulls alike: 100 + 100 + 100 = 300 µs (not 200: each port its own)
    assert simulate_async(1, [100.0], [50, 50], [1, 1], t, 0, 0, 10) == pytest.approx(1e6 / 300)
    # four workers computing on two cores (no communication): 200 µs a step each
    assert simulate_async(4, [100.0], [0], [0], t, 0, 0, 400, cores=2) == pytest.approx(4e6 / 200)
    assert simulate_async(4, [100.0], [0], [0], t, 0, 0, 400) == pytest.approx(4e6 / 100)
    # two workers, one core: 200 µs of computing together, then both push (50 B each, sharing
    # the server's port: 100 µs) and pull (100 µs): 400 µs per pair of steps
    assert simulate_async(2, [100.0], [50], [1], t, 0, 0, 1000, cores=1) == pytest.approx(2e6 / 400)


def test_async_simulation_pinned_workers_share_their_own_core():
    """Three workers of 100 µs of computation (no communication) on 2 cores. Free: each at
    2/3 of a core, all three steps end at 150 and 300 µs: 6 steps / 300 µs. Pinned (core
    w % 2): workers 0 and 2 share core 0 (a step each 200 µs), worker 1 has core 1 (100 µs):
    steps end at 100 (1), 200 (4), 300 (5): 5 steps / 300 µs."""
    t = Transfer(0.0, 1.0)
    assert simulate_async(3, [100.0], [0], [0], t, 0, 0, 5, cores=2) == pytest.approx(6e6 / 300)
    assert simulate_async(3, [100.0], [0], [0], t, 0, 0, 5, cores=2, pinned=True) == pytest.approx(5e6 / 300)
    # one computing worker per core: the same as free
    assert simulate_async(2, [100.0], [50], [1], t, 0, 0, 1000, cores=2, pinned=True) == pytest.approx(2e6 / 300)


def test_units():
    assert parse_bandwidth("8Mbit") == pytest.approx(1.0)
    assert parse_bandwidth("1GB/s") == pytest.approx(1000.0)
    assert parse_time_us("5us") == 5 and parse_time_us("1.5ms") == 1500
    assert parse_workers("2,4,8") == [2, 4, 8]
    for bad in ("0", "2,x", ""):
        with pytest.raises(ValueError):
            parse_workers(bad)
    with pytest.raises(ValueError):
        parse_bandwidth("10Gbits")


def _cli(*args):
    from dpro.cli import cli

    return CliRunner().invoke(cli, list(args))


def test_graph_of_a_job_replays_like_the_job():
    import dpro
    import dpro.whatif

    job = dpro.open(EXAMPLE)
    w = dpro.whatif.of(job)
    assert w.simulate().iteration_us == pytest.approx(job.replay().predicted_iteration_us)
    w.select(lambda op: op.cat in ("FW", "BW")).scale(0.5)
    assert w.simulate().iteration_us < job.replay().predicted_iteration_us


def test_cli_scale_out_and_bad_parameters(tmp_path):
    r = _cli("whatif", str(EXAMPLE), "--workers", "2,4", "--json")
    assert r.exit_code == 0, r.output
    import json

    d = json.loads(r.output)
    assert [p["workers"] for p in d["scaling"]] == [2, 4]
    assert d["scaling"][0]["iteration_us"] < d["scaling"][1]["iteration_us"]
    for args, msg in ((["--workers", "0"], "must be >= 1"), (["--bandwidth", "3furlongs"], "bandwidth"),
                      (["--latency", "5 parsecs"], "latency")):
        r = _cli("whatif", str(EXAMPLE), *args)
        assert r.exit_code != 0 and msg in r.output and "Traceback" not in r.output
    flat = tmp_path / "flat.json"
    flat.write_text('{"alpha_us": 10, "beta_us_per_byte": 0.001}')
    r = _cli("whatif", str(EXAMPLE), "--platform", str(flat), "--workers", "4", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["transfer"]["alpha_us"] == 10
    bad = tmp_path / "p.json"
    bad.write_text('{"alpha": 1}')
    r = _cli("whatif", str(EXAMPLE), "--platform", str(bad))
    assert r.exit_code != 0 and "not a platform file" in r.output


def test_cli_unsteady_platform_is_noted_and_a_bad_one_is_one_line(tmp_path):
    """A platform whose calibration tries disagreed: the prediction says so in its notes;
    a malformed ``unsteady`` list: one line naming the file, exit 2."""
    import json

    base = {"format": "dpro-platform", "version": 1, "allreduce": {"alpha_us": 10, "beta_us_per_byte": 0.001}}
    f = tmp_path / "p.json"
    f.write_text(json.dumps({**base, "unsteady": [{"bytes": 64 << 20, "min_us": 40000, "max_us": 74000}]}))
    r = _cli("whatif", str(EXAMPLE), "--platform", str(f), "--workers", "4", "--json")
    assert r.exit_code == 0, r.output
    notes = json.loads(r.output)["notes"]
    assert any("calibration tries disagreed (64 MiB 40.0-74.0 ms)" in n for n in notes), notes
    f.write_text(json.dumps(base))
    r = _cli("whatif", str(EXAMPLE), "--platform", str(f), "--workers", "4", "--json")
    assert r.exit_code == 0 and not any("disagreed" in n for n in json.loads(r.output)["notes"])
    f.write_text(json.dumps({**base, "unsteady": [{"bytes": "64M"}]}))
    r = _cli("whatif", str(EXAMPLE), "--platform", str(f), "--workers", "4")
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "p.json" in r.output and "'unsteady'" in r.output


def test_cli_load_whatif(tmp_path, monkeypatch):
    (tmp_path / "my_whatifs.py").write_text(
        "import dpro.whatif\n\n@dpro.whatif.whatif('no_backward')\n"
        "def no_backward(g, factor=0.0):\n    '''Backward for free.'''\n"
        "    g.select(lambda op: op.cat == 'BW').scale(factor)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = _cli("whatif", "--list", "--load-whatif", "my_whatifs")
    assert "no_backward" in r.output
    r = _cli("whatif", str(EXAMPLE), "--load-whatif", "my_whatifs", "--apply", "no_backward:factor=0", "--json")
    assert r.exit_code == 0, r.output
    import json

    d = json.loads(r.output)
    assert d["predicted_iteration_us"] < d["baseline_iteration_us"]
    r = _cli("whatif", str(EXAMPLE), "--load-whatif", "no_such_module_xyz")
    assert r.exit_code != 0 and "cannot load" in r.output
    sys.modules.pop("my_whatifs", None)


def test_cli_apply_with_scale_out_and_bad_what_if_parameters():
    import json

    r = _cli("whatif", str(EXAMPLE), "--workers", "2", "--json")
    plain = json.loads(r.output)["predicted_iteration_us"]
    r = _cli("whatif", str(EXAMPLE), "--workers", "2", "--apply", "compute_speed:factor=2", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["predicted_iteration_us"] < plain
    r = _cli("whatif", str(EXAMPLE), "--apply", "compute_speed:speed=2")
    assert r.exit_code == 2 and "unexpected keyword" in r.output


@pytest.mark.parametrize("comm, expected", [(0.0, 200.0), (50.0, 200.0), (100.0, 200.0), (150.0, 250.0)])
def test_workers_sharing_cores(comm, expected):
    """4 workers of 100 µs CPU a step on 2 cores need steps of >= 200 µs: compute slows until
    the step is that long (CPU-bound: x2), waits on the network lend their cores."""
    from dpro.whatif.scaleout import Cluster, _oversubscribed, _simulate_point

    g = WhatIfGraph()
    a = _op(g, "fw", 100.0)
    g.insert([a], Op(name="ar", cat="COMM", device="link", dur=comm, comm_device=True))
    p = _oversubscribed(g, Cluster(4, host_cores=2), lambda h: _simulate_point(h, 4, None))
    assert p.iteration_us == pytest.approx(expected, rel=1e-4)



@pytest.mark.parametrize("n, pinned, expected", [(3, False, 150.0), (3, True, 200.0), (4, True, 200.0),
                                                 (5, True, 300.0), (2, True, 100.0)])
def test_pinned_ranks_sharing_cores(n, pinned, expected):
    """Ranks of 100 µs CPU a step on 2 cores: shared freely, 3 of them need 150 µs (3*100/2);
    bound to core rank % 2, the busiest core runs ceil(3/2) = 2 of them: 200 µs (5: 3, 300 µs)."""
    from dpro.whatif.scaleout import Cluster, _oversubscribed, _simulate_point, deflate_contended

    g = WhatIfGraph()
    _op(g, "fw", 100.0)
    c = Cluster(n, host_cores=2, pinned=pinned)
    assert _oversubscribed(g, c, lambda h: _simulate_point(h, n, None)).iteration_us == pytest.approx(expected, rel=1e-4)
    if pinned:  # a pinned profile of n ranks ran at 1/ceil(n/2) of a core: deflated back to 100 µs
        h = WhatIfGraph()
        _op(h, "fw", expected)
        assert deflate_contended(h, replace(c, comm_cpu=Transfer(0.0, 0.0)), n) == pytest.approx(expected / 100)

def test_horovod_recording_scale_out_reproduces_its_replay(tmp_path):
    """The golden Horovod recording (2 workers, gloo): the profiled cluster predicts what
    `dpro replay` does, more workers take longer (ring: 2(N-1)/N of the bytes per link)."""
    import dpro
    from dpro.whatif.scaleout import Cluster, predict

    rec = Path(__file__).resolve().parent / "data" / "golden" / "recordings" / "horovod_torch_mlp" / "raw"
    r = _cli("collect", str(rec), "-o", str(tmp_path / "hvd"))
    assert r.exit_code == 0, r.output
    job = dpro.open(tmp_path / "hvd")
    res = predict(job, [Cluster(n) for n in (2, 4, 8)])
    it = [p.iteration_us for p in res.points]
    assert res.transfer_source == "fitted on the trace (Horovod's fused spans)"  # not the importer's envelope
    assert it[0] == pytest.approx(job.replay().predicted_iteration_us, rel=0.02)
    assert it[0] < it[1] < it[2]


def test_allreduce_synthesized_for_a_one_rank_profile():
    """No collective in the profile: one fused all-reduce per gradient producer, after it,
    before the first optimizer op; hand-computed: p1 0-10, p2 10-30, ar1 10-40, ar2 40-70
    (one queue, FIFO), u1 70-75, u2 75-80."""
    from dpro.whatif.scaleout import synthesize_allreduce

    g = WhatIfGraph()
    p1, p2 = _op(g, "w0/p1", 10, cat="BW"), _op(g, "w0/p2", 20, cat="BW")
    u1, u2 = _op(g, "w0/u1", 5, cat="UPDATE"), _op(g, "w0/u2", 5, cat="UPDATE")
    for a, b in ((p1, p2), (p2, u1), (u1, u2)):
        g.connect(a, b)
    n = synthesize_allreduce(g, [("a.w", 100, "w0/p1"), ("a.b", 50, "w0/p1"), ("b.w", 200, "w0/p2"),
                                 ("gone", 8, "w0/missing")], "w0")
    assert n == 2
    ars = sorted(g.select(lambda o: o.attrs.get("sub_op") == "ALLREDUCE"), key=lambda o: o.prio + o.id)
    assert [a.bytes for a in ars] == [150, 200]
    assert all(a.comm_device and a.device == "w0/comm:allreduce" for a in ars)
    assert [s.name for s in g.succs(ars[0])] == ["w0/u1"]  # u2 waits through u1
    for a in ars:
        a.dur = 30.0
    r = g.simulate()
    assert (r.start_us(ars[0]), r.start_us(ars[1]), r.start_us(u1), r.iteration_us) == (10, 40, 70, 80)


@pytest.mark.parametrize("n, cpu, expected", [(2, None, 160.0), (2, Transfer(0.0, 0.1), 200.0),
                                              (4, Transfer(0.0, 0.1), 440.0)])
def test_collective_cpu_counts_as_demand(n, cpu, expected):
    """a (100 µs) then, side by side, b (60 µs compute) and an all-reduce of 400 bytes
    (link time 50 µs); its CPU per rank 2(N-1)*0.1*400/N: 40 µs at N=2, 60 µs at N=4.
    Alone: 160 µs (no CPU cost given: 2 workers fit 2 cores). N=2 on 2 cores needs
    2*(160+40)/2 = 200 µs: T(f) = 100f + max(60f, max(50, 40f)) = 160f -> f = 1.25, 200 µs.
    N=4 needs 4*(160+60)/2 = 440 µs: T(f) = 100f + max(60f, max(50, 60f)) = 160f -> f = 2.75
    (beyond N/C = 2: the threads overlap), 440 µs."""
    from dpro.whatif.scaleout import Cluster, _oversubscribed, _simulate_point

    g = WhatIfGraph()
    a = _op(g, "a", 100.0)
    _op(g, "b", 60.0)
    g.connect(a, g.op("b"))
    g.insert([a], Op(name="ar", cat="COMM", device="link", dur=50.0, comm_device=True, bytes=400,
                     attrs={"sub_op": "ALLREDUCE"}))
    p = _oversubscribed(g, Cluster(n, host_cores=2, comm_cpu=cpu), lambda h: _simulate_point(h, n, None))
    assert p.iteration_us == pytest.approx(expected, rel=1e-4)


def test_bandwidth_is_the_line_rate():
    """--bandwidth counts frames: 1514 bytes on the wire carry 1448 bytes of TCP payload."""
    from dpro.whatif.platform import Platform
    from dpro.whatif.scaleout import Cluster, _transfer

    plat = Platform("gloo", 2, Transfer(10.0, 0.0001), source="p.json")
    t, _ = _transfer(None, Cluster(2, bandwidth=1.0), plat, "allreduce")
    assert (t.alpha, t.beta) == (10.0, pytest.approx(1514 / 1448))
    plat = Platform("gloo", 2, Transfer(10.0, 2.0), source="p.json")  # profiled at 1 B/µs, predicted at 2
    t, _ = _transfer(None, Cluster(2, bandwidth=2.0, profiled_bandwidth=1.0), plat, "allreduce")
    assert t.beta == pytest.approx(2.0 - 1514 / 1448 + 1514 / 1448 / 2)


def _two_ops_and_an_allreduce() -> tuple[WhatIfGraph, Op, Op, Op]:
    """a (100 µs) then b (60 µs), and a 400-byte all-reduce of 50 µs after a."""
    g = WhatIfGraph()
    a, b = _op(g, "a", 100.0), _op(g, "b", 60.0)
    g.connect(a, b)
    ar = g.insert([a], Op(name="ar", cat="COMM", device="link", dur=50.0, comm_device=True, bytes=400,
                          attrs={"sub_op": "ALLREDUCE"}))
    return g, a, b, ar


def test_saturated_profile_is_deflated():
    """The graph of test_collective_cpu_counts_as_demand profiled at 2 workers on 2 cores:
    T = 160, busy = 160, CPU of the all-reduce at 2 ranks 40: 2*(160/f + 40) = 2*160 ->
    f = 4/3; every op / f; scaled back out to 2 workers it gives the profile's 160 µs again."""
    from dpro.whatif.scaleout import Cluster, _oversubscribed, _simulate_point, deflate_contended

    g, a, b, ar = _two_ops_and_an_allreduce()
    c = Cluster(2, host_cores=2, comm_cpu=Transfer(0.0, 0.1))
    assert deflate_contended(g.copy(), replace(c, comm_cpu=None), 2) == 1.0
    assert deflate_contended(g.copy(), replace(c, host_cores=4), 2) == 1.0  # 4 cores: room to spare
    f = deflate_contended(g, c, 2)
    assert f == pytest.approx(4 / 3)
    assert (a.dur, b.dur, ar.dur) == (pytest.approx(75.0), pytest.approx(45.0), pytest.approx(37.5))
    p = _oversubscribed(g, c, lambda h: _simulate_point(h, 2, None))
    assert p.iteration_us == pytest.approx(160.0, rel=1e-4)


def test_deflation_takes_the_profiles_measured_step():
    """The same graph, whose worker simulated alone steps 160 µs, profiled at a measured
    200 µs a step (the other rank's waits): 2*(160 + 40) = 2*200, the cores were not
    saturated, nothing is deflated; measured at 160 µs it is, by 4/3 as above."""
    from dpro.whatif.scaleout import Cluster, deflate_contended

    g = _two_ops_and_an_allreduce()[0]
    c = Cluster(2, host_cores=2, comm_cpu=Transfer(0.0, 0.1))
    assert deflate_contended(g.copy(), c, 2, step_us=200.0) == 1.0
    assert deflate_contended(g.copy(), c, 2, step_us=160.0) == pytest.approx(4 / 3)


def test_collectives_cpu_beyond_what_the_profile_holds():
    """A 400-byte all-reduce at 0.1 µs/B of CPU (ring: 2(N-1) steps of 400/N bytes): 40 µs
    at 2 ranks, 60 at 4. A profile of 2 ranks already holds the 40 in its op times, so 4
    ranks add 20 and 2 ranks nothing; a profile that holds none adds all 60. The saturated
    graph above, profiled at 2 ranks that hold their collectives' CPU: 2*160 = 2*160, not
    saturated, nothing deflated; at 4 ranks on 2 cores the step needs 4*(160+20)/2 = 360 µs."""
    from dpro.whatif.scaleout import Cluster, _oversubscribed, _simulate_point, comm_cpu_demand, deflate_contended

    g = _two_ops_and_an_allreduce()[0]
    c = Cluster(4, host_cores=2, comm_cpu=Transfer(0.0, 0.1))
    held = replace(c, comm_cpu_profiled=2)
    assert comm_cpu_demand(g, c) == pytest.approx(60.0)
    assert comm_cpu_demand(g, held) == pytest.approx(20.0)
    assert comm_cpu_demand(g, held, 2) == pytest.approx(0.0)
    assert comm_cpu_demand(g, replace(c, comm_cpu=None)) == 0.0
    assert deflate_contended(g.copy(), held, 2, step_us=160.0) == 1.0
    assert deflate_contended(g.copy(), c, 2, step_us=160.0) == pytest.approx(4 / 3)  # as above: counted twice
    p = _oversubscribed(g.copy(), held, lambda h: _simulate_point(h, 4, None))
    assert p.iteration_us == pytest.approx(360.0, rel=1e-4)


def test_two_rank_profile_holds_its_collectives_cpu(monkeypatch):
    """The bundled 2-rank DDP recording, its link fitted on its own collectives (8.4 and
    25.2 MB a step; 1 ns/B of CPU: 33.6 ms at 2 ranks, 50.4 at 4): predicting its own 2
    ranks on 2 cores with the collectives' CPU changes nothing, and 4 ranks add only the
    16.8 ms beyond 2 ranks', so they step faster than where the 50.4 ms came on top of op
    times that already hold the 33.6."""
    import dpro
    from dpro.whatif import scaleout
    from dpro.whatif.scaleout import Cluster, predict

    job = dpro.open(EXAMPLE)
    cpu = Transfer(0.0, 0.001)
    clusters = [Cluster(2, host_cores=2, comm_cpu=cpu), Cluster(4, host_cores=2, comm_cpu=cpu)]
    plain = predict(job, [Cluster(2, host_cores=2), Cluster(4, host_cores=2)])
    held = predict(job, clusters)
    assert not any("saturated" in n for n in held.notes)
    assert held.points[0].iteration_us == pytest.approx(plain.points[0].iteration_us)
    demand = scaleout.comm_cpu_demand
    monkeypatch.setattr(scaleout, "comm_cpu_demand",
                        lambda g, c, n=None: demand(g, replace(c, comm_cpu_profiled=0), n))
    twice = predict(job, clusters)
    assert plain.points[1].iteration_us <= held.points[1].iteration_us < twice.points[1].iteration_us


def test_horovod_profile_counts_the_collectives_cpu_in_full(tmp_path, monkeypatch):
    """A Horovod profile's op times hold its background thread's polling, not the gloo CPU
    `--cpu-cost` measures: its collectives' CPU is counted in full at N ranks, as for a profile
    holding none (the golden 2-worker recording, 4 ranks on 2 cores)."""
    import dpro
    from dpro.whatif import scaleout
    from dpro.whatif.scaleout import Cluster, predict

    rec = Path(__file__).resolve().parent / "data" / "golden" / "recordings" / "horovod_torch_mlp" / "raw"
    assert _cli("collect", str(rec), "-o", str(tmp_path / "hvd")).exit_code == 0
    job = dpro.open(tmp_path / "hvd")
    seen = []
    demand = scaleout.comm_cpu_demand
    monkeypatch.setattr(scaleout, "comm_cpu_demand", lambda g, c, n=None: seen.append(c.comm_cpu_profiled) or demand(g, c, n))
    predict(job, [Cluster(4, host_cores=2, comm_cpu=Transfer(0.0, 0.001))])
    assert seen and set(seen) == {0}


def test_calibrate_measures_time_and_cpu(tmp_path):
    """Two real gloo processes: every size has a wall and a CPU time, both fitted; the
    platform file reads back with the collectives' CPU cost."""
    import json

    from dpro.whatif.calibrate import calibrate
    from dpro.whatif.platform import load_platform

    d = calibrate(2, "gloo", sizes=[4096, 1 << 20], repeats=3, tries=2)
    assert [r["bytes"] for r in d["samples"]] == [4096, 1 << 20]
    assert len(d["tries"]) == 2  # each size: the median over the tries (of two: their mean)
    assert d["samples"][1]["us"] == pytest.approx((d["tries"][0][1]["us"] + d["tries"][1][1]["us"]) / 2)
    assert all(r["us"] > 0 and r["cpu_us"] >= 0 for r in d["samples"])
    ar = d["allreduce"]
    assert ar["cpu_alpha_us"] >= 0 and ar["cpu_beta_us_per_byte"] >= 0
    (tmp_path / "p.json").write_text(json.dumps(d))
    p = load_platform(tmp_path / "p.json")
    assert p.allreduce_cpu == Transfer(ar["cpu_alpha_us"], ar["cpu_beta_us_per_byte"])


def test_calibration_says_where_its_tries_disagree():
    """Sizes from 1 MiB whose tries differ by more than x1.25 are named (hand-made tries)."""
    from dpro.whatif.calibrate import fit_platform, unsteady_note

    def row(nbytes, us):
        return {"bytes": nbytes, "us": us, "cpu_us": us / 2, "overlapped_us": 2 * us, "overlapped_total_us": 100.0,
                "compute_done_us": 50.0}

    sizes = [4096, 1 << 20, 64 << 20]
    # 4 KiB: x3 apart but too small to judge; 1 MiB: x1.2 (steady); 64 MiB: 40 vs 74 ms
    tries = [[row(n, us) for n, us in zip(sizes, t)] for t in ([100.0, 1000.0, 40000.0], [300.0, 1200.0, 74000.0])]
    d = fit_platform(tries, 2, "gloo")
    assert d["unsteady"] == [{"bytes": 64 << 20, "min_us": 40000.0, "max_us": 74000.0}]
    assert unsteady_note(d) == ("note: the 2 tries disagree (64 MiB 40.0-74.0 ms): this machine's speed moved while "
                                "calibrating, and each size keeps the median; calibrate again with more --tries, "
                                "or when the machine is quiet")
    steady = fit_platform([[row(n, us) for n, us in zip(sizes, t)] for t in ([100.0, 1000.0, 40000.0],) * 2], 2, "gloo")
    assert steady["unsteady"] == [] and unsteady_note(steady) is None
    assert unsteady_note({"allreduce": {}}) is None  # a file from before the check


def test_cli_cpu_cost(tmp_path):
    """--cpu-cost: a platform file with the collectives' CPU slows 4 workers on 2 cores
    more than without it; one without it is one line, exit 2."""
    import json

    plain = tmp_path / "plain.json"
    plain.write_text('{"alpha_us": 10, "beta_us_per_byte": 0.001}')
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps({"format": "dpro-platform", "version": 1, "allreduce": {
        "alpha_us": 10, "beta_us_per_byte": 0.001, "cpu_alpha_us": 10, "cpu_beta_us_per_byte": 0.001}}))
    base = ["whatif", str(EXAMPLE), "--workers", "4", "--host-cores", "2", "--json"]
    r0, r1 = _cli(*base), _cli(*base, "--cpu-cost", str(cpu))
    assert r0.exit_code == 0 and r1.exit_code == 0, r0.output + r1.output
    assert json.loads(r1.output)["predicted_iteration_us"] > json.loads(r0.output)["predicted_iteration_us"]
    r = _cli(*base, "--cpu-cost", str(plain))
    assert r.exit_code == 2 and "no cpu_alpha_us" in r.output and "Traceback" not in r.output
