"""The optimizer on parameter-server jobs: MXNet's key placement and split by hand, the bound
search on a hand-built job whose times are computed by hand, and `dpro optimize` on a real
MXNet dist_sync job whose strategy file a second real job then runs with."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dpro.errors import DproInputError
from dpro.graph.comm_model import LinkCost
from dpro.gtrace.io import load_gtrace
from dpro.optimizer.ps import bound_search
from dpro.apply import mxnet_env
from dpro.optimizer.evaluate import iteration_us
from dpro.optimizer.job_model import CompOp, JobModel, Unit
from dpro.optimizer.ps.layout import PsLayout, mxnet_home, piece_server

REPO = Path(__file__).resolve().parents[1]
MX = REPO / ".venv-mx" / "bin"


def test_mxnet_placement_by_hand():
    # kvstore_dist.h: (key * 9973) % S for a small array; a big one goes to every server
    assert [mxnet_home(k, 2) for k in range(4)] == [0, 1, 0, 1]
    assert [mxnet_home(k, 3) for k in range(4)] == [0, 9973 % 3, (2 * 9973) % 3, (3 * 9973) % 3]
    assert [piece_server(1, p, 2) for p in range(2)] == [1, 0]
    lay = PsLayout(2, [0, 1, 2, 3], [10, 802816, 1048576, 524288], [0, 1, 0, 1], 1_000_000)
    assert lay.partitions(1_000_000) == (1, 1, 2, 1)
    assert lay.partitions(524288) == (1, 2, 2, 2)
    assert lay.partitions(lay.no_split_bound) == (1, 1, 1, 1)
    assert lay.candidate_bounds() == [1048577, 1048576, 802816, 524288, 10]
    # one server: nothing is ever split
    assert PsLayout(1, [0], [5], [0], 1).partitions(1) == (1,)


def two_keys_one_server(t: float = 1000.0) -> JobModel:
    """Two equal gradients, both at home on server 1 of 2; every push or pull of a whole key
    through a server's port takes ``t`` µs (2 workers x B bytes x beta), nothing else costs."""
    nbytes = 1 << 20
    ops = {o: CompOp(o, o, "BW", "cpu", 0.0, 0.0, float(i)) for i, o in enumerate(("g0", "g1", "end"))}
    units = [Unit("w0", nbytes, ["g0"], ["end"]), Unit("w1", nbytes, ["g1"], ["end"])]
    lay = PsLayout(2, [1, 3], [nbytes // 4] * 2, [1, 1], 1_000_000)
    return JobModel(ops=ops, edges=[("g0", "g1")], units=units, baseline_groups=[[0], [1]], world_size=2,
                    scheme="ps", library="ps-lite", framework="mxnet", link=LinkCost(0.0, t / (2 * nbytes)),
                    servers=2, ps=lay, baseline_partitions=[1, 1])


def test_bound_search_by_hand():
    m = two_keys_one_server()
    # as profiled: server 1 pushes w0 (0-1000), w1 (1000-2000); pulls w0 (1000-2000), w1 (2000-3000)
    assert iteration_us(m, bound_search.bound_baselines(m)["job as profiled"]) == pytest.approx(3000)
    # split: each server pushes both halves (0-500, 500-1000), pulls them (500-1000, 1000-1500)
    assert iteration_us(m, bound_search.with_bound(m, 1)) == pytest.approx(1500)
    (res,) = bound_search.search_bounds(m)
    assert res.strategy.partitions == (2, 2) and res.iteration_us == pytest.approx(1500)
    # the largest bound that splits both keys: fewer messages for the same time
    assert bound_search.bound_of(m, res.strategy) == (1 << 20) // 4


def test_worker_port_binds_when_servers_outnumber_workers():
    """One key of B bytes, 2 workers, 4 servers; a port moves B in t/2 = 500 µs. Whole: the
    key's server takes both workers' copies at once, so each gets half its port: push t,
    pull t, 2000 µs. Split in 4: the worker's four messages are in flight together and
    share its port (a quarter each, less than the servers' half): t/2 per direction,
    1000 µs. Were the worker's port not shared (each message at its server's pace),
    t/4 + t/4 = 500."""
    nbytes, t = 1 << 20, 1000.0
    ops = {o: CompOp(o, o, "BW", "cpu", 0.0, 0.0, float(i)) for i, o in enumerate(("g", "end"))}
    m = JobModel(ops=ops, edges=[], units=[Unit("w", nbytes, ["g"], ["end"])], baseline_groups=[[0]], world_size=2,
                 scheme="ps", library="ps-lite", framework="mxnet", link=LinkCost(0.0, t / (2 * nbytes)), servers=4,
                 ps=PsLayout(4, [0], [nbytes // 4], [0], 1_000_000), baseline_partitions=[1])
    assert iteration_us(m, bound_search.with_bound(m, m.ps.no_split_bound)) == pytest.approx(2000)
    assert iteration_us(m, bound_search.with_bound(m, 1)) == pytest.approx(1000)


def test_only_mxnet_ps_traces_are_optimized():
    from dpro.loader import open_trace
    from dpro.optimizer.job_model import job_model

    gt = open_trace(REPO / "examples" / "traces" / "ddp_gloo_2rank_mlp")
    gt.manifest.scheme, gt.manifest.framework, gt.manifest.library = "ps", "byteps", "byteps"
    with pytest.raises(DproInputError, match="only MXNet kvstore jobs"):
        job_model(gt, None)


def test_mxnet_env_rejects_bad_files(tmp_path):
    (tmp_path / "mxnet.json").write_text(json.dumps({"MXNET_KVSTORE_BIGARRAY_BOUND": "many"}))
    with pytest.raises(DproInputError, match="positive integer"):
        mxnet_env(tmp_path)
    (tmp_path / "mxnet.json").write_text(json.dumps({"MXNET_KVSTORE_BIGARRAY_BOUND": 524288}))
    assert mxnet_env(tmp_path) == {"MXNET_KVSTORE_BIGARRAY_BOUND": "524288"}


def _profile(out: Path, extra: list[str]) -> None:
    cmd = [str(MX / "dpro"), "profile", "-o", str(out), "--warmup", "4", "--steps", "4", "--",
           str(MX / "python"), "examples/mxnet/launch_local.py", "-n", "2", "-s", "2", "--timeout", "120", "--",
           "examples/mxnet/train_ps.py", "--model", "mlp", "--steps", "10", *extra]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


def _servers_per_key(trace: Path) -> dict[str, int]:
    gt = load_gtrace(trace)
    w = gt.workers()[0]
    out: dict[str, set] = {}
    for op in w.ops.values():
        if op.sub_op == "PUSH_REQ":
            out.setdefault(op.tensor.split("[")[0], set()).add(op.id.rsplit("@", 1)[1])
    return {k: len(v) for k, v in out.items()}


@pytest.mark.slow
def test_optimize_real_ps_job_and_run_its_strategy(tmp_path):
    """A real 2-worker, 2-server MXNet job: `dpro optimize` models it and writes mxnet.json;
    a second real job run with ``--dpro-strategy`` splits exactly the keys the bound says."""
    if not (MX / "python").is_file():
        pytest.skip("no .venv-mx (run scripts/setup_mxnet.sh, or `make mxnet`)")
    _profile(tmp_path / "t0", [])
    assert _servers_per_key(tmp_path / "t0")["dense1_weight"] == 2  # 1048576 elements >= MXNet's default bound
    r = subprocess.run([str(MX / "dpro"), "optimize", str(tmp_path / "t0"), "-o", str(tmp_path / "s"), "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["model"]["scheme"] == "ps" and res["model"]["units"] == 8
    assert not any("bulking off" in n for n in res["notes"])  # profiled bulked, as by default
    # the one-worker model of the job as profiled is near the full replay (on loopback six
    # processes share two cores, which neither models: over 13 profiles here it sat between
    # 24 % below and 13 % above it, and one CI run found 43 % above; docs/optimizer.md)
    assert abs(res["baseline_us"] / res["replay_predicted_us"] - 1) < 0.6, res
    # the largest bound within 1 % of the fastest is chosen (fewer messages), so a baseline
    # may be predicted up to 1 % faster than dpro's pick, never more
    assert min(res["baselines_us"].values()) * (1 + bound_search.SAME_WITHIN) >= res["best_us"] * (1 - 1e-9)
    mx = json.loads((tmp_path / "s" / "mxnet.json").read_text())
    assert mxnet_env(tmp_path / "s")["MXNET_KVSTORE_BIGARRAY_BOUND"] == str(mx["MXNET_KVSTORE_BIGARRAY_BOUND"])
    # a strategy that splits the three weights of at least 524288 elements, run for real
    (tmp_path / "s" / "mxnet.json").write_text(json.dumps({"MXNET_KVSTORE_BIGARRAY_BOUND": 524288}))
    _profile(tmp_path / "t1", ["--dpro-strategy", str(tmp_path / "s")])
    assert load_gtrace(tmp_path / "t1").manifest.meta["bigarray_bound"] == 524288
    split = {k for k, n in _servers_per_key(tmp_path / "t1").items() if n == 2}
    assert split == {"dense0_weight", "dense1_weight", "dense2_weight"}


def test_server_costs_fitted_by_hand():
    """A server answering pulls of 2 workers: a piece of B bytes per worker takes
    200 + 0.01 * 2B µs; two small pieces overlap and form one busy period (2 messages, 4000
    B, 440 µs). Updates take 50 + 0.001 B µs."""
    from dpro.gtrace.schema import Event, GTrace, Manifest, NodeInfo, NodeTrace, Op
    from dpro.optimizer.ps.costs import fit_server_link, fit_update

    ops, events = {}, []
    for key, b in ((0, 1000), (1, 100_000), (2, 400_000), (3, 1000)):
        ops[f"push:p{key}@w0"] = Op(f"push:p{key}@w0", "push", "COMM", "srv", sub_op="PUSH_RES", tensor=f"p{key}", bytes=b)
        ops[f"update:p{key}"] = Op(f"update:p{key}", "aggregate+update", "UPDATE", "cpu:server")
        for w in (0, 1):
            ops[f"pull:p{key}@w{w}"] = Op(f"pull:p{key}@w{w}", "pull", "COMM", "srv", sub_op="PULL_REQ",
                                          tensor=f"p{key}", bytes=b, txn=f"pull.{key}.s0.w{w}")
    for step in (0, 1):
        t = step * 1e6
        # p3 is answered while p0 still is: the port serialises them, p3 ends at 30000 + 2 * 220
        for key, b, start, dur in ((1, 100_000, 0.0, 2200.0), (2, 400_000, 10_000.0, 8200.0), (0, 1000, 30_000.0, 220.0),
                                   (3, 1000, 30_100.0, 340.0)):
            events.append(Event(f"update:p{key}", step, t + start - 100, 50 + 0.001 * b))
            events.append(Event(f"pull:p{key}@w0", step, t + start, dur * 0.8))  # w0 done first
            events.append(Event(f"pull:p{key}@w1", step, t + start, dur))
    server = NodeTrace(NodeInfo("server0", "server", 0, "h"), ops=ops, events=events)
    gt = GTrace(Manifest("mxnet", "ps", "ps-lite", 2, [server.info], [0, 1]), {"server0": server})
    link = fit_server_link(gt, [0, 1])
    assert link.beta == pytest.approx(0.01, rel=1e-6) and link.alpha == pytest.approx(200, rel=1e-6)
    a, b = fit_update(gt, [0, 1])
    assert a == pytest.approx(50) and b == pytest.approx(0.001)


def test_link_fit_takes_the_side_that_ran_at_its_cap():
    """1 worker, 2 servers, the key split in two (B per piece, 2B for the second key). The
    worker pushes both pieces at once through its port at 0.01 µs/B and 100 µs per message:
    200 + 0.01 * 2B. Each server answers its piece, but the answers queue behind the
    worker's port: 16000 µs per 400 kB, so fitted alone the servers' answers say 0.04
    µs/B. With more servers than workers the workers' pushes are fitted too, and they are
    the side at the cap: alpha 100, beta 0.01. With 2 workers (S = N) only the servers'
    answers count."""
    from dpro.gtrace.schema import Event, GTrace, Manifest, NodeInfo, NodeTrace, Op
    from dpro.optimizer.ps.costs import fit_server_link

    def job(workers: int) -> GTrace:
        b, nodes = 400_000, {}
        for s in (0, 1):
            ops = {f"pull:p{k}@w{w}": Op(f"pull:p{k}@w{w}", "pull", "COMM", "srv", sub_op="PULL_REQ", tensor=f"p{k}",
                                         bytes=b * (k + 1), txn=f"pull.{k}.s{s}.w{w}")
                   for k in (0, 1) for w in range(workers)}
            ev = [Event(f"pull:p{k}@w{w}", st, st * 1e6 + k * 50_000, 16_000.0 * (k + 1)) for st in (0, 1)
                  for k in (0, 1) for w in range(workers)]
            nodes[f"server{s}"] = NodeTrace(NodeInfo(f"server{s}", "server", s, "h"), ops=ops, events=ev)
        for w in range(workers):
            ops = {f"push:p{k}@s{s}": Op(f"push:p{k}@s{s}", "push", "COMM", "cpu", sub_op="PUSH_REQ", tensor=f"p{k}",
                                         bytes=b * (k + 1)) for k in (0, 1) for s in (0, 1)}
            ev = [Event(f"push:p{k}@s{s}", st, st * 1e6 + k * 50_000, 200 + 0.01 * 2 * b * (k + 1)) for st in (0, 1)
                  for k in (0, 1) for s in (0, 1)]
            nodes[f"worker{w}"] = NodeTrace(NodeInfo(f"worker{w}", "worker", w, "h"), ops=ops, events=ev)
        return GTrace(Manifest("mxnet", "ps", "ps-lite", workers, [n.info for n in nodes.values()], list(range(workers))),
                      nodes)

    link = fit_server_link(job(1), [0, 1])
    assert link.beta == pytest.approx(0.01, rel=1e-6) and link.alpha == pytest.approx(100, rel=1e-6)
    assert fit_server_link(job(2), [0, 1]).beta == pytest.approx(0.02, rel=1e-6)  # 2 copies of B in 16000 µs
