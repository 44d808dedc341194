"""dpro oracle: the formulas on a hand-computed two-layer network, every limit, a real
trace's layers, the command line and its bad input (docs/oracle.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpro.oracle.calibration import Cost
from dpro.oracle.formulas import GE, HALO, LAYERWISE, P2P, Link, Options, predict
from dpro.oracle.layers import OTHER, WEIGHTED, Layer, ModelProfile
from dpro.oracle.platform import Platform

DATA = Path(__file__).parent / "data" / "oracle_cnn"
B = 8
PLAT = Platform(alpha_us=10.0, beta_us_per_byte=0.01)


def two_layers() -> ModelProfile:
    """conv (2 -> 4 channels, 4x4, 3x3 kernel) then fc (256 B in, 2 outputs)."""
    conv = Layer("conv", WEIGHTED, fw_us=10, bw_us=20, wu_us=3, x_bytes=128, y_bytes=256, w_bytes=300,
                 channels=2, filters=4, height=4, width=4, kernel=3)
    fc = Layer("fc", WEIGHTED, fw_us=1, bw_us=2, wu_us=5, x_bytes=256, y_bytes=8, w_bytes=2000, channels=64, filters=2)
    return ModelProfile([conv, fc], batch=4)


def run(strategy: str, p: int, **kw):
    return predict(two_layers(), strategy, p, PLAT, Options(batch=B, **kw))


def test_link_formulas() -> None:
    link = Link(Cost(10, 0.01))
    assert link.allreduce(4, 400) == pytest.approx(2 * 3 * (10 + 0.01 * 100))
    assert link.allgather(4, 400) == pytest.approx(3 * (10 + 0.01 * 100))
    assert link.p2p(100) == pytest.approx(11)
    assert link.shared(2).allreduce(2, 100) == pytest.approx(2 * (10 + 2 * 0.01 * 50))
    assert link.allreduce(1, 100) == 0


def test_data() -> None:
    x = run("data", 2)
    assert x.compute_us == pytest.approx((10 + 20 + 1 + 2) * 8 / 2 + 3 + 5)  # 140
    assert x.communication_us == {GE: pytest.approx(2 * (10 + 0.01 * 2300 / 2))}  # 43
    assert x.iteration_us == pytest.approx(183)
    assert x.memory_bytes == 2 * 4 * (128 + 256) + 2 * 300 + 2 * 4 * (256 + 8) + 2 * 2000  # 9784
    assert x.feasible and x.grid == {"data": 2}


def test_filter() -> None:
    x = run("filter", 2)
    assert x.compute_us == pytest.approx(33 * 8 / 2 + 8 / 2)  # 136
    # gather of conv's output, gather of fc's output, all-reduce of fc's input gradient
    assert x.communication_us[LAYERWISE] == pytest.approx(20.24 + 10.32 + 40.48)
    assert x.memory_bytes == 2 * 8 * 384 + 300 + 2 * 8 * 264 + 2000


def test_channel() -> None:
    x = run("channel", 2)
    assert x.compute_us == pytest.approx(136)
    # all-reduce of conv's output, all-reduce of fc's output, gather of fc's input gradient
    assert x.communication_us[LAYERWISE] == pytest.approx(40.48 + 20.64 + 20.24)


def test_spatial() -> None:
    x = run("spatial", 2)
    assert x.compute_us == pytest.approx(30 * 8 / 2 + 3 * 8 + 8)  # conv split, fc replicated
    halo = 1 * 4 * 2 * 4  # kernel // 2 rows x width x channels x 4 bytes
    assert x.communication_us[HALO] == pytest.approx(2 * 1 * (10 + 0.01 * 8 * halo))  # 25.12
    assert x.communication_us[LAYERWISE] == pytest.approx(1 * (10 + 0.01 * 8 * 256 / 2))  # row gather
    assert x.communication_us[GE] == pytest.approx(2 * (10 + 0.01 * 300 / 2))  # conv weights only
    assert x.memory_bytes == 2 * 4 * 384 + 600 + 2 * 8 * 264 + 4000


def test_pipeline() -> None:
    x = run("pipeline", 2, micro=2)
    assert x.grid == {"stages": 2, "micro_batches": 2, "cuts": ["fc"]}
    assert x.compute_us == pytest.approx((2 + 2 - 1) * (10 * 4 + 20 * 4) + 5)  # 365
    assert x.communication_us[P2P] == pytest.approx(2 * (2 + 2 - 2) * (10 + 0.01 * 4 * 256))  # 80.96
    assert x.memory_bytes == max(2 * 8 * 384 + 600, 2 * 8 * 264 + 4000)


def test_hybrids_with_contention() -> None:
    x = run("data+filter", 4)
    assert x.grid == {"data": 2, "filter": 2} and x.contention == 2
    assert x.compute_us == pytest.approx(33 * 4 / 2 + 8 / 2)  # 70
    assert x.communication_us[LAYERWISE] == pytest.approx(71.04)  # phi = 2 on 4 samples = filter on 8
    assert x.communication_us[GE] == pytest.approx(2 * (10 + 2 * 0.01 * 1150 / 2))  # 43
    y = run("data+spatial", 4)
    assert y.compute_us == pytest.approx(30 * 4 / 2 + 3 * 4 + 8)  # 80
    assert y.communication_us[HALO] == pytest.approx(2 * (10 + 2 * 0.01 * 4 * 32))
    assert y.communication_us[GE] == pytest.approx(2 * 3 * (10 + 0.01 * 75) + 2 * (10 + 2 * 0.01 * 1000))
    z = predict(two_layers(), "data+filter", 4, PLAT, Options(batch=B, contention=False))
    assert z.communication_us[GE] == pytest.approx(2 * (10 + 0.01 * 1150 / 2)) and z.contention == 1


@pytest.mark.parametrize("strategy,p,limit", [
    ("data", 16, "batch"),            # 16 devices > 8 samples
    ("filter", 4, "filters"),         # fc has 2 outputs
    ("channel", 4, "channels"),       # conv has 2 input channels
    ("spatial", 8, "height"),         # 4 rows
    ("pipeline", 3, "layers"),        # 2 layers with weights
    ("data+filter", 2, "devices"),    # no 2 x 2 split of 2
    ("data+filter", 8, "filters"),    # 2 x 4 and 4 x 2: the best feasible split is chosen...
])
def test_limits(strategy: str, p: int, limit: str) -> None:
    x = run(strategy, p)
    if strategy == "data+filter" and p == 8:  # ...4 data x 2 filter is feasible
        assert x.feasible and x.grid == {"data": 4, "filter": 2}
        return
    assert not x.feasible and x.limit == limit, x.limit_reason
    assert run(strategy, 2 if strategy != "data+filter" else 4).feasible


def test_memory_limit() -> None:
    x = run("data", 2, memory_budget=9000)
    assert not x.feasible and x.limit == "memory" and "9784" in x.limit_reason
    assert run("data", 4, memory_budget=9000).feasible  # activations shrink with more devices


def test_model_from_real_trace() -> None:
    """The bundled trace: examples/parallel/train.py --strategy data, 2 ranks, batch 32."""
    import dpro
    from dpro.oracle.layers import model_profile

    m = model_profile(dpro.open(DATA))
    assert m.batch == 16
    names = [x.name for x in m.layers]
    assert names[:9] == ["conv1", "relu1", "conv2", "relu2", "pool2", "conv3", "relu3", "flatten", "fc"]
    conv1, pool2, fc = m.layers[0], m.layers[4], m.layers[8]
    assert (conv1.kind, conv1.channels, conv1.filters, conv1.height, conv1.kernel) == (WEIGHTED, 4, 16, 16, 3)
    assert (conv1.x_bytes, conv1.y_bytes, conv1.w_bytes) == (4 * 16 * 16 * 4, 16 * 16 * 16 * 4, (16 * 4 * 9 + 16) * 4)
    assert pool2.y_bytes == 32 * 8 * 8 * 4
    assert (fc.kind, fc.channels, fc.filters, fc.w_bytes) == (WEIGHTED, 2048, 8, (8 * 2048 + 8) * 4)
    assert m.layers[-1].name == "(rest)" and m.layers[-1].kind == OTHER
    assert all(x.fw_us > 0 and x.bw_us > 0 for x in m.layers)


def test_cli_json(run_cli) -> None:
    code, out, err = run_cli("oracle", DATA, "--devices", "2,4,8", "--memory", "4MiB", "--json")
    assert code == 0, err
    d = json.loads(out)
    rows = {(r["strategy"], r["devices"]): r for r in d["strategies"]}
    assert len(rows) == 21
    for r in rows.values():
        assert set(r) >= {"strategy", "devices", "iteration_us", "compute_us", "communication_us", "memory_bytes",
                          "feasible", "limit"}
    assert rows[("channel", 8)]["limit"] == "channels" and rows[("pipeline", 8)]["limit"] == "layers"
    assert rows[("data", 2)]["rank"] == 1 or rows[("data", 2)]["feasible"]
    assert rows[("filter", 2)]["limit"] == "memory"
    # gamma is fitted so that the profiled configuration (data, 2 x 16 samples) predicts the
    # recorded peak (dpro's memory model on the trace's allocations)
    peak = max(m.peak_bytes for m in __import__("dpro").open(DATA).replay().memory.values())
    assert rows[("data", 2)]["memory_bytes"] == pytest.approx(peak, abs=2)
    assert any("memory reuse factor" in n for n in d["notes"])
    assert "--micro" in rows[("pipeline", 4)]["launcher"]


def test_cli_summary_and_platform(run_cli, tmp_path: Path) -> None:
    plat = tmp_path / "platform.json"
    plat.write_text(json.dumps({"alpha_us": 5, "beta_us_per_byte": 0.001}))
    code, out, err = run_cli("oracle", DATA, "--devices", "4", "--platform", plat)
    assert code == 0, err
    assert "best:" in out and "launcher:" in out and "α 5.0 µs" in out


def test_platform_from_calibrate(run_cli, tmp_path: Path) -> None:
    """The file `dpro calibrate` writes (dpro.graph.platform) is read as it is: its all-reduce cost."""
    plat = tmp_path / "platform.json"
    plat.write_text(json.dumps({"format": "dpro-platform", "version": 1, "backend": "gloo", "processes": 2,
                                "allreduce": {"alpha_us": 7, "beta_us_per_byte": 0.002}, "cores": 2}))
    code, out, err = run_cli("oracle", DATA, "--devices", "4", "--platform", plat)
    assert code == 0, err
    assert "α 7.0 µs" in out


@pytest.mark.parametrize("args,msg", [
    (["--devices", "0"], "device count"),
    (["--devices", "2,x"], "device count"),
    (["--memory", "lots"], "not a size"),
    (["--batch", "0"], "--batch"),
])
def test_bad_options(run_cli, args, msg) -> None:
    code, out, err = run_cli("oracle", DATA, *args)
    assert code != 0 and msg in err


def test_bad_platform(run_cli, tmp_path: Path) -> None:
    plat = tmp_path / "p.json"
    plat.write_text(json.dumps({"alpha_us": "fast"}))
    code, _, err = run_cli("oracle", DATA, "--platform", plat)
    assert code == 2 and "alpha_us" in err and len(err.strip().splitlines()) == 1


def test_trace_without_layers(run_cli) -> None:
    """A torch.profiler trace without dpro's layer annotations: one line saying what is needed."""
    trace = Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp_gloo_2rank_mlp"
    code, _, err = run_cli("oracle", trace, "--devices", "2")
    assert code == 2 and "layer annotations" in err and "dpro.Recorder" in err
    assert len(err.strip().splitlines()) == 1


