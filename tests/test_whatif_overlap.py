"""Computation and collectives slowing each other while both run (dpro.whatif.overlap):
hand-computed fluid schedules, the inverse on a profile, the platform keys and the
calibration's measurement on real gloo processes."""

from __future__ import annotations

import json

from pathlib import Path

import pytest

from dpro.errors import DproInputError
from dpro.whatif.graph import Op, WhatIfGraph
from dpro.whatif.overlap import Overlap, deflate_overlap
from dpro.whatif.platform import OverlapCost, Transfer, load_platform

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp_gloo_2rank_mlp"


def _graph(compute_us: float = 10.0, comm_us: float = 4.0) -> tuple[WhatIfGraph, Op, Op, Op]:
    """``p`` (2 µs) then, at once, computation ``a`` on the main thread and collective ``c``
    on the comm queue, both before ``z`` (1 µs)."""
    g = WhatIfGraph()
    p = g.add(Op("p", "BW", "w0/cpu", 2.0, node="w0"))
    a = g.add(Op("a", "BW", "w0/cpu", compute_us, node="w0"))
    c = g.add(Op("c", "COMM", "w0/comm", comm_us, node="w0", comm_device=True, bytes=1000,
                 attrs={"sub_op": "ALLREDUCE"}))
    z = g.add(Op("z", "UPDATE", "w0/cpu", 1.0, node="w0"))
    for x, y in ((p, a), (p, c), (a, z), (c, z)):
        g.connect(x, y)
    return g, a, c, z


def _span(r, op: Op) -> tuple[float, float]:
    k = r.ids.index(op.id)
    return float(r.schedule.start[k]), float(r.schedule.end[k])


def test_overlapped_schedule_hand_computed():
    """c alone 4 µs, 8 µs overlapped: it moves at 1/2 while a computes; a moves at 0.5 while c
    runs. From t=2: c ends at 2 + 4/0.5 = 10, a has done 4 of 10 by then and ends at 16; z at 17."""
    g, a, c, z = _graph()
    assert g.simulate().iteration_us == pytest.approx(13.0)  # no law: a 2..12, z 12..13
    g.overlap = Overlap(0.5, {c.id: 8.0})
    r = g.simulate()
    assert _span(r, c) == pytest.approx((2.0, 10.0))
    assert _span(r, a) == pytest.approx((2.0, 16.0))
    assert r.iteration_us == pytest.approx(17.0)


def test_overlap_ends_when_computation_ends():
    """a (3 µs) ends first: it moves at 0.8 while c runs (ends at 2 + 3/0.8 = 5.75); c moved
    at 4/8 until then (1.875 of 4 done) and the rest alone at 1: ends at 5.75 + 2.125 = 7.875."""
    g, a, c, z = _graph(compute_us=3.0)
    g.overlap = Overlap(0.8, {c.id: 8.0})
    r = g.simulate()
    assert _span(r, a)[1] == pytest.approx(5.75)
    assert _span(r, c)[1] == pytest.approx(7.875)
    assert r.iteration_us == pytest.approx(8.875)


def test_overlap_leaves_other_nodes_and_gpu_ops_alone():
    """Only the collective's own node slows; a GPU stream's kernel does not share the cores."""
    g, a, c, z = _graph()
    a.node = "w1"
    g.overlap = Overlap(0.5, {c.id: 8.0})
    r = g.simulate()
    assert _span(r, a) == pytest.approx((2.0, 12.0)) and _span(r, c) == pytest.approx((2.0, 6.0))
    g, a, c, z = _graph()
    a.device = "w0/gpu:0"
    g.overlap = Overlap(0.5, {c.id: 8.0})
    r = g.simulate()
    assert _span(r, a) == pytest.approx((2.0, 12.0))


def test_deflate_overlap_is_the_inverse():
    """A profile where a took 14 µs, 8 of them beside c at rate 0.5: alone it is 14 - 8*0.5 = 10;
    simulated again with the law, it takes 14 again."""
    g, a, c, z = _graph(compute_us=14.0, comm_us=8.0)
    removed = deflate_overlap(g, 0.5)
    assert removed == pytest.approx(4.0)
    assert g.op("a").dur == pytest.approx(10.0)
    g.overlap = Overlap(0.5, {c.id: 8.0})  # as profiled the collective took its overlapped time
    c.dur = 4.0
    assert _span(g.simulate(), a) == pytest.approx((2.0, 16.0))


