"""The server ports' efficiency with N asynchronous senders (issue #28): the calibration's
placement and efficiency, the platform file, the lookup, the asynchronous port bound, the
CLI plumbing, and one short real measurement in .venv-mx (skipped without it)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from dpro.errors import DproInputError
from dpro.whatif.calibrate_ps import common_window_rate, port_efficiency, rounds_done, server_load, spin_cpu
from dpro.whatif.models import Transfer
from dpro.whatif.platform import load_platform
from dpro.whatif.scaleout import async_port_bound, port_efficiency_for

REPO = Path(__file__).resolve().parents[1]
MX = REPO / ".venv-mx" / "bin" / "python"
REC = REPO / "tests" / "data" / "golden" / "recordings" / "mxnet_ps_mlp" / "raw"


def test_server_load_follows_mxnets_placement():
    """4 MiB = 1Mi float32 elements (the big-array bound): split over 2 servers, 2 MiB and a
    message each; key 1 (4 KiB) on (1 * 9973) % 2 = 1, key 2 (8 KiB) on (2 * 9973) % 2 = 0."""
    assert server_load([4 << 20, 4096, 8192], 2) == ([(2 << 20) + 8192, (2 << 20) + 4096], [2, 2])
    assert server_load([4 << 20, 4096, 8192], 1) == ([(4 << 20) + 12288], [3])


def test_port_efficiency_hand_computed():
    """4 workers, per worker round server 0 gets 1000 B in 2 messages and server 1 3000 B in
    1; alpha 10 µs, beta 0.1 µs/B: the busiest port 10 + 300 = 310 µs a round, 4 rounds
    1240 µs; measured 1550 µs a worker's round: efficiency 1240 / 1550 = 0.8."""
    row = {"workers": 4, "servers": 2, "round_us": 1550.0, "server_bytes": [1000, 3000], "server_msgs": [2, 1]}
    assert port_efficiency(row, 10.0, 0.1) == pytest.approx(0.8)


def test_async_port_bound_divides_the_port_by_its_efficiency():
    """As test_async_port_bound_hand_computed (busiest port 310 µs per worker step, x4 =
    1240), at efficiency 0.8: 1550 µs; above 1 it is 1 (a bound is not relaxed); the
    worker's own link (120 + 310 = 430 µs, one worker) is not divided."""
    t = Transfer(10.0, 0.1)
    assert async_port_bound(4, [1000.0, 3000.0], [2, 1], t, 0.8) == pytest.approx(1550.0)
    assert async_port_bound(4, [1000.0, 3000.0], [2, 1], t, 1.3) == pytest.approx(1240.0)
    assert async_port_bound(1, [1000.0, 3000.0], [2, 1], t, 0.5) == pytest.approx(620.0)
    assert async_port_bound(1, [1000.0, 3000.0], [2, 1], t, 0.9) == pytest.approx(430.0)


@pytest.mark.parametrize("workers, servers, expected", [
    (4, 1, 0.8), (2, 1, 0.9), (3, 1, 0.85),   # measured, and linear between them
    (1, 1, 1.0), (8, 1, 0.8),                  # one worker: 1.0; beyond the last: the last
    (4, 2, 0.7), (2, 2, 0.9),                  # 2 servers: from (1, 1.0) to (4, 0.7)
    (4, 3, 0.7),                               # 3 servers: the most measured below, 2
])
def test_port_efficiency_lookup(workers, servers, expected):
    rows = ((2, 1, 0.9), (4, 1, 0.8), (4, 2, 0.7))
    assert port_efficiency_for(rows, workers, servers) == pytest.approx(expected)


def test_port_efficiency_lookup_edges():
    assert port_efficiency_for((), 4, 1) == 1.0
    assert port_efficiency_for(((4, 1, 1.2),), 4, 1) == 1.0
    assert port_efficiency_for(((4, 2, 0.6),), 4, 1) == pytest.approx(0.6)  # only 2 servers measured


def _platform(tmp_path: Path, rows: object) -> Path:
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"format": "dpro-platform", "version": 1,
                             "ps": {"alpha_us": 1.0, "beta_us_per_byte": 0.001, "port_efficiency": rows}}))
    return f


def test_platform_file_port_efficiency(tmp_path):
    rows = [{"workers": 2, "servers": 1, "efficiency": 0.9, "round_us": 5.0}, {"workers": 4, "servers": 2,
                                                                               "efficiency": 0.7}]
    assert load_platform(_platform(tmp_path, rows)).ps_port == ((2, 1, 0.9), (4, 2, 0.7))
    for bad in ([{"workers": 2, "servers": 1}], [{"workers": 0, "servers": 1, "efficiency": 0.5}],
                [{"workers": 2, "servers": 1, "efficiency": 0}], {"workers": 2}, [{"workers": True, "servers": 1,
                                                                                   "efficiency": 0.5}]):
        with pytest.raises(DproInputError, match="port_efficiency") as e:
            load_platform(_platform(tmp_path, bad))
        assert "\n" not in str(e.value)