def test_trace_without_shapes(run_cli, tmp_path: Path) -> None:
    """Layer annotations but no recorded shapes (the layer_shapes meta removed)."""
    import gzip
    import shutil

    d = tmp_path / "noshapes"
    shutil.copytree(DATA, d)
    for f in d.glob("*.dfg.json.gz"):
        dfg = json.loads(gzip.decompress(f.read_bytes()))
        dfg.get("meta", {}).pop("layer_shapes", None)
        f.write_bytes(gzip.compress(json.dumps(dfg).encode()))
    code, _, err = run_cli("oracle", d, "--devices", "2")
    assert code == 2 and "no recorded layer shapes" in err and "--shapes" in err


def test_simulate() -> None:
    """--simulate: one group without overlap replays the analytical sum; GPipe's schedule
    (hand-computed: stage 0 conv 40/80 µs per micro-batch, stage 1 fc 4/8, transfers
    20.24, each a rendezvous of both stages as gloo's dist.send / dist.recv are: stage 0
    FW m0 0-40, send 40-60.24, FW m1 -100.24, send -120.48; stage 1 FW m1 -124.48, BW m0
    -132.48, gradient to stage 0 (waiting in its recv since 120.48) -152.72, BW m1
    -160.72; stage 0 BW m0 152.72-232.72, only then receives m1's gradient -252.96 (stage
    1 waits in its send), BW m1 -332.96, update 3: 335.96; with a buffered send, 315.72)."""
    from dpro.oracle.simulate import simulate_prediction

    opts = Options(batch=B, micro=2)
    for s in ("data", "filter", "channel", "spatial"):
        x = run(s, 2)
        assert simulate_prediction(two_layers(), x, PLAT, opts) == pytest.approx(x.iteration_us), s
    pipe = run("pipeline", 2, micro=2)
    assert simulate_prediction(two_layers(), pipe, PLAT, opts) == pytest.approx(335.96)
    # 2 data groups' layer-wise collectives queue on one link: no faster than one group alone
    df = run("data+filter", 4)
    assert simulate_prediction(two_layers(), df, PLAT, Options(batch=B)) >= df.compute_us + 71.04 / 2