def test_platform_overlap_keys(tmp_path):
    """The calibration's overlap keys read back; a bad rate is one line naming the file."""
    d = {"format": "dpro-platform", "version": 1, "allreduce": {
        "alpha_us": 10, "beta_us_per_byte": 0.001, "overlap_alpha_us": 30, "overlap_beta_us_per_byte": 0.002,
        "overlap_compute_rate": 0.6}}
    p = tmp_path / "p.json"
    p.write_text(json.dumps(d))
    assert load_platform(p).allreduce_overlap == OverlapCost(Transfer(30.0, 0.002), 0.6)
    d["allreduce"]["overlap_compute_rate"] = 0
    p.write_text(json.dumps(d))
    with pytest.raises(DproInputError, match="overlap_compute_rate"):
        load_platform(p)
    del d["allreduce"]["overlap_compute_rate"], d["allreduce"]["overlap_alpha_us"], d["allreduce"]["overlap_beta_us_per_byte"]
    p.write_text(json.dumps(d))
    assert load_platform(p).allreduce_overlap is None


def test_scaleout_applies_the_law_only_with_host_cores_and_the_platform_as_calibrated(tmp_path):
    """The bundled 2-rank DDP profile predicted with a platform: with --host-cores and the
    overlap keys the computation beside the all-reduces slows (the step grows); with --bandwidth
    given, or without --host-cores, the law is not applied."""
    from dpro.job import open_job
    from dpro.whatif.scaleout import Cluster, predict

    base = {"alpha_us": 200.0, "beta_us_per_byte": 0.001, "cpu_alpha_us": 10.0, "cpu_beta_us_per_byte": 0.0001}
    law = {"overlap_alpha_us": 2000.0, "overlap_beta_us_per_byte": 0.01, "overlap_compute_rate": 0.3}
    plain, over = tmp_path / "plain.json", tmp_path / "over.json"
    for path, ar in ((plain, base), (over, {**base, **law})):
        path.write_text(json.dumps({"format": "dpro-platform", "version": 1, "allreduce": ar}))
    job = open_job(EXAMPLE)

    def step(platform, **kw) -> tuple[float, list[str]]:
        r = predict(job, [Cluster(2, **kw)], load_platform(platform))
        return r.predicted_iteration_us, r.notes

    t0, _ = step(plain, host_cores=2)
    t1, notes = step(over, host_cores=2)
    assert t1 > t0 and any("slow each other" in n for n in notes)
    assert step(over)[0] == pytest.approx(step(plain)[0])  # no --host-cores
    assert step(over, host_cores=2, bandwidth=100.0)[0] == pytest.approx(step(plain, host_cores=2, bandwidth=100.0)[0])


def test_calibrate_measures_the_overlap(tmp_path):
    """Two real gloo processes: every size is also timed while the ranks compute; the overlap
    fit and the computation's rate are in the platform file and read back."""
    from dpro.whatif.calibrate import calibrate

    d = calibrate(2, "gloo", sizes=[65536, 4 << 20], repeats=3, tries=1)
    assert all(r["overlapped_us"] > 0 and r["compute_done_us"] >= 0 for r in d["samples"])
    ar = d["allreduce"]
    assert 0 < ar["overlap_compute_rate"] <= 1.5
    (tmp_path / "p.json").write_text(json.dumps(d))
    o = load_platform(tmp_path / "p.json").allreduce_overlap
    assert o == OverlapCost(Transfer(ar["overlap_alpha_us"], ar["overlap_beta_us_per_byte"]), ar["overlap_compute_rate"])


def test_cli_calibrate_bad_tries(tmp_path):
    """--tries 0: one line, exit 2, nothing written."""
    from click.testing import CliRunner

    from dpro.cli import cli

    r = CliRunner().invoke(cli, ["calibrate", "--tries", "0", "-o", str(tmp_path / "p.json")])
    assert r.exit_code == 2 and "--tries 0: at least 1" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "p.json").exists()


def test_cli_calibrate_backend_errors(tmp_path):
    """An unknown backend is a usage error; a backend this torch lacks (NCCL on the CPU build)
    fails in its ranks: one line naming it, exit 2, no file written."""
    from click.testing import CliRunner

    from dpro.cli import cli

    out = tmp_path / "p.json"
    r = CliRunner().invoke(cli, ["calibrate", "--backend", "foo", "-o", str(out)])
    assert r.exit_code == 2 and "'foo' is not one of" in r.output
    import torch.distributed as dist

    if dist.is_nccl_available():
        return
    r = CliRunner().invoke(cli, ["calibrate", "--backend", "nccl", "--tries", "1", "-o", str(out)])
    assert r.exit_code == 2 and "--backend nccl: a calibration rank failed" in r.output
    assert "Traceback" not in r.output and not out.exists()