def test_whatif_async_uses_the_platforms_port_efficiency(tmp_path):
    """The golden PS recording predicted for 4 asynchronous workers with the same link and
    a port efficiency of 0.5 at 4 workers: the busiest port's bound doubles, and the step
    is that bound whenever it is the larger."""
    from click.testing import CliRunner

    from dpro.cli import cli

    run = CliRunner()
    trace = tmp_path / "gtrace"
    r = run.invoke(cli, ["collect", str(REC), "-o", str(trace)])
    assert r.exit_code == 0, r.output

    def predict(rows: list) -> dict:
        f = _platform(tmp_path, rows)
        r = run.invoke(cli, ["whatif", str(trace), "--workers", "4", "--servers", "1", "--async", "--json",
                             "--platform", str(f)])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)["scaling"][0]

    plain = predict([])
    half = predict([{"workers": 4, "servers": 1, "efficiency": 0.5}])
    assert "port_efficiency" not in plain["breakdown_us"] and half["breakdown_us"]["port_efficiency"] == 0.5
    assert half["breakdown_us"]["port_bound"] == pytest.approx(2 * plain["breakdown_us"]["port_bound"])
    assert half["iteration_us"] == pytest.approx(max(plain["iteration_us"], half["breakdown_us"]["port_bound"]))


@pytest.mark.skipif(not MX.exists(), reason="no .venv-mx (scripts/setup_mxnet.sh, `make mxnet`)")
def test_real_port_measurement():
    """2 real asynchronous workers and 1 server on loopback, 2 small keys, 2 rounds, each after
    5 ms of CPU, pinned, the servers with momentum, 2 tries: a round takes at least the
    computation, and the server's load is MXNet's placement of the keys."""
    code = ("import json, sys; from dpro.whatif.calibrate_ps import measure_port; "
            "print(json.dumps(measure_port(sys.executable, 2, 1, sizes=[4096, 65536], warmup=1, rounds=2, tries=2, "
            "compute_us=5000.0, pin=True, momentum=0.9)))")
    r = subprocess.run([str(MX), "-c", code], capture_output=True, text=True, timeout=240, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert (row["workers"], row["servers"], row["server_bytes"], row["server_msgs"]) == (2, 1, [69632], [2])
    assert row["round_us"] >= 5000.0 and 0 < port_efficiency(row, 0.0, 0.001)
    assert row["tries"] == 2 and row["round_us"] == min(row["tries_round_us"])  # the lower median of 2
    assert (row["pinned"], row["momentum"], row["compute_us"]) == (True, 0.9, 5000.0)
    assert [len(s["ends_s"]) for s in row["spans_s"]] == [2, 2]


def test_rounds_done_is_linear_within_a_round():
    assert rounds_done(1.0, [2.0, 4.0], 0.5) == 0.0
    assert rounds_done(1.0, [2.0, 4.0], 1.5) == pytest.approx(0.5)
    assert rounds_done(1.0, [2.0, 4.0], 3.0) == pytest.approx(1.5)
    assert rounds_done(1.0, [2.0, 4.0], 9.0) == 2.0


def test_common_window_rate_hand_computed():
    """Worker A from 0 s, rounds ending at 1, 2, 4, 6 s; B from 0.5 s, at 1.5, 2.5 s: all in
    their timed rounds from 0.5 to 2.5 s, A does 2.25 - 0.5 = 1.75 rounds, B 2: 1.875 rounds/s
    (each over its own span: 4/6 + 2/2 = 1.667, B's rounds alone counted with A's slow end)."""
    a = {"start_s": 0.0, "end_s": 6.0, "rounds": 4, "ends_s": [1.0, 2.0, 4.0, 6.0]}
    b = {"start_s": 0.5, "end_s": 2.5, "rounds": 2, "ends_s": [1.5, 2.5]}
    rate, window = common_window_rate([a, b])
    assert (rate, window) == (pytest.approx(1.875), pytest.approx(2.0))
    old = [{k: v for k, v in x.items() if k != "ends_s"} for x in (a, b)]  # no per-round ends: each its own span
    assert common_window_rate(old) == (pytest.approx(4 / 6 + 1.0), 0.0)


def test_measure_port_keeps_the_median_try(monkeypatch):
    import dpro.whatif.calibrate_ps as cp

    rounds = iter([300.0, 500.0, 350.0, 320.0, 400.0])
    seen = []

    def once(python, workers, servers, **kw):
        seen.append(kw)
        return {"workers": workers, "servers": servers, "round_us": next(rounds), "spans_s": []}

    monkeypatch.setattr(cp, "measure_port_once", once)
    row = cp.measure_port("py", 4, 1, compute_us=7.0)
    assert row["round_us"] == 350.0 and row["tries"] == 5
    assert row["tries_round_us"] == [300.0, 500.0, 350.0, 320.0, 400.0]
    assert seen == [{"compute_us": 7.0}] * 5


def test_spin_cpu_spends_the_cpu_time():
    t = time.thread_time()
    spin_cpu(20_000.0)
    assert time.thread_time() - t >= 0.02


def test_calibrate_bad_port_workers_is_one_line(tmp_path):
    from click.testing import CliRunner

    from dpro.cli import cli

    r = CliRunner().invoke(cli, ["calibrate", "--backend", "ps-lite", "--port-workers", "2,x", "-o",
                                 str(tmp_path / "p.json")])
    assert r.exit_code != 0 and "--port-workers" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(cli, ["calibrate", "--backend", "ps-lite", "--port-workers", "2", "--port-momentum", "1.5",
                                 "-o", str(tmp_path / "p.json")])
    assert r.exit_code != 0 and "--port-momentum" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "p.json").exists()


