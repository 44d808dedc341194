"""The optimizer: theorems on hand-built graphs (times computed by hand), the pass registry
with a user pass, DDP bucketing against torch's own, `dpro optimize` on real traces."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from dpro.cli import cli
from dpro.graph.comm_model import LinkCost
from dpro.gtrace.schema import NodeInfo, NodeTrace
from dpro.loader import open_trace
from dpro.optimizer import libraries as lib
from dpro.optimizer.evaluate import analyse, iteration_us, sync_time
from dpro.optimizer.job_model import CompOp, JobModel, Unit
from dpro.optimizer.optimize import ddp_strategy, optimize
from dpro.optimizer.search import search
from dpro.optimizer.strategy import Strategy
from dpro.optimizer.theorems import fused_tensor_gain_after_op_fusion, op_fusion_gain, tensor_fusion_gain
from dpro.optimizer.passes.base import Candidate, GraphPass, PassContext, register
from dpro.optimizer.passes.op_fusion import OpFusion
from dpro.optimizer.passes.registry import default_registry, passes_in_module
from dpro.optimizer.passes.tensor_fusion import TensorFusion
from dpro.optimizer.passes.tensor_partition import TensorPartition, best_partition
from dpro.replayer.replay import replay
from scriptmod import load_script

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "examples" / "traces" / "ddp_gloo_2rank_mlp"
RECORDED = Path(__file__).parent / "data" / "probe"


def chain_model(durs: list[tuple[str, str, float, float]], units: list[Unit], *, alpha: float, beta: float = 0.0,
                world: int = 2, scheme: str = "allreduce", servers: int = 0, launch: float = 0.0) -> JobModel:
    """Ops (id, cat, dur, gap) in one chain on one device."""
    ops = {i: CompOp(i, i, c, "cpu", d, g, float(k)) for k, (i, c, d, g) in enumerate(durs)}
    ids = [d[0] for d in durs]
    return JobModel(ops=ops, edges=list(zip(ids, ids[1:])), units=units, baseline_groups=[[i] for i in range(len(units))],
                    world_size=world, scheme=scheme, library="gloo", framework="pytorch",
                    link=LinkCost(alpha, beta), launch_us=launch, servers=servers)


# ---------------------------------------------------------------- theorems, by hand

def test_theorem_functions_by_hand():
    # a: gap 2 + 5, b: gap 3 + 5; fused: 2 + 5 + 5 = 12; a's gradients are ready 12 - 7 = 5 later
    assert op_fusion_gain(7, 8, 12, []) == 3
    assert op_fusion_gain(7, 8, 12, [(5, 4.9)]) == 0  # the delayed sync would leave its slack
    assert op_fusion_gain(7, 8, 12, [(5, 5)]) == 3
    # q2 ready at 21 waited for q1 until 30: apart it ends 30 + 10 = 40, fused 21 + 10 = 31
    assert tensor_fusion_gain(r2=21, e1=30, t2=10, t12=10) == 9
    # q2 ready after q1 ended: fusing only delays q1, nothing is gained
    assert tensor_fusion_gain(r2=50, e1=30, t2=10, t12=12) == -2
    assert fused_tensor_gain_after_op_fusion(10, 10, 12) == 8


def two_grads(alpha: float, b2_dur: float) -> JobModel:
    # fw 10 -> b1 10 -> b2 (b2_dur) -> upd 1; grads g1 (ready b1), g2 (ready b2), both consumed by upd
    return chain_model([("fw", "FW", 10, 0), ("b1", "BW", 10, 0), ("b2", "BW", b2_dur, 0), ("upd", "UPDATE", 1, 0)],
                       [Unit("g1", 100, ["b1"], ["upd"]), Unit("g2", 100, ["b2"], ["upd"])], alpha=alpha)


def test_tensor_fusion_times_by_hand():
    m = two_grads(alpha=5, b2_dur=1)
    # 2 ranks: a sync is 2 ring steps of alpha (beta = 0) = 5 µs each.
    # apart: g1 step0 20..25; the link is FIFO by readiness, so g2's step0 (ready 21) goes
    # 25..30 before g1's step1 (ready 25) 30..35; g2 step1 35..40; upd 40..41
    assert iteration_us(m, Strategy.from_groups([[0], [1]])) == pytest.approx(41)
    # fused: ready at 21, 21..31, upd 31..32
    assert iteration_us(m, Strategy.from_groups([[0, 1]])) == pytest.approx(32)
    st = Strategy.from_groups([[0], [1]])
    ctx = PassContext(m, st, analyse(m, st))
    (c,) = TensorFusion().candidates(ctx)
    assert c.est_gain_us == pytest.approx(14)  # Theorem 2: max(e1 = 35, r2 = 21) + 10 - (21 + 10)
    res = search(m, [TensorFusion()], budget_s=5)[0]
    assert res.strategy.groups == ((0, 1),) and res.iteration_us == pytest.approx(32)


def test_tensor_fusion_refused_when_second_gradient_is_late():
    m = two_grads(alpha=5, b2_dur=30)
    # apart: g1 20..30, g2 ready 50 -> 50..60, upd 60..61; fused: ready 50 -> 60 too: no gain
    st = Strategy.from_groups([[0], [1]])
    assert iteration_us(m, st) == pytest.approx(61)
    assert TensorFusion().candidates(PassContext(m, st, analyse(m, st))) == []


def test_op_fusion_theorem1_and_3_by_hand():
    # a (gap 2, dur 5) -> b (gap 3, dur 5) -> c: fused a+b = 2 + 5 + 5 = 12 instead of 15
    m = chain_model([("a", "FW", 5, 2), ("b", "FW", 5, 3), ("c", "BW", 1, 0)], [Unit("g", 8, ["c"], [])], alpha=1)
    st = Strategy.from_groups([[0]])
    assert iteration_us(m, st) == pytest.approx(7 + 8 + 1 + 2)  # + sync of 2 ring steps of 1
    ctx = PassContext(m, st, analyse(m, st))
    cands = OpFusion().candidates(ctx)
    assert [c.target for c in cands] == [("fuse", ("a", "b"))]
    assert cands[0].est_gain_us == pytest.approx(3)
    after = OpFusion().apply(ctx, cands[0])
    assert iteration_us(m, after) == pytest.approx(15)

    # Theorem 3: a and b each produce a gradient; once fused they are ready together and
    # one sync (alpha 4 per step) beats two.
    m3 = chain_model([("a", "BW", 5, 2), ("b", "BW", 5, 3), ("c", "UPDATE", 1, 0)],
                     [Unit("ga", 8, ["a"], ["c"]), Unit("gb", 8, ["b"], ["c"])], alpha=4)
    st3 = Strategy.from_groups([[0], [1]])
    ctx3 = PassContext(m3, st3, analyse(m3, st3))
    cand = Candidate("op_fusion", ("fuse", ("a", "b")), "test", 1.0)
    fused = OpFusion().apply(ctx3, cand)
    assert fused.groups == ((0, 1),)
    assert fused_tensor_gain_after_op_fusion(sync_time(m3, 8, 1), sync_time(m3, 8, 1), sync_time(m3, 16, 1)) == pytest.approx(8)


def test_op_fusion_refused_when_delayed_sync_leaves_its_slack():
    # a produces g whose sync (long) is the critical path: delaying it by fusing a+b costs more than it saves
    m = chain_model([("a", "BW", 5, 0), ("b", "BW", 50, 1), ("c", "UPDATE", 1, 0)],
                    [Unit("g", 8, ["a"], ["c"])], alpha=100)
    st = Strategy.from_groups([[0]])
    ctx = PassContext(m, st, analyse(m, st))
    assert OpFusion().candidates(ctx) == []


def test_partition_ring_vs_parameter_servers():
    ring = chain_model([("a", "BW", 1, 0)], [Unit("g", 1 << 20, ["a"], [])], alpha=10, beta=0.01, world=4)
    assert best_partition(ring, 1 << 20)[0] == 1  # every piece pays alpha again on busy links
    ps = chain_model([("a", "BW", 1, 0)], [Unit("g", 1 << 20, ["a"], [])], alpha=10, beta=0.01, world=4,
                     scheme="ps", servers=4)
    k, t = best_partition(ps, 1 << 20)
    # spread over the 4 servers' links, and more pieces pipeline each server's push and pull
    assert k >= 4 and t < sync_time(ps, 1 << 20, 1) / 3
    st = Strategy.from_groups([[0]])
    (c,) = TensorPartition().candidates(PassContext(ps, st, analyse(ps, st)))
    assert c.target == ("partition", 0, k)


# ---------------------------------------------------------------- libraries

def test_ddp_buckets_match_torch():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "examples" / "pytorch"))
    from models import build

    for name in ("mlp", "convnet", "transformer"):
        model = build(name)[0]
        params = list(reversed(list(model.parameters())))  # the gradient-ready order of these models
        sizes = [p.numel() * p.element_size() for p in params]
        for first, cap in ((1 << 20, 25 << 20), (1 << 20, 1 << 20), (3 << 20, 3 << 20), (10 ** 5, 10 ** 5)):
            ours = lib.ddp_buckets(sizes, cap, first)
            theirs, _ = dist._compute_bucket_assignment_by_size(params, [first, cap])
            assert ours == [list(b) for b in theirs], (name, first, cap)
    del torch


def test_horovod_cycles():
    # ready at 0.1, 0.5, 1.2, 1.3 ms; 1 ms cycles; threshold 250 B
    assert lib.horovod_cycle_groups([100, 500, 1200, 1300], [100, 100, 100, 200], threshold=250, cycle_us=1000) == [[0, 1], [2], [3]]


def test_horovod_cycles_wait_for_the_running_buffer():
    """Ready at 0.1, 1.5, 2.5 and 7.6 ms, 1 ms cycles. Idle runs: one buffer each. With 3 ms
    per buffer: the wake-up at 1 ms runs [0] until 4 ms; the loop wakes at once then and
    fuses 1 and 2, runs them until 7 ms; the next wake-ups are at 8 ms (7 + 1): [3]."""
    ready, sizes = [100, 1500, 2500, 7600], [100] * 4
    assert lib.horovod_cycle_groups(ready, sizes) == [[0], [1], [2], [3]]
    assert lib.horovod_cycle_groups(ready, sizes, busy_us=lambda b: 3000.0) == [[0], [1, 2], [3]]
    # a run shorter than a cycle changes nothing; the threshold still splits a wake-up's tensors
    assert lib.horovod_cycle_groups(ready, sizes, busy_us=lambda b: 500.0) == [[0], [1], [2], [3]]
    assert lib.horovod_cycle_groups(ready, sizes, threshold=100, busy_us=lambda b: 3000.0) == [[0], [1], [2], [3]]


def test_horovod_default_is_the_job_when_it_ran_with_the_defaults():
    """fw 10 -> b1 10 -> b2 1 -> upd, gradients ready at 20 and 21 µs, 1 µs per byte: with 1 ms
    cycles Horovod would fuse them, but the job as profiled (recorded: no fusion setting)
    sent them apart, and that is what its defaults did there."""
    from dpro.optimizer.horovod import ran_defaults
    from dpro.optimizer.optimize import horovod_default

    m = two_grads(alpha=5, b2_dur=1)
    assert horovod_default(m).groups == ((0, 1),)  # simulated
    m.horovod_defaults_profiled = True
    assert horovod_default(m).groups == ((0,), (1,))  # the job's own
    nt = NodeTrace(info=NodeInfo(name="worker0", role="worker", rank=0, host="h"))
    assert not ran_defaults(nt)  # not recorded: unknown
    nt.meta = {"horovod_settings": {}}
    assert ran_defaults(nt)
    nt.meta = {"horovod_settings": {"HOROVOD_FUSION_THRESHOLD": "0"}}
    assert not ran_defaults(nt)
    nt.meta = {"horovod_settings": {}, "horovod": {"tensors": [{"enqueue_op": "HorovodGroupedAllreduce_x@cpu:tf0"}]}}
    assert not ran_defaults(nt)


def test_horovod_job_as_profiled_is_a_step_s_grouping():
    """Horovod fused a, b, c as 1, 3 and 2 groups in steps 1-3: the job as profiled is the
    step with the median count (step 3); a step whose groups miss a unit gives None."""
    from dpro.optimizer.horovod import step_grouping

    units = list("abc")
    nt = NodeTrace(info=NodeInfo(name="worker0", role="worker", rank=0, host="h"))
    g = lambda *ts: {"tensors": list(ts)}  # noqa: E731
    nt.meta = {"horovod": {"groups": {"1": [g("c", "b", "a")], "2": [g("c"), g("b"), g("a")],
                                      "3": [g("c", "b"), g("a")]}}}
    assert step_grouping(nt, units, [1, 2, 3]) == [[2, 1], [0]]
    assert step_grouping(nt, units, [1, 2]) == [[2, 1, 0]]  # two steps: the one with fewer groups
    nt.meta["horovod"]["groups"]["4"] = [g("c", "b")]
    assert step_grouping(nt, units, [3, 4]) is None


def test_horovod_default_is_not_traded_for_more_collectives():
    """The overlap case of the test below on a Horovod job: sending g1 and g2 apart is
    predicted 20 % faster than Horovod's default (one fused sync), but it is one more
    collective per step, whose cost a Horovod profile cannot show: the default is kept."""
    from dpro.optimizer.optimize import realize

    m = chain_model([("fw", "FW", 10, 0), ("b1", "BW", 10, 0), ("b2", "BW", 10, 0), ("upd", "UPDATE", 1, 0)],
                    [Unit("g1", 100, ["b1"], ["upd"]), Unit("g2", 100, ["b2"], ["upd"])], alpha=0, beta=0.1)
    m.library = "horovod"
    best = Strategy.from_groups([[0], [1]])
    (r,) = [r for r in realize(m, best) if r.library == "horovod"]
    assert r.settings["keep_default"] and r.settings["groups"] is None
    assert r.iteration_us == pytest.approx(51) and iteration_us(m, best) == pytest.approx(41)


def test_horovod_link_prices_the_spans_by_bytes():
    """Two ranks (2 ring steps of B/2 bytes each): a 100 B group that took 300 µs (3 µs/B,
    a burst would make it less) and a 1000 B group that took 1500 µs (1.5 µs/B) in steps 1
    and 2; step 3 is not typical, and a malformed entry is skipped. The byte-weighted median
    is the large group's 1.5 µs/B; the latency stays the replay's; the excess per atom is
    the median over the steps."""
    from dpro.optimizer.horovod import excess_by_atom, link_cost

    nt = NodeTrace(info=NodeInfo(name="worker0", role="worker", rank=0, host="h"))
    g = lambda a, b, t, x: {"atoms": [a], "bytes": b, "start_us": 0.0, "end_us": t, "excess_us": x}  # noqa: E731
    nt.meta = {"horovod": {"atoms": [{"op": "ar#0"}, {"op": "ar#1"}], "groups": {
        "1": [g(0, 100, 300.0, 10.0), g(1, 1000, 1500.0, 50.0)],
        "2": [g(0, 100, 300.0, 30.0), g(1, 1000, 1500.0, 70.0), {"atoms": "x"}],
        "3": [g(1, 1000, 9000.0, 0.0)]}}}
    link = link_cost(nt, 2, [1, 2], LinkCost(7.0, 0.5))
    assert (link.alpha, link.samples, link.shapes) == (7.0, 4, 2)
    assert link.beta == pytest.approx((1500 - 2 * 7) / 1000)
    assert excess_by_atom(nt, [1, 2]) == {"ar#0": 20.0, "ar#1": 60.0}
    nt.meta = {}
    assert link_cost(nt, 2, [1], LinkCost(7.0, 0.5)) == LinkCost(7.0, 0.5)  # nothing recorded: the replay's


@pytest.mark.parametrize("overlap", [False, True])
def test_library_defaults_are_kept_without_a_predicted_gain(overlap):
    """fw 10 -> b1 10 -> b2 -> upd 1, two 100 B gradients. Without overlap to win (alpha
    only) both libraries' defaults, one fused sync, are the best there is: dpro keeps them
    rather than write settings that only reproduce them. With b2 10 µs and 0.1 µs/B, g1's
    sync hides behind b2 when apart (41 µs) and not when fused (51 µs, both defaults):
    dpro's settings, 20 % faster."""
    from dpro.optimizer.optimize import realize

    m = two_grads(alpha=5, b2_dur=1) if not overlap else chain_model(
        [("fw", "FW", 10, 0), ("b1", "BW", 10, 0), ("b2", "BW", 10, 0), ("upd", "UPDATE", 1, 0)],
        [Unit("g1", 100, ["b1"], ["upd"]), Unit("g2", 100, ["b2"], ["upd"])], alpha=0, beta=0.1)
    for u in m.units:
        u.params = [u.name]
    best = search(m, [TensorFusion()], budget_s=5)[0].strategy
    got = {r.library: r for r in realize(m, best)}
    assert set(got) == {"pytorch-ddp", "horovod"}
    for r in got.values():
        assert bool(r.settings.get("keep_default")) is not overlap
        assert r.iteration_us == pytest.approx(41 if overlap else 32)
    assert got["horovod"].settings["groups"] == ([["g1"], ["g2"]] if overlap else None)
    assert (got["pytorch-ddp"].settings["bucket_cap_mb"] is None) is not overlap


