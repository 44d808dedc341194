"""ps-lite's CPU cost in the PS what-if (``dpro calibrate --backend ps-lite``, ``--cpu-cost``):
hand-computed demand, sharing of the host's cores, the asynchronous bound, the platform
file, and one short real calibration in .venv-mx (skipped without it)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from dpro.errors import DproInputError
from dpro.whatif.graph import Op, WhatIfGraph
from dpro.whatif.models import Transfer
from dpro.whatif.platform import PsCpu, load_platform
from dpro.whatif.scaleout import Cluster, _oversubscribed, _Piece, _simulate_point, async_cpu_bound, ps_cpu_demand

REPO = Path(__file__).resolve().parents[1]
MX = REPO / ".venv-mx" / "bin" / "python"
REC = REPO / "tests" / "data" / "golden" / "recordings" / "mxnet_ps_mlp" / "raw"


def test_ps_cpu_demand_hand_computed():
    """Pieces of 1000 and 500 bytes on server 0, 3000 on server 1, 3 workers; a message costs
    the worker 10 + 0.01 B and the server 5 + 0.02 B. Worker: two messages per piece,
    2(10+10) + 2(10+5) + 2(10+30) = 150. Server 0: 3 workers x (2(5+20) + 2(5+10)) = 240,
    server 1: 3 x 2(5+60) = 390."""
    pieces = [_Piece("a", 0, 1000), _Piece("b", 1, 3000), _Piece("c", 0, 500)]
    cost = PsCpu(worker=Transfer(10.0, 0.01), server=Transfer(5.0, 0.02))
    w, s = ps_cpu_demand(pieces, 3, 2, cost)
    assert w == pytest.approx(150.0)
    assert s == [pytest.approx(240.0), pytest.approx(390.0)]
    assert ps_cpu_demand(pieces, 3, 2, None) == (0.0, [0.0, 0.0])


def _ps_graph() -> WhatIfGraph:
    """fw (100, worker) -> push (50, link) -> update (20, server0) -> pull (50, link): 220 µs."""
    g = WhatIfGraph()
    fw = g.add(Op(name="fw", cat="FW", device="w0/cpu", node="w0", dur=100.0))
    push = g.insert([fw], Op(name="push", cat="COMM", device="conn:w0->s0", node="w0", dur=50.0, comm_device=True))
    upd = g.insert([push], Op(name="upd", cat="UPDATE", device="server0/update", node="server0", dur=20.0))
    g.insert([upd], Op(name="pull", cat="COMM", device="conn:s0->w0", node="server0", dur=50.0, comm_device=True))
    return g


@pytest.mark.parametrize("n, pinned, host, expected", [
    (2, False, 100.0, 220.0),  # need (2*(100+30) + 100 + 20)/2 = 190 < 220: the network sets the step
    (2, False, 300.0, 290.0),  # need (260 + 320)/2 = 290: T(f) = 100 + 120 f -> f = 1.583
    (3, True, 300.0, 355.0),   # need max((390 + 320)/2, 2*130) = 355
    (3, True, 0.0, 260.0),     # need max((390 + 20)/2, 2*130) = 260: the busiest core's 2 workers
    (2, False, 0.0, 220.0),    # the update counted once (not per worker): (260+20)/2 = 140
])
def test_ps_cpu_shares_the_host_cores(n, pinned, host, expected):
    """Each worker needs its 100 µs of computation and 30 µs of messages; the servers
    ``host`` µs of messages and the 20 µs update once; all on 2 cores. Every computation op
    (the update too) slows by f until the step holds the CPU it needs."""
    g = _ps_graph()
    p = _oversubscribed(g, Cluster(n, host_cores=2, pinned=pinned), lambda h: _simulate_point(h, n, 1),
                        worker_cpu=30.0, host_cpu=host)
    assert p.iteration_us == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("n, pinned, host, expected", [
    (2, True, 0.0, 230.0),     # 2 pinned workers on 2 cores: no turn-taking, 10 + 100 + 50 + 20 + 50
    (4, True, 0.0, 330.0),     # 2 per core take turns: fw 2*100, its gap 10 (a wait) kept, update 20
    (3, False, 0.0, 280.0),    # free: 3/2 -> fw 150
    (4, True, 240.0, 330.0),   # need max((4*100 + 240 + 20)/2, 2*100) = 330 = T(1) (fw at 2x, the update at 1x)
    (4, True, 280.0, 350.0),   # need (400 + 280 + 20)/2 = 350: the update slows by f = 1.5 (30 µs), fw stays 2x
    (4, True, 800.0, 610.0),   # need (400 + 800 + 20)/2 = 610 -> beyond the lockstep: 10 + 100f + 100 + 20f, f = 4.167
])
def test_sync_ps_workers_compute_in_lockstep(n, pinned, host, expected):
    """A dist_sync step's workers start their forward together when the pulls end: on 2
    cores N pinned workers take turns on the busiest core, fw (100 µs own time, 10 µs gap:
    MXNet's gap is a wait, not CPU, ``gaps=False``) takes ``lockstep_factor`` = ceil(N/2) times
    as long (free: N/2); the server's update is not in the workers' phase: only the CPU
    bound (``need``) slows it, by f, and the workers' ops by max(k, f)."""
    g = _ps_graph()
    g.ops[next(o.id for o in g.ops.values() if o.name == "fw")].gap = 10.0
    p = _oversubscribed(g, Cluster(n, host_cores=2, pinned=pinned), lambda h: _simulate_point(h, n, 1),
                        host_cpu=host, gaps=False, lockstep=True)
    assert p.iteration_us == pytest.approx(expected, rel=1e-4)


def test_ps_point_is_lockstep_and_a_lockstep_ps_profile_is_deflated():
    """_ps_point passes lockstep; a profile of 3 pinned workers on 2 cores (fw 200 µs, gap
    20) is deflated by ceil(3/2) = 2 to fw 100, its gap (a wait) kept, the push untouched."""
    from dpro.whatif.scaleout import deflate_lockstep

    g = _ps_graph()
    fw = next(o for o in g.ops.values() if o.name == "fw")
    push = next(o for o in g.ops.values() if o.name == "push")
    fw.dur, fw.gap = 200.0, 20.0
    assert deflate_lockstep(g, Cluster(3, host_cores=2, pinned=True), 3, gaps=False) == 2.0
    assert (fw.dur, fw.gap, push.dur) == (100.0, 20.0, 50.0)
    assert deflate_lockstep(g, Cluster(2, host_cores=2, pinned=True), 2, gaps=False) == 1.0
    assert fw.dur == 100.0
    src = Path(REPO / "dpro" / "whatif" / "scaleout.py").read_text()
    assert "gaps=False, lockstep=True)" in src.split("def _ps_point", 1)[1].split("\ndef ", 1)[0]


def test_async_cpu_bound_hand_computed():
    """4 workers, 2 cores, 40 µs of own CPU and 20 µs of the servers' per worker step:
    4*60/2 = 120 µs; pinned 2 per core: max(120, 2*40) = 120; 3 pinned: max(90, 80) = 90,
    with 50 of own CPU and 0 of the servers': max(75, 100) = 100."""
    assert async_cpu_bound(4, 2, 40.0, 20.0) == pytest.approx(120.0)
    assert async_cpu_bound(4, 2, 40.0, 20.0, pinned=True) == pytest.approx(120.0)
    assert async_cpu_bound(3, 2, 40.0, 20.0, pinned=True) == pytest.approx(90.0)
    assert async_cpu_bound(3, 2, 50.0, 0.0, pinned=True) == pytest.approx(100.0)


def test_calibration_fit_hand_computed():
    """A message costs 10 + 0.01 B of the worker's CPU and 4 + 0.02 B of the server's; a
    round (push + pull) twice that: the fit gives them back."""
    from dpro.whatif.calibrate_ps import fit

    rows = [{"bytes": b, "us": 2 * (100 + 0.001 * b), "worker_cpu_us": 2 * (10 + 0.01 * b),
             "server_cpu_us": 2 * (4 + 0.02 * b)} for b in (1000, 2000, 4000, 64000)]
    ps = fit(rows)
    assert (ps["alpha_us"], ps["beta_us_per_byte"]) == (pytest.approx(100), pytest.approx(0.001))
    assert (ps["worker_cpu_alpha_us"], ps["worker_cpu_beta_us_per_byte"]) == (pytest.approx(10), pytest.approx(0.01))
    assert (ps["server_cpu_alpha_us"], ps["server_cpu_beta_us_per_byte"]) == (pytest.approx(4), pytest.approx(0.02))


def test_platform_file_ps_cpu(tmp_path):
    f = tmp_path / "p.json"
    ps = {"alpha_us": 100.0, "beta_us_per_byte": 0.001, "worker_cpu_alpha_us": 10.0,
          "worker_cpu_beta_us_per_byte": 0.01, "server_cpu_alpha_us": 4.0, "server_cpu_beta_us_per_byte": 0.02}
    f.write_text(json.dumps({"format": "dpro-platform", "version": 1, "ps": ps}))
    p = load_platform(f)
    assert p.ps_cpu == PsCpu(Transfer(10.0, 0.01), Transfer(4.0, 0.02)) and p.allreduce_cpu is None
    del ps["server_cpu_beta_us_per_byte"]
    f.write_text(json.dumps({"format": "dpro-platform", "version": 1, "ps": ps}))
    with pytest.raises(DproInputError, match="ps server cpu"):
        load_platform(f)


def test_cpu_cost_raises_a_ps_prediction_on_shared_cores(tmp_path):
    """The golden PS recording (2 workers, 2 servers) predicted for 4 workers on 2 cores:
    with a (large) ps-lite CPU cost the step is at least the CPU it needs over the cores."""
    from click.testing import CliRunner

    from dpro.cli import cli

    run = CliRunner()
    trace = tmp_path / "gtrace"
    r = run.invoke(cli, ["collect", str(REC), "-o", str(trace)])
    assert r.exit_code == 0, r.output
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"format": "dpro-platform", "version": 1, "ps": {
        "alpha_us": 1.0, "beta_us_per_byte": 0.0, "worker_cpu_alpha_us": 0.0, "worker_cpu_beta_us_per_byte": 0.01,
        "server_cpu_alpha_us": 0.0, "server_cpu_beta_us_per_byte": 0.0}}))

    def predict(*extra: str) -> dict:
        r = run.invoke(cli, ["whatif", str(trace), "--workers", "4", "--host-cores", "2", "--json", *extra])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)

    plain, costly = predict(), predict("--cpu-cost", str(f))
    # a worker pushes and pulls its gradients' bytes B: 2 * 0.01 * B of CPU; 4 workers on 2 cores
    import dpro

    job = dpro.open(trace)
    w = next(nt for nt in job.trace.nodes.values() if nt.info.role == "worker")
    grad = sum(op.bytes for op in w.ops.values() if op.sub_op == "PUSH_REQ") / len(list(job.steps))
    assert costly["predicted_iteration_us"] >= 4 * 2 * 0.01 * grad / 2 * 0.999
    assert costly["predicted_iteration_us"] > plain["predicted_iteration_us"]
    ar = run.invoke(cli, ["whatif", str(trace), "--workers", "4", "--host-cores", "2", "--cpu-cost", str(tmp_path)])
    assert ar.exit_code != 0 and "\n" not in ar.output.strip()


