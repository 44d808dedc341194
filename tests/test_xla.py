"""XLA on TensorFlow jobs (dpro.optimizer.xla): the region, its price, the gradients all
ready at its end, Horovod's default under it, and the strategy file, on hand-built jobs
whose iteration times are worked out by hand; and ``compile.json``'s reader."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dpro.errors import DproInputError
from dpro.graph.comm_model import LinkCost
from dpro.apply import xla_jit_compile
from dpro.optimizer.evaluate import analyse, iteration_us
from dpro.optimizer.job_model import CompOp, JobModel, Unit
from dpro.optimizer.optimize import XLA_BASELINE, OptimizeResult, _keep_graph_unless_xla_gains, baselines, realize
from dpro.optimizer.output import strategy_files
from dpro.optimizer.search import SearchResult
from dpro.optimizer.strategy import Strategy
from dpro.optimizer.xla import fused_us, region, xla_fusion, xla_strategy
from dpro.optimizer.passes.base import PassContext
from dpro.optimizer.passes.op_fusion import OpFusion


def tf_job(ops: list[tuple[str, str, float, float]], units: list[Unit], *, ratio: float | None = 0.5,
           alpha: float = 5.0) -> JobModel:
    """A 2-worker Horovod TF job: ops (id, cat, dur, gap) in one chain on one device; each
    collective costs 2 ring steps of ``alpha`` (no bandwidth term); the recorder timed its
    forward + backward at 40 µs as a graph and ``ratio`` × that under XLA."""
    comp = {i: CompOp(i, i, c, "cpu:tf0", d, g, float(k)) for k, (i, c, d, g) in enumerate(ops)}
    ids = [o[0] for o in ops]
    return JobModel(ops=comp, edges=list(zip(ids, ids[1:])), units=units,
                    baseline_groups=[[i] for i in range(len(units))], world_size=2, scheme="allreduce",
                    library="horovod", framework="tensorflow", link=LinkCost(alpha, 0.0),
                    compile=None if ratio is None else {"": {"eager_us": 40.0, "compiled_us": 40.0 * ratio}})


OPS = [("a", "FW", 8.0, 2.0), ("b", "FW", 10.0, 0.0), ("c", "BW", 10.0, 0.0), ("d", "BW", 10.0, 0.0),
       ("u1", "UPDATE", 1.0, 0.0), ("u2", "UPDATE", 1.0, 0.0)]
UNITS = [Unit("w_c", 100, ["c"], ["u1"]), Unit("w_d", 100, ["d"], ["u2"])]


def test_xla_by_hand():
    m = tf_job(OPS, UNITS)
    # as profiled: a..d end at 10, 20, 30, 40; w_c syncs 30-40, w_d 40-50; u1 40-41, u2 50-51
    assert iteration_us(m, Strategy.as_profiled(m)) == pytest.approx(51.0)
    assert region(m) == ("a", "b", "c", "d")
    assert fused_us(m, region(m)) == pytest.approx(20.0)
    x = xla_strategy(m)
    # one op of 20 (the recorder's XLA time); both gradients ready at 20: Horovod fuses them in one buffer,
    # 20-30; u1 30-31, u2 31-32
    assert x.groups == ((0, 1),) and len(x.fusions) == 1 and x.fusions[0].dur == pytest.approx(20.0)
    assert iteration_us(m, x) == pytest.approx(32.0)
    assert xla_fusion(m, x) is x.fusions[0] and xla_fusion(m, Strategy.as_profiled(m)) is None
    assert baselines(m)[XLA_BASELINE] == x
    # XLA at the graph's speed loses the overlap: 40 + 10 + 2 = 52 > 51
    slow = tf_job(OPS, UNITS, ratio=1.0)
    assert iteration_us(slow, xla_strategy(slow)) == pytest.approx(52.0)


def test_xla_time_is_the_recorders_not_the_jobs_times_a_ratio():
    """The job's forward + backward took 40 µs in the trace, but the recorder timed the
    same graph at 30 and XLA at 15 (the job's graph ops paid dispatch and a busy Horovod
    thread that the compiled cluster does not): the cluster is 15, not 0.5 x 40 = 20;
    gradients ready at 15, one buffer 15-25, u1 25-26, u2 26-27."""
    m = replace(tf_job(OPS, UNITS), compile={"": {"eager_us": 30.0, "compiled_us": 15.0}})
    x = xla_strategy(m)
    assert x.fusions[0].dur == pytest.approx(15.0) and iteration_us(m, x) == pytest.approx(27.0)


def test_region_holds_what_lies_between_and_refuses_a_wait_inside():
    between = OPS[:2] + [("loss", "OTHER", 3.0, 0.0)] + OPS[2:]
    m = tf_job(between, UNITS)
    assert region(m) == ("a", "b", "loss", "c", "d")
    # the loss is not what the recorder timed: it keeps its own time in the fused op
    assert fused_us(m, region(m)) == pytest.approx(23.0)
    # a synchronisation that an op inside the region waits for: XLA cannot be modelled (nor run)
    inside = tf_job(between, [Unit("w_b", 100, ["b"], ["loss"]), UNITS[1]])
    assert region(inside) == () and xla_strategy(inside) is None
    # not measured, or not TensorFlow: no XLA strategy
    assert xla_strategy(tf_job(OPS, UNITS, ratio=None)) is None
    torch_job = replace(tf_job(OPS, UNITS), framework="pytorch")
    assert xla_strategy(torch_job) is None and XLA_BASELINE not in baselines(torch_job)


def test_chain_op_fusion_is_not_searched_on_tensorflow():
    gaps = [(i, c, d, 3.0) for i, c, d, _ in OPS]  # fusing a with b saves b's host gap
    m = tf_job(gaps, UNITS, ratio=None)
    st = Strategy.as_profiled(m)
    assert OpFusion().candidates(PassContext(m, st, analyse(m, st))) == []
    torch_job = replace(m, framework="pytorch")
    assert OpFusion().candidates(PassContext(torch_job, st, analyse(torch_job, st)))


def _result(m: JobModel, best: Strategy) -> OptimizeResult:
    t = iteration_us(m, best)
    return OptimizeResult(model=m, replay_us=t, measured_us=t, baselines={"job as profiled": t},
                          results=[SearchResult("x", best, t)], realized=realize(m, best),
                          critical_before=[], critical_after=[], time_s=0.0, notes=[])


def test_realized_with_xla_and_its_files():
    m = tf_job(OPS, UNITS)
    x = xla_strategy(m)
    (hv,) = realize(m, x)
    # the grouping is Horovod's own under XLA: kept, and priced with XLA
    assert hv.library == "horovod" and hv.settings["keep_default"] and hv.iteration_us == pytest.approx(32.0)
    files = strategy_files(_result(m, x))
    assert files["compile.json"]["xla_jit_compile"] is True and files["compile.json"]["xla_over_graph"] == 0.5
    assert "tf.function(jit_compile=True)" in files["summary.txt"]
    assert "compile.json" not in strategy_files(_result(m, Strategy.as_profiled(m)))


def test_xla_only_for_a_real_gain():
    m = tf_job(OPS, UNITS)
    x, plain = xla_strategy(m), Strategy.as_profiled(m)
    fast = [SearchResult("xla", x, 32.0), SearchResult("plain", plain, 51.0)]
    assert _keep_graph_unless_xla_gains(m, fast)[0].start == "xla"
    close = [SearchResult("xla", x, 50.8), SearchResult("plain", plain, 51.0)]  # 0.4 % < MIN_GAIN
    assert _keep_graph_unless_xla_gains(m, close)[0].start == "plain"


def test_compile_json_reader(tmp_path):
    assert xla_jit_compile(tmp_path) is False  # no compile.json: nothing to compile
    (tmp_path / "compile.json").write_text(json.dumps({"torch_compile_modules": [""]}))
    assert xla_jit_compile(tmp_path) is False
    (tmp_path / "compile.json").write_text(json.dumps({"xla_jit_compile": True}))
    assert xla_jit_compile(tmp_path) is True and xla_jit_compile(tmp_path / "compile.json") is True
    (tmp_path / "compile.json").write_text(json.dumps({"xla_jit_compile": "yes"}))
    with pytest.raises(DproInputError, match="xla_jit_compile"):
        xla_jit_compile(tmp_path)