def test_simulate_pipeline_rendezvous_three_stages() -> None:
    """An inner stage receives and sends every micro-batch, each transfer a rendezvous
    (hand-computed: three linear layers, one per stage, 2 / 4 µs forward / backward per
    micro-batch of 2 samples, transfers 10 + 0.01 x 2 x 50 = 11 µs, update 1 µs each).
    Forward: s0 FW m0 0-2, ->s1 2-13; s1 FW m0 -15, ->s2 15-26; s2 FW m0 -28; s0 FW m1
    13-15, ->s1 waits for s1's send of m0: 26-37; s1 FW m1 -39, ->s2 39-50; s2 FW m1 -52.
    Backward: s2 BW m0 -56, ->s1 56-67; s1 BW m0 -71, ->s0 71-82; s0 BW m0 -86; s2 BW m1
    67-71, ->s1 waits for s1's send of m0's gradient: 82-93; s1 BW m1 -97, ->s0 97-108;
    s0 BW m1 -112, update -113. ParaDL's sum: 4 x 6 + 1 + 2 x 3 x 11 = 91."""
    from dpro.oracle.simulate import simulate_prediction

    lay = [Layer(n, WEIGHTED, fw_us=1, bw_us=2, wu_us=1, x_bytes=50, y_bytes=50, w_bytes=40, channels=10, filters=10)
           for n in ("fc1", "fc2", "fc3")]
    m = ModelProfile(lay, batch=2)
    opts = Options(batch=4, micro=2)
    pipe = predict(m, "pipeline", 3, PLAT, opts)
    assert pipe.grid["cuts"] == ["fc2", "fc3"]
    assert pipe.iteration_us == pytest.approx(91)
    assert simulate_prediction(m, pipe, PLAT, opts) == pytest.approx(113)