# ---------------------------------------------------------------- registry and user passes

def test_user_pass_module_and_registry(tmp_path, monkeypatch):
    (tmp_path / "my_dpro_passes.py").write_text(textwrap.dedent('''
        import dpro.passes as P

        @P.register
        class FuseAll(P.GraphPass):
            """Fuse every synchronisation into one."""
            name = "fuse_all"

            def candidates(self, ctx):
                if len(ctx.strategy.groups) > 1:
                    return [P.Candidate(self.name, ("all",), "user rule", 1.0)]
                return []

            def apply(self, ctx, cand):
                from dpro.optimizer.strategy import Strategy
                return Strategy.from_groups([sum(map(list, ctx.strategy.groups), [])])
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    (p,) = passes_in_module("my_dpro_passes")
    assert p.name == "fuse_all"
    reg = default_registry(["my_dpro_passes"], use_entry_points=False)
    assert reg.names() == ["tensor_fusion", "op_fusion", "tensor_partition", "recomputation", "grad_accumulation",
                           "fuse_all"]
    m = two_grads(alpha=5, b2_dur=1)
    res = search(m, [p], budget_s=5)[0]
    assert res.strategy.groups == ((0, 1),) and res.steps[0].pass_name == "fuse_all"

    r = CliRunner().invoke(cli, ["optimize", "--list-passes", "--load-pass", "my_dpro_passes"])
    assert r.exit_code == 0 and "fuse_all" in r.output
    r = CliRunner().invoke(cli, ["optimize", str(BUNDLED), "--load-pass", "no_such_module_xyz"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "no_such_module_xyz" in r.output


def test_register_rejects_non_passes():
    with pytest.raises(TypeError):
        register(int)

    class Nameless(GraphPass):
        def candidates(self, ctx):
            return []

        def apply(self, ctx, cand):
            return ctx.strategy

    with pytest.raises(TypeError):
        register(Nameless)


# ---------------------------------------------------------------- real traces

def test_model_matches_full_replay_and_coarsening_is_exact_on_real_traces():
    for path in (BUNDLED, RECORDED):
        gt = open_trace(path)
        r = replay(gt)
        res = optimize(gt, budget_s=5)
        m = res.model
        base = Strategy.from_groups(m.baseline_groups)
        # the one-worker model (slowest worker, symmetric links) reproduces the full replay
        assert abs(res.baseline_us - r.predicted_iteration_us) / r.predicted_iteration_us < 0.03, path
        assert iteration_us(m, base, coarsen=True) == pytest.approx(iteration_us(m, base, coarsen=False), rel=1e-3)
        # the search never returns anything slower than where it started
        assert res.best.iteration_us <= res.baseline_us + 1e-6


def test_optimize_cli_writes_strategy_files(tmp_path):
    out = tmp_path / "strategy"
    r = CliRunner().invoke(cli, ["optimize", str(BUNDLED), "-o", str(out), "--budget", "5"])
    assert r.exit_code == 0, r.output
    assert "best found" in r.output and "baselines (predicted)" in r.output
    files = {p.name for p in out.iterdir()}
    assert {"summary.txt", "strategy.json"} <= files
    doc = json.loads((out / "strategy.json").read_text())
    assert doc["best_us"] <= doc["baseline_us"] and doc["baselines_us"]["job as profiled"] == doc["baseline_us"]
    # output exists: refused before any work, nothing touched
    before = sorted(p.name for p in out.iterdir())
    r = CliRunner().invoke(cli, ["optimize", str(BUNDLED), "-o", str(out)])
    assert r.exit_code == 2 and "not empty" in r.output and sorted(p.name for p in out.iterdir()) == before
    r = CliRunner().invoke(cli, ["optimize", str(BUNDLED), "--json", "--budget", "5"])
    assert r.exit_code == 0 and json.loads(r.output)["speedup"] >= 1.0
    r = CliRunner().invoke(cli, ["optimize", str(BUNDLED), "--passes", "nope"])
    assert r.exit_code == 2 and "unknown pass" in r.output
    r = CliRunner().invoke(cli, ["optimize", str(tmp_path / "missing")])
    assert r.exit_code == 2 and r.output.count("\n") == 1


def test_apply_reads_strategy_files(tmp_path):
    from dpro.errors import DproInputError
    from dpro.apply import ddp_kwargs, horovod_env, horovod_groups

    (tmp_path / "ddp.json").write_text('{"bucket_cap_mb": 7.5}')
    assert ddp_kwargs(tmp_path) == {"bucket_cap_mb": 7.5}
    (tmp_path / "horovod.json").write_text('{"groups": [["a", "b"], ["c"]], "HOROVOD_FUSION_THRESHOLD": 1000, "HOROVOD_CYCLE_TIME": 1.0}')
    assert horovod_env(tmp_path) == {"HOROVOD_FUSION_THRESHOLD": "1000", "HOROVOD_CYCLE_TIME": "1.0"}
    assert horovod_groups(tmp_path, [("a", 1), ("b", 2), ("c", 3)]) == [[1, 2], [3]]
    with pytest.raises(DproInputError, match="does not have"):
        horovod_groups(tmp_path, [("a", 1)])
    (tmp_path / "ddp.json").write_text('{"bucket_cap_mb": "big"}')
    with pytest.raises(DproInputError, match="positive number"):
        ddp_kwargs(tmp_path)
    (tmp_path / "ddp.json").write_text('[1')
    with pytest.raises(DproInputError, match="invalid JSON"):
        ddp_kwargs(tmp_path / "ddp.json")
    # dpro predicted no gain over the library's default: keep it
    (tmp_path / "ddp.json").write_text('{"bucket_cap_mb": null, "keep_default": true}')
    assert ddp_kwargs(tmp_path) == {}
    (tmp_path / "horovod.json").write_text('{"groups": null, "keep_default": true, "HOROVOD_FUSION_THRESHOLD": 67108864}')
    assert horovod_groups(tmp_path, [("a", 1)]) is None
    assert horovod_env(tmp_path) == {"HOROVOD_FUSION_THRESHOLD": "67108864"}


def test_ddp_strategy_caps():
    m = chain_model([("a", "BW", 1, 0)], [Unit(f"p{i}", b, ["a"], [], [f"p{i}"]) for i, b in enumerate([40, 8 << 20, 16 << 20, 8 << 20])],
                    alpha=1)
    assert [len(g) for g in ddp_strategy(m, None).groups] == [2, 2]  # 1 MiB first bucket, then 25 MiB
    assert [len(g) for g in ddp_strategy(m, 25.0).groups] == [4]  # explicit cap: first bucket 25 MiB too


def test_parameter_server_traces_are_refused_clearly(tmp_path):
    from dpro.alignment.synthetic import JobSpec, ps_job
    from dpro.gtrace.io import write_gtrace

    write_gtrace(ps_job(JobSpec(nodes=4, hosts=["a", "a", "b", "b"], seed=1)), tmp_path / "ps")
    r = CliRunner().invoke(cli, ["optimize", str(tmp_path / "ps")])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "parameter-server" in r.output


def test_symmetry_all_workers_replay_the_same():
    """The one-worker graph (symmetry) and the graph with every worker give the same time."""
    from dpro.replayer.engine import simulate

    build_all_workers = load_script("search_speed", "benchmarks/search_speed.py").build_all_workers

    for world in (2, 4, 16):
        m = two_grads(alpha=5, b2_dur=1)
        m.world_size = world
        for st in (Strategy.from_groups([[0], [1]]), Strategy.from_groups([[0, 1]]), Strategy(((0,), (1,)), (2, 3))):
            assert simulate(build_all_workers(m, st)).makespan == pytest.approx(iteration_us(m, st)), (world, st)


def test_latency_note_only_when_alpha_unmeasured_and_more_messages():
    from dpro.graph.comm_model import fit_link_cost
    from dpro.optimizer.optimize import latency_note

    one = fit_link_cost([(1, 4096, 2, 100.0)] * 3)  # one bucket shape: alpha unknown
    two = fit_link_cost([(1, 4096, 2, 100.0), (2, 1 << 20, 2, 900.0)])
    start = Strategy.from_groups([[0, 1, 2]])
    split = Strategy.from_groups([[0], [1], [2]])
    (note,) = latency_note(one, start, split)
    assert "sends 2 more message(s)" in note and "upper bound" in note
    assert latency_note(one, start, Strategy(((0, 1, 2),), (4,)))  # partition: 3 more pieces
    assert latency_note(two, start, split) == []
    assert latency_note(one, split, start) == []
    (note,) = latency_note(two, start, split, horovod=True)  # Horovod: the latency is a lower bound
    assert "least its fused collectives allow" in note and "2 more message(s)" in note


def test_search_never_ends_above_a_given_start():
    """Every baseline is a start of the descent: with no pass to move (so the descents from
    the job's grouping and from no fusion stay put), a better given start wins.
    By hand (2 ranks, alpha 5, beta 0.1: a 100-byte sync is 2 steps of 10 µs): g1 apart
    overlaps b2; g2 + g3 fused after b3: 72 µs; all apart 81, all fused 82."""
    import dataclasses

    m = chain_model([("fw", "FW", 10, 0), ("b1", "BW", 10, 0), ("b2", "BW", 20, 0), ("b3", "BW", 1, 0),
                     ("upd", "UPDATE", 1, 0)],
                    [Unit("g1", 100, ["b1"], ["upd"]), Unit("g2", 100, ["b2"], ["upd"]), Unit("g3", 100, ["b3"], ["upd"])],
                    alpha=5, beta=0.1)
    m = dataclasses.replace(m, baseline_groups=[[0, 1, 2]])
    plain = search(m, [], budget_s=5)
    assert sorted((r.start, r.iteration_us) for r in plain) == [("job's own grouping", 82.0), ("no fusion", 81.0)]
    res = search(m, [], budget_s=5, extra_starts={"given": Strategy.from_groups([[0], [1, 2]]),
                                                   "again": Strategy.from_groups([[0, 1, 2]])})  # duplicate: dropped
    assert [(r.start, r.iteration_us) for r in res] == [("given", 72.0), ("no fusion", 81.0), ("job's own grouping", 82.0)]
    # and with the passes, from any start, nothing above the best start
    assert search(m, [TensorFusion(), TensorPartition()], budget_s=5)[0].iteration_us <= 72.0