@pytest.mark.skipif(not MX.exists(), reason="no .venv-mx (scripts/setup_mxnet.sh, `make mxnet`)")
def test_real_pslite_calibration():
    """A real dist_sync kvstore (scheduler, server, worker) at two sizes, a few rounds: every
    row has wall and CPU times of both sides, more for the larger size (1000x the bytes: at
    ~0.5 ns/B the 4 MiB rounds cost ms more than the 4 KiB ones, far above the per-message
    cost's swing under load; with 1 MiB a loaded run once read 892 µs against more)."""
    import subprocess

    code = ("import json; from dpro.whatif.calibrate_ps import measure; "
            "print(json.dumps(measure(sizes=[4096, 4 << 20], repeats=5, target=1)))")
    r = subprocess.run([str(MX), "-c", code], capture_output=True, text=True, timeout=240, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-2000:]
    small, large = json.loads(r.stdout.strip().splitlines()[-1])
    assert (small["bytes"], large["bytes"], small["rounds"]) == (4096, 4 << 20, 5)
    for row in (small, large):
        assert row["us"] > 0 and row["worker_cpu_us"] > 0 and row["server_cpu_us"] > 0
    assert large["server_cpu_us"] > small["server_cpu_us"]


def test_async_port_bound_hand_computed():
    """4 workers; per worker step server 0 gets 1000 bytes in 2 messages, server 1 3000 in
    1; alpha 10 µs, beta 0.1 µs/B: ports 20 + 100 = 120 and 10 + 300 = 310 µs of one worker's
    step, the busiest x 4 workers = 1240 µs."""
    from dpro.whatif.scaleout import async_port_bound

    assert async_port_bound(4, [1000.0, 3000.0], [2, 1], Transfer(10.0, 0.1)) == pytest.approx(1240.0)
    assert async_port_bound(1, [], [], Transfer(10.0, 0.1)) == 0.0