def calibrated(links: dict | None = None) -> Platform:
    """PLAT with hand-chosen host costs (and, optionally, per process count links)."""
    from dpro.oracle.calibration import Calibration, Cost, HostCosts

    host = HostCosts(cat=Cost(1, 0.001), slice=Cost(2, 0.002), clone=Cost(3, 0.003), zeros=Cost(4, 0.004),
                     function_us=10)
    return Platform(10.0, 0.01, calibration=Calibration(links or {}, host))


def test_host_costs_by_strategy() -> None:
    """The host work around the collectives of examples/parallel/, hand-computed on the
    two-layer network (B = 8, p = 2): cat 1 µs + 1 ns/B, slice 2 + 2, clone 3 + 3, zeros
    4 + 4, one autograd.Function 10 µs."""
    plat, opts = calibrated(), Options(batch=B)
    # filter: per block a Function + cat of the gathered output; backward: slice of it
    f = predict(two_layers(), "filter", 2, plat, opts)
    conv = (10 + 1 + 0.001 * 8 * 256) + (2 + 0.002 * 8 * 256 / 2)  # 17.096
    fc = (10 + 1 + 0.001 * 8 * 8) + (2 + 0.002 * 8 * 8 / 2)        # 13.128
    assert f.host_us == {LAYERWISE: pytest.approx(conv + fc)}
    assert f.iteration_us == pytest.approx(run("filter", 2).iteration_us + conv + fc)
    # channel: two Functions, slice of x/p, clone of y; backward (not the first layer): cat of x
    c = predict(two_layers(), "channel", 2, plat, opts)
    conv = 20 + (2 + 0.002 * 512) + (3 + 0.003 * 2048)                             # 32.168
    fc = 20 + (2 + 0.002 * 1024) + (3 + 0.003 * 64) + (1 + 0.001 * 2048)           # 30.288
    assert c.host_us == {LAYERWISE: pytest.approx(conv + fc)}
    # spatial: the halo's Function, zeros, cat (forward), clone, zeros, additions (backward);
    # the row gather as filter's; the conv's gradients concatenated and copied back
    sp = predict(two_layers(), "spatial", 2, plat, opts)
    hb, xl = 8 * 32, 8 * 128 / 2
    halo = (10 + 2 * (4 + 0.004 * hb) + 1 + 0.001 * (xl + 2 * hb)) + ((3 + 0.003 * xl) + 2 * (4 + 0.004 * hb)
                                                                      + 2 * (3 + 0.003 * hb))  # 44.192
    assert sp.host_us == {HALO: pytest.approx(halo), LAYERWISE: pytest.approx(17.096),
                          GE: pytest.approx((1 + 0.3) + (3 + 0.9))}
    # data+filter: filter on 4 samples, its 1/p2 of the gradients concatenated, copied back, scaled
    df = predict(two_layers(), "data+filter", 4, plat, opts)
    assert df.host_us[LAYERWISE] == pytest.approx((11 + 1.024 + 2 + 1.024) + (11 + 0.032 + 2 + 0.032))
    assert df.host_us[GE] == pytest.approx((1 + 1.15) + 2 * (3 + 3.45))
    # data and pipeline: nothing beyond the profiled ops
    assert predict(two_layers(), "data", 2, plat, opts).host_us == {}
    assert predict(two_layers(), "pipeline", 2, plat, Options(batch=B, micro=2)).host_us == {}


