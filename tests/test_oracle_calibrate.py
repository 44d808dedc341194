"""The oracle's calibration: a link with a token bucket (hand-computed), the topology
(shared link or one per rank), and ``dpro calibrate --oracle`` run for real with 2 gloo
processes (docs/oracle.md "Calibration")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpro.oracle.calibration import Calibration, Cost, _fit, fit_collectives, read_calibration, topology_of
from dpro.oracle.formulas import GE, LAYERWISE, Link, Options, link_of, predict
from dpro.oracle.measure import SIZES
from dpro.oracle.platform import Platform
from test_oracle import B, DATA, two_layers

#: 200 Mbit/s (0.04 µs/B) behind a 128 KiB bucket emptied at 1 ns/B, 100 µs per call
BUCKET = Cost(100, 0.04, 131072, 0.001)


def test_wire_of_a_token_bucket() -> None:
    assert BUCKET.wire(100_000) == pytest.approx(100)                          # all inside the burst
    assert BUCKET.wire(200_000) == pytest.approx(131.072 + 0.04 * 68_928)      # 2888.192
    # 2 ms since the bucket was emptied: 2000 / 0.04 = 50 000 bytes of tokens
    assert BUCKET.wire(200_000, refill_us=2000) == pytest.approx(50 + 0.04 * 150_000)  # 6050
    assert Cost(100, 0.04).wire(200_000) == pytest.approx(8000)               # no bucket: α + βm
    link = Link(BUCKET)
    assert link.allreduce(2, 100_000) == pytest.approx(2 * 100 + 100)          # a rank sends m = 100 000 B
    # 4 ranks: 6 calls, a rank sends 2·3/4 m = 150 000 B
    assert link.allreduce(4, 100_000) == pytest.approx(600 + 131.072 + 0.04 * 18_928)  # 1488.192
    assert link.allgather(2, 100_000) == pytest.approx(100 + 50)               # (n-1)/n m = 50 000 B
    assert link.shared(2).allreduce(2, 100_000) == pytest.approx(200 + 2 * 100)


def test_fit_finds_the_bucket() -> None:
    """Samples of a bucketed all-reduce at 2 processes (each the true cost ± 1 %): the fit
    finds its knee, rates and α; a plain link's samples keep α + βm."""
    truth = [[s, (2 * 100 + BUCKET.wire(s)) * f] for s in SIZES for f in (0.99, 1.0, 1.01)]
    c = fit_collectives(2, {"allreduce": truth})["allreduce"]
    assert c.burst == 131072
    assert c.beta == pytest.approx(0.04, rel=0.02) and c.beta_burst == pytest.approx(0.001, rel=0.2)
    assert c.alpha == pytest.approx(100, rel=0.1)
    plain = [[s, (2 * 100 + 0.04 * s) * f] for s in SIZES for f in (0.99, 1.0, 1.01)]
    p = fit_collectives(2, {"allreduce": plain})["allreduce"]
    assert p.burst == 0 and p.beta == pytest.approx(0.04, rel=0.01)
    # a halo exchange at 4 processes: an inner rank sends each message to 2 neighbours
    ex = [[s, 100 + BUCKET.wire(2 * s)] for s in SIZES]
    e = fit_collectives(4, {"exchange": ex})["exchange"]
    assert e.burst == 131072 and e.beta == pytest.approx(0.04)
    assert _fit([[s, 5 + 0.001 * s] for s in SIZES], 1, 1).burst == 0  # host ops: never a bucket
    # a fast link that bends (loopback: flat to 64 KiB, then 1 ns/B): the "burst" would save
    # 64 KiB x 1 ns = 66 µs, less than a call's 2 x 1000 µs: not a bucket
    bend = [[s, (2000 + 0.001 * max(0, s - 65536)) * f] for s in SIZES for f in (0.99, 1.0, 1.01)]
    assert fit_collectives(2, {"allreduce": bend})["allreduce"].burst == 0


def test_bucket_refills_between_collectives() -> None:
    """Filter parallelism on 2 devices of the two-layer network over a bucketed link
    (α 10 µs, β 0.1 µs/B, 1000 B burst at 0.001 µs/B): 3 calls in 136 µs of compute, so the
    bucket refills 45.33 µs / 0.1 = 453.3 B between two of them."""
    from dpro.oracle.simulate import simulate_prediction

    bucket = Cost(10, 0.1, 1000, 0.001)
    plat = Platform(10.0, 0.1, calibration=Calibration({2: {"allreduce": bucket}}))
    x = predict(two_layers(), "filter", 2, plat, Options(batch=B))
    assert x.calls == 3 and x.refill_us == pytest.approx(136 / 3)
    fast = 136 / 3 / 0.1  # 453.33 B of tokens
    gather_conv = 10 + 0.001 * fast + 0.1 * (1024 - fast)     # all-gather of 2048 B: a rank sends 1024
    gather_fc = 10 + 0.001 * 32                                # 64 B: all of it in the bucket
    reduce_fc = 20 + 0.001 * fast + 0.1 * (2048 - fast)        # fc's input gradient, 2048 B
    assert x.communication_us[LAYERWISE] == pytest.approx(gather_conv + gather_fc + reduce_fc)  # 257.472
    # data: one all-reduce after 140 µs of compute: a full bucket
    d = predict(two_layers(), "data", 2, plat, Options(batch=B))
    assert d.communication_us[GE] == pytest.approx(20 + 1 + 0.1 * 1300)
    # the simulated graph charges the same refilled bucket (one group: the analytical sum)
    assert simulate_prediction(two_layers(), x, plat, Options(batch=B)) == pytest.approx(x.iteration_us)


