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
    (α 10 µs, β 0.1 µs/B, 1000 B burst at 0.001 µs/B): 3 messages in 136 µs of compute,
    45.33 µs before each, + its own α (the all-reduce: 2 calls). In the step's order:
    all-gather of conv (a rank sends 1024 B), all-gather of fc (32 B), all-reduce of fc's
    input gradient (2048 B). The last one empties the bucket whatever it held, so the
    steady state starts empty: refill 553.3 B, the first gather takes them and 470.7 B at
    the rate; refill 553.3 B, the 32 B go fast (521.3 B left); refill 653.3 B: full
    (1000 B) for the all-reduce, 1048 B at the rate."""
    from dpro.oracle.simulate import simulate_prediction

    bucket = Cost(10, 0.1, 1000, 0.001)
    plat = Platform(10.0, 0.1, calibration=Calibration({2: {"allreduce": bucket}}))
    x = predict(two_layers(), "filter", 2, plat, Options(batch=B))
    assert x.calls == 3 and x.refill_us == pytest.approx(136 / 3)
    fast = (136 / 3 + 10) / 0.1  # 553.33 B of tokens
    gather_conv = 10 + 0.001 * fast + 0.1 * (1024 - fast)     # 57.620
    gather_fc = 10 + 0.001 * 32                                # 10.032: out of the 553.3 B left
    reduce_fc = 20 + 0.001 * 1000 + 0.1 * (2048 - 1000)        # 125.8: a full bucket, then the rate
    assert x.communication_us[LAYERWISE] == pytest.approx(gather_conv + gather_fc + reduce_fc)  # 193.452
    # the model before branch orclink27: each message after an empty bucket refilled only by
    # the compute gap (45.33 µs: 453.3 B): 257.472 µs
    assert x.communication_us[LAYERWISE] < 257.472 - 60
    # data: one all-reduce after 140 µs of compute: a full bucket
    d = predict(two_layers(), "data", 2, plat, Options(batch=B))
    assert d.communication_us[GE] == pytest.approx(20 + 1 + 0.1 * 1300)
    # the simulated graph charges the same wire times (one group: the analytical sum)
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
    assert set(d["oracle"]["calls"]["2"]) == {"p2p", "exchange", "allreduce"} and "back to back" in text
    assert d["oracle"]["calls"]["2"]["p2p"]["alpha_us"] > 0
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


def test_fit_of_back_to_back_calls() -> None:
    """Back-to-back samples [[round, bytes, µs per call], ...]: per round the mean of the
    samples' α (t less the wire time), α the median over the rounds (one slow round of
    +5 ms does not move it), the rounds' spread; without an isolated fit, β by least
    squares; a halo exchange at 4 processes sends each message to 2 neighbours, an
    all-reduce 2(n-1)/n of it in 2(n-1) steps."""
    from dpro.oracle.calibration import fit_stream, fit_streams

    sizes = (1024, 8192, 32768, 131072)
    rows = [[r, s, 300 + 0.001 * s + (5000 if r == 2 else 0)] for r in range(5) for s in sizes]
    got = fit_stream(rows, 1, 1)
    assert got.cost.beta == pytest.approx(0.001) and got.cost.alpha == pytest.approx(300)
    plain = fit_stream(rows, 1, 1, Cost(0, 0.001))
    assert plain.cost.alpha == pytest.approx(300) and plain.cost.beta == 0.001
    assert plain.alpha_rounds == pytest.approx((300, 300, 5300)) and plain.rounds == 5
    raw = {"stream_p2p": [[r, s, 300 + 0.001 * s] for r in range(3) for s in sizes],
           "stream_exchange": [[r, s, 40 + 0.002 * 2 * s] for r in range(3) for s in sizes],
           "stream_allreduce": [[r, s, 6 * 20 + 0.003 * 1.5 * s] for r in range(3) for s in sizes]}
    st = fit_streams(4, raw)
    assert st["p2p"].cost.alpha == pytest.approx(300) and st["p2p"].cost.beta == pytest.approx(0.001)
    assert st["exchange"].cost.alpha == pytest.approx(40) and st["exchange"].cost.beta == pytest.approx(0.002)
    assert st["allreduce"].cost.alpha == pytest.approx(20) and st["allreduce"].cost.beta == pytest.approx(0.003)
    assert fit_stream([[0, 1024, float("nan")]], 1, 1) is None
    # with the isolated calls' wire (BUCKET: 128 KiB at 1 ns/B, then 40 ns/B): α from the
    # sizes whose 8 calls the full bucket passes (1 and 8 KiB: 64 KiB in all); 32 and
    # 128 KiB back to back wait for the rate, which hides α: whatever they took is left out
    burst = [[r, s, 250 + 0.001 * s] for r in range(3) for s in sizes[:2]]
    burst += [[r, s, 9999.0] for r in range(3) for s in sizes[2:]]
    b = fit_stream(burst, 1, 1, BUCKET, 8)
    assert b.cost == Cost(pytest.approx(250), 0.04, 131072, 0.001)
    st = fit_streams(2, {"stream_p2p": burst}, {"allreduce": BUCKET}, 8)
    assert st["p2p"].cost.alpha == pytest.approx(250) and st["p2p"].alpha_rounds == pytest.approx((250,) * 3)
    # no size that small: every sample, the bucket refilled during each call's α
    # (dpro/oracle/bucket.py stream_alpha: 8 x 32 KiB at α 250 µs take 3667.702 µs on the wire)
    big = [[r, 32768, 250 + 3667.702 / 8] for r in range(3)]
    assert fit_stream(big, 1, 1, BUCKET, 8).cost.alpha == pytest.approx(250)


def test_back_to_back_per_call_in_halo_and_pipeline() -> None:
    """The halo exchange and the pipeline send pay the back-to-back calls' α and the
    isolated calls' wire time (two-layer network, B = 8, hand-computed): spatial at 2,
    halo 8 x 32 B per exchange; pipeline at 2 with 2 micro-batches, 2(p + S - 2) = 4
    sends of 4 x 256 B. Without back-to-back samples: the isolated α as before."""
    from dpro.oracle.calibration import PerCall
    from dpro.oracle.formulas import HALO, P2P
    from dpro.oracle.simulate import simulate_prediction

    links = {2: {"allreduce": Cost(10, 0.01), "exchange": Cost(50, 0.05)}}
    calls = {2: {"p2p": PerCall(Cost(7, 0.5)), "exchange": PerCall(Cost(3, 0.9))}}
    plat = Platform(10.0, 0.01, calibration=Calibration(links, calls=calls))
    old = Platform(10.0, 0.01, calibration=Calibration(links))
    link = link_of(plat, 2)
    assert link.exchange(1, 256) == pytest.approx(3 + 0.05 * 256)        # α back to back, β isolated
    assert link.p2p(1024) == pytest.approx(7 + 0.01 * 1024)              # the all-reduce's wire
    assert link_of(old, 2).p2p(1024) == pytest.approx(10 + 0.01 * 1024)  # a ring step's α
    sp = predict(two_layers(), "spatial", 2, plat, Options(batch=B))
    assert sp.communication_us[HALO] == pytest.approx(2 * (3 + 0.05 * 256))              # 31.6
    assert predict(two_layers(), "spatial", 2, old, Options(batch=B)).communication_us[HALO] == pytest.approx(
        2 * (50 + 0.05 * 256))
    opts = Options(batch=B, micro=2)
    pipe = predict(two_layers(), "pipeline", 2, plat, opts)
    assert pipe.communication_us[P2P] == pytest.approx(4 * (7 + 10.24))                   # 68.96
    # GPipe simulated (tests/test_oracle.py test_simulate: 335.96 with 20.24 per transfer):
    # all four transfers on the critical path, each 3 µs cheaper
    assert simulate_prediction(two_layers(), pipe, plat, opts) == pytest.approx(335.96 - 4 * 3)
    assert simulate_prediction(two_layers(), sp, plat, Options(batch=B)) == pytest.approx(sp.iteration_us)
    # the file keeps them, and the spread
    back = read_calibration(json.loads(json.dumps(
        Calibration(links, calls={2: {"p2p": PerCall(Cost(7, 0.5), (5, 7, 9), 9)}}).to_json())))
    assert back.calls[2]["p2p"] == PerCall(Cost(7, 0.5), (5.0, 7.0, 9.0), 9)
    assert back.per_call(8) == back.calls[2] and Calibration().per_call(2) == {}
    for bad in ({"calls": {"1": {}}}, {"calls": [1]}, {"calls": {"2": {"p2p": {"alpha_us": -1, "beta_us_per_byte": 0}}}}):
        with pytest.raises(ValueError):
            read_calibration(bad)