def test_links_per_process_count() -> None:
    """A calibration's collectives measured at 2 and 4 processes: each job takes its own
    (8 processes: the largest measured below); the all-gather and the halo exchange their
    own α, β; one exchange with both neighbours is one calibrated exchange."""
    from dpro.oracle.calibration import Cost
    from dpro.oracle.formulas import link_of

    links = {2: {"allreduce": Cost(100, 0.1), "allgather": Cost(200, 0.2), "exchange": Cost(50, 0.05)},
             4: {"allreduce": Cost(300, 0.3)}}
    plat = calibrated(links)
    two, eight = link_of(plat, 2), link_of(plat, 8)
    assert two.allreduce(2, 1000) == pytest.approx(2 * (100 + 0.1 * 500))
    assert two.allgather(2, 1000) == pytest.approx(200 + 0.2 * 500)
    assert two.exchange(2, 100) == pytest.approx(50 + 0.05 * 2 * 100)  # both messages through the rank's link
    assert two.exchange(1, 100) == pytest.approx(50 + 0.05 * 100)
    assert eight.allreduce(4, 1000) == pytest.approx(6 * (300 + 0.3 * 250))
    assert eight.allgather(4, 1000) == pytest.approx(3 * (300 + 0.3 * 250))  # none measured: the all-reduce's
    assert Link(Cost(10, 0.01)).exchange(2, 100) == pytest.approx(2 * 11)  # uncalibrated: nb P2P in turn
    x = predict(two_layers(), "spatial", 2, plat, Options(batch=B))
    assert x.communication_us[HALO] == pytest.approx(2 * (50 + 0.05 * 8 * 32))