@pytest.mark.parametrize("gaps, expected", [(False, 290.0), (True, 330.0)])
def test_ps_demand_leaves_out_the_engine_gaps(gaps, expected):
    """The graph of test_ps_cpu_shares_the_host_cores with a 40 µs gap before fw (MXNet's
    engine waiting): T(f) = 40 + 100 f + 50 + 20 f + 50. Without the gap in the demand,
    2 workers need (2*(100+30) + 300 + 20)/2 = 290 (f = 1.25); counted, (2*(140+30) + 320)/2 = 330."""
    g = _ps_graph()
    g.op("fw").gap = 40.0
    p = _oversubscribed(g, Cluster(2, host_cores=2), lambda h: _simulate_point(h, 2, 1),
                        worker_cpu=30.0, host_cpu=300.0, gaps=gaps)
    assert p.iteration_us == pytest.approx(expected, rel=1e-4)


def test_calibrate_ps_bad_python_is_one_line(tmp_path):
    """--python that does not exist, or has no MXNet: one line, exit 2, no file written."""
    from click.testing import CliRunner

    from dpro.cli import cli

    import importlib.util

    out = tmp_path / "ps.json"
    pythons = [str(tmp_path / "no-python")]
    if importlib.util.find_spec("mxnet") is None:  # this interpreter: no MXNet
        pythons.append(sys.executable)
    for py in pythons:
        r = CliRunner().invoke(cli, ["calibrate", "--backend", "ps-lite", "--python", py, "-o", str(out)])
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
        assert "Traceback" not in r.output and not out.exists()