def test_topology_decides_the_contention() -> None:
    """Ranks with links of their own: a hybrid's concurrent groups do not share one (φ = 1,
    as --no-contention); a shared link (the default): φ = the groups."""
    from dpro.oracle.simulate import simulate_prediction

    cal = {2: {"allreduce": Cost(10, 0.01)}}
    own = Platform(10.0, 0.01, calibration=Calibration(cal, topology="per-rank"))
    shared = Platform(10.0, 0.01, calibration=Calibration(cal))
    opts = Options(batch=B)
    x = predict(two_layers(), "data+filter", 4, own, opts)
    assert x.contention == 1
    assert x.iteration_us == pytest.approx(predict(two_layers(), "data+filter", 4, shared,
                                                   Options(batch=B, contention=False)).iteration_us)
    y = predict(two_layers(), "data+filter", 4, shared, opts)
    assert y.contention == 2 and y.iteration_us > x.iteration_us
    # simulated: one link per group with links of their own, one queue when shared
    assert simulate_prediction(two_layers(), x, own, opts) <= simulate_prediction(two_layers(), y, shared, opts)
    # measured: two pairs' all-reduces at once vs one pair alone
    pair = [[1 << 20, 100.0]] * 5
    assert topology_of({"pair": pair, "concurrent": [[1 << 20, 195.0]] * 5}) == ("shared", pytest.approx(1.95))
    assert topology_of({"pair": pair, "concurrent": [[1 << 20, 104.0]] * 5}) == ("per-rank", pytest.approx(1.04))
    assert topology_of({"allreduce": pair}) is None


def test_calibration_file_round_trip() -> None:
    cal = Calibration({2: {"allreduce": BUCKET, "exchange": Cost(5, 0.002)}}, topology="per-rank",
                      concurrent_ratio=1.04)
    back = read_calibration(json.loads(json.dumps(cal.to_json())))
    assert back.links[2]["allreduce"] == BUCKET and back.topology == "per-rank" and back.concurrent_ratio == 1.04
    assert "burst_bytes" not in cal.to_json()["links"]["2"]["exchange"]
    assert link_of(Platform(1, 1, calibration=back), 2).bursty
    for bad in ({"topology": {"links": "mesh"}},
                {"links": {"2": {"allreduce": {"alpha_us": 1, "beta_us_per_byte": 1, "burst_bytes": -1}}}}):
        with pytest.raises(ValueError):
            read_calibration(bad)


@pytest.mark.slow
def test_calibrate_oracle_cli(run_cli, tmp_path: Path) -> None:
    """`dpro calibrate --oracle` for real: 2 gloo processes on loopback, one round, no idle
    (seconds); the file is a platform file `dpro oracle --platform` reads."""
    pytest.importorskip("torch")
    out = tmp_path / "platform.json"
    code, text, err = run_cli("calibrate", "--oracle", "--nprocs", "2", "--rounds", "1", "--idle-us", "0",
                              "--topology", "per-rank", "-o", out)
    assert code == 0, err
    assert "2 processes allreduce" in text and "per-rank (declared)" in text
    d = json.loads(out.read_text())
    assert d["format"] == "dpro-platform" and d["processes"] == 2 and d["cores"] >= 1
    links = d["oracle"]["links"]["2"]
    assert set(links) == {"allreduce", "allgather", "exchange"}
    assert links["allreduce"]["alpha_us"] + links["allreduce"]["beta_us_per_byte"] > 0
    assert d["oracle"]["host"]["function_us"] > 0 and d["oracle"]["topology"]["links"] == "per-rank"
    assert len(d["samples"]) == len(SIZES)
    code, text, err = run_cli("oracle", DATA, "--devices", "2", "--platform", out, "--json")
    assert code == 0, err
    got = json.loads(text)
    assert got["platform"]["oracle"]["topology"]["links"] == "per-rank"
    assert any("links of their own" in n for n in got["notes"])
    assert {"collective_calls", "bucket_refill_us"} <= set(got["strategies"][0])


@pytest.mark.parametrize("args", [("--nprocs", "1"), ("--nprocs", "2,x"), ("--rounds", "0")])
def test_calibrate_oracle_bad_input(run_cli, tmp_path: Path, args: tuple[str, ...]) -> None:
    code, _, err = run_cli("calibrate", "--oracle", *args, "-o", tmp_path / "p.json")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "error" in err
    assert not (tmp_path / "p.json").exists()