def test_simulate_with_host_costs() -> None:
    """One group: the replayed graph, host work included, is the analytical sum."""
    from dpro.oracle.calibration import Cost
    from dpro.oracle.simulate import simulate_prediction

    plat = calibrated({2: {"allreduce": Cost(100, 0.1), "allgather": Cost(200, 0.2), "exchange": Cost(50, 0.05)}})
    for s in ("filter", "channel", "spatial"):
        x = predict(two_layers(), s, 2, plat, Options(batch=B))
        assert x.host_us
        assert simulate_prediction(two_layers(), x, plat, Options(batch=B)) == pytest.approx(x.iteration_us), s


def test_calibration_fit_and_file(run_cli, tmp_path: Path) -> None:
    """gloo_link.py's samples fitted to their mean (each size's extremes trimmed: the slow
    outlier), written in a platform file's 'oracle' section and read back by `dpro oracle
    --platform`; a bad section: one line."""
    from dpro.oracle.calibration import Calibration, fit_collectives, fit_host

    ar = [[b, 2 * (100 + 0.01 * b / 2) + d] for b in (1024, 4096, 65536) for d in (-5, 5) * 5]
    ar[3][1] = 1e6  # trimmed
    host = {k: [[b, 5 + 0.001 * b] for b in (4096, 65536)] for k in ("cat", "slice", "clone", "zeros")}
    c = fit_collectives(2, {"allreduce": ar, "allgather": [[b, 100 + 0.01 * b / 2] for b in (2048, 8192)]})
    assert c["allreduce"].alpha == pytest.approx(100) and c["allreduce"].beta == pytest.approx(0.01)
    assert c["allgather"].alpha == pytest.approx(100) and "exchange" not in c
    h = fit_host(host, [9.0, 11.0, 30.0])
    assert h.cat.alpha == pytest.approx(5) and h.zeros.beta == pytest.approx(0.001) and h.function_us == 11
    plat = tmp_path / "platform.json"
    plat.write_text(json.dumps({"alpha_us": 5, "beta_us_per_byte": 0.001,
                                "oracle": Calibration({2: c}, h).to_json()}))
    code, out, err = run_cli("oracle", DATA, "--devices", "2", "--platform", plat, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["platform"]["oracle"]["links"]["2"]["allreduce"]["alpha_us"] == pytest.approx(100)
    assert any(r["host_us"] for r in d["strategies"] if r["strategy"] == "filter")
    plat.write_text(json.dumps({"alpha_us": 5, "beta_us_per_byte": 0.001, "oracle": {"host": {"cat": 3}}}))
    code, _, err = run_cli("oracle", DATA, "--devices", "2", "--platform", plat)
    assert code == 2 and "'oracle' section" in err and len(err.strip().splitlines()) == 1


def test_cores_slowdown() -> None:
    plat = Platform(10.0, 0.01, cores=2)
    x = predict(two_layers(), "data", 4, plat, Options(batch=B))
    assert x.compute_us == pytest.approx(((10 + 20 + 1 + 2) * 8 / 4 + 8) * 2)


def test_cli_simulate(run_cli) -> None:
    code, out, err = run_cli("oracle", DATA, "--devices", "2,4", "--simulate", "--json")
    assert code == 0, err
    rows = json.loads(out)["strategies"]
    for r in rows:
        assert ("simulated_iteration_us" in r) == r["feasible"], r["strategy"]
        if r["feasible"] and r["strategy"] in ("data", "filter", "channel", "spatial"):  # one group: the sum
            assert r["simulated_iteration_us"] == pytest.approx(r["iteration_us"], rel=1e-9)
        if r["feasible"] and r["strategy"] == "pipeline":  # the schedule fills some of the bubbles
            assert r["simulated_iteration_us"] < r["iteration_us"]


def test_layer_shapes_from_kineto_events() -> None:
    """The importer keeps the first shaped op of each layer annotation (innermost layer wins)."""
    from dpro.importers.kineto.read import RankFile, compact_events
    from dpro.importers.kineto.shapes import layer_shapes

    def ev(name, cat, ts, dur, args=None):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": 1, "args": args or {}}

    conv = {"Input Dims": [[8, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], []], "Input type": ["float"] * 3,
            "Concrete Inputs": ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "1"]}
    events = [
        ev("dpro.layer::block", "user_annotation", 0, 100),
        ev("dpro.layer::block.conv", "user_annotation", 1, 50),
        ev("aten::conv2d", "cpu_op", 2, 40, conv),
        ev("aten::convolution", "cpu_op", 3, 30, {"Input Dims": [[1]]}),  # a child: not the first
        ev("aten::add", "cpu_op", 60, 5, {"Input Dims": [[8, 16, 32, 32], [8, 16, 32, 32]]}),
        ev("dpro.layer::block.conv", "user_annotation", 200, 50),  # a second call: kept is the first
        ev("aten::conv2d", "cpu_op", 201, 40, {"Input Dims": [[4, 3, 32, 32]]}),
        ev("aten::relu", "cpu_op", 300, 5, {"Input Dims": [[8, 16]]}),  # outside any layer
    ]
    out = layer_shapes(RankFile(path=Path("r0.json"), rank=0, world_size=1, backend=None,
                                    events=compact_events(events)))
    assert set(out) == {"block", "block.conv"}
    assert out["block.conv"]["op"] == "aten::conv2d" and out["block.conv"]["dims"][0] == [8, 3, 32, 32]
    assert out["block.conv"]["concrete"][3] == "[1, 1]"
    assert out["block"]["op"] == "aten::add"