def test_ps_key_sizes_of_the_golden_recording(tmp_path):
    """The golden PS recording (the mlp, 2 workers): one worker's step pushes each
    parameter once, in the recorded key order (biases first: key 0 is dense0_bias); float32
    784x1024 = 3211264 B, 1024x1024 = 4194304 B, 1024x512 = 2097152 B, 512x10 = 20480 B."""
    from click.testing import CliRunner

    import dpro
    from dpro.cli import cli
    from dpro.whatif.scaleout import ps_key_sizes

    r = CliRunner().invoke(cli, ["collect", str(REC), "-o", str(tmp_path / "t")])
    assert r.exit_code == 0, r.output
    assert ps_key_sizes(dpro.open(tmp_path / "t")) == [4096, 3211264, 4096, 4194304, 2048, 2097152, 40, 20480]


def test_lone_comm_ratio_hand_computed():
    """A lone worker measured at 127.2 ms a step, the model's one-worker step 135.8 ms, 13.4
    ms of it computation: the exposed communication is (127.2 - 13.4) / (135.8 - 13.4) =
    113.8 / 122.4 of the model's; nothing to scale when either step is not above the
    computation."""
    from dpro.whatif.scaleout import lone_comm_ratio

    assert lone_comm_ratio(127.2, 13.4, 135.8) == pytest.approx(113.8 / 122.4)
    assert lone_comm_ratio(135.8, 13.4, 135.8) == pytest.approx(1.0)
    assert lone_comm_ratio(13.4, 13.4, 135.8) is None and lone_comm_ratio(127.2, 13.4, 10.0) is None


def test_async_lone_worker_reproduces_its_measured_step(tmp_path):
    """The golden PS recording's representative worker (2 servers) as if a lone worker had
    been measured at ``lone = C + 0.8 x (T1 - C)`` µs a step (``T1`` the model's one-worker
    step with the profile's 2 servers, ``C`` its computation): the ratio is 0.8; one
    asynchronous worker with it takes ``lone``: the same sampled compute times as without it
    (same seed) and 0.2 x (T1 - C) less communication; with 1 server its exposed
    communication is the model's 1-server one times 0.8; the 2-worker profile's own
    prediction has no lone step, so nothing is scaled."""
    from click.testing import CliRunner

    import dpro
    from dpro.cli import cli
    from dpro.whatif.scaleout import Cluster, _async_point, _compute_only_us, _ps_point, _workers, lone_comm_ratio_of, predict

    r = CliRunner().invoke(cli, ["collect", str(REC), "-o", str(tmp_path / "t")])
    assert r.exit_code == 0, r.output
    job = dpro.open(tmp_path / "t")
    res = predict(job, [Cluster(1, servers=2, asynchronous=True, steps=400)])
    plain = res.points[0]
    assert "lone_comm_ratio" not in plain.breakdown_us  # 2 profiled workers: no lone step
    base, t = _workers(job)[0], res.transfer
    comp = _compute_only_us(base)
    assert comp == pytest.approx(plain.breakdown_us["compute"])
    t1 = {s: _ps_point(job, base.copy(), Cluster(1, s), t).iteration_us for s in (1, 2)}
    lone = comp + 0.8 * (t1[2] - comp)
    ratio = lone_comm_ratio_of(job, base, t, lone)
    assert ratio == pytest.approx(0.8)
    two = _async_point(job, base.copy(), Cluster(1, servers=2, asynchronous=True, steps=400), t, ratio)
    assert two.breakdown_us["lone_comm_ratio"] == pytest.approx(0.8)
    assert plain.iteration_us - two.iteration_us == pytest.approx(0.2 * (t1[2] - comp), rel=1e-6)
    assert two.iteration_us == pytest.approx(lone, rel=0.03)  # the sampled compute times' mean: C
    one = _async_point(job, base.copy(), Cluster(1, servers=1, asynchronous=True, steps=400), t, ratio)
    assert one.breakdown_us["exposed_COMM_alone"] == pytest.approx(0.8 * (t1[1] - comp))