def test_layer_times_without_the_recorders_overhead() -> None:
    """Each worker's layer times are scaled by its own measured overhead, with the function
    `dpro replay` uses (dpro.graph.overhead.stats_without_overhead): worker0's window paced
    100 µs a step against 80 after it (x 0.8), worker1's was not slower (x 1)."""
    import dpro
    from dpro.oracle.layers import model_profile

    job = dpro.open(DATA)
    w0, w1 = job.trace.workers()
    for nt in (w0, w1):  # nothing measured: the times as recorded
        for k in ("step_wall_us", "step_wall_after_us", "steps"):
            nt.meta.pop(k, None)
    raw = {x.name: x for x in model_profile(job).layers}

    def own(nt, layer: str, cat: str) -> float:  # the worker's own time of the layer's ops per iteration
        st = job.stats[nt.info.name]
        return sum(st[o.id].dur for o in nt.ops.values() if o.id in st and o.cat == cat and o.layer == layer)

    walls = {"steps": [5, 6], "step_wall_us": [300, 200, 150, 120, 110, 100, 100]}
    w0.meta |= walls | {"step_wall_after_us": [200, 150, 90, 80, 80, 80]}
    w1.meta |= walls | {"step_wall_after_us": [200, 150, 90, 120, 120, 120]}
    m = model_profile(job)
    got = {x.name: x for x in m.layers}
    for name in ("conv1", "conv2", "fc"):
        f0, f1 = own(w0, name, "FW"), own(w1, name, "FW")
        assert raw[name].fw_us == pytest.approx((f0 + f1) / 2 / m.batch)
        assert got[name].fw_us == pytest.approx((0.8 * f0 + f1) / 2 / m.batch)
        b0, b1 = own(w0, name, "BW"), own(w1, name, "BW")
        assert got[name].bw_us == pytest.approx((0.8 * b0 + b1) / 2 / m.batch)
    assert any("overhead" in n and "worker0" in n and "scaled by 0.800" in n for n in m.notes)
    assert not any("worker1" in n for n in m.notes)
