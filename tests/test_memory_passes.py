"""Memory passes: recomputation and gradient accumulation, `dpro optimize --memory-budget`.

Hand-computed timelines on a small model, then real 2-rank gloo DDP jobs: the prediction
from the unchanged job's trace against the peak measured (torch's allocator events) in a
run with the change applied for real (benchmarks/memory_fidelity.py's measurement).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dpro.cli import cli
from dpro.graph.comm_model import LinkCost
from dpro.apply import memory_settings, split_batch
from dpro.optimizer.blocks import blocks
from dpro.optimizer.memory.fit import CannotFit, evaluate_memory, fit_memory
from dpro.optimizer.job_model import CompOp, JobModel, Unit
from dpro.optimizer.strategy import Strategy
from dpro.optimizer.passes.grad_accumulation import GradientAccumulation
from dpro.optimizer.passes.recomputation import Recomputation

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def small_model() -> JobModel:
    """f1 f2 f3 b3 b2 b1 u in a chain, 10 µs each; f1/f2 are module blk (blk.a, blk.b).

    Activations A1 (f1 -> b1, 400 B), A2 (f2 -> b2, 300 B, f2 has 20 B of temporaries),
    A3 (f3 -> b3, 200 B); b3 has 10 B of temporaries; b1 makes the gradient G (100 B)
    that the next step's f1 frees (after zero_grad): carry-in 100 B; static 1000 B.
    """
    spec = [("f1", "FW", "blk.a"), ("f2", "FW", "blk.b"), ("f3", "FW", "head"), ("b3", "BW", "head"),
            ("b2", "BW", "blk.b"), ("b1", "BW", "blk.a"), ("u", "UPDATE", None)]
    ops = {i: CompOp(i, i, c, "cpu", 10.0, 0.0, 10.0 * k, layer) for k, (i, c, layer) in enumerate(spec)}
    ids = [s[0] for s in spec]
    mem = {
        "static": {"params": 1000}, "carry_in": 100,
        "ops": {"f1": {"peak": 400, "alloc": 400, "free": 100}, "f2": {"peak": 320, "alloc": 300, "free": 0},
                "f3": {"peak": 200, "alloc": 200, "free": 0}, "b3": {"peak": 10, "alloc": 0, "free": 200},
                "b2": {"peak": 0, "alloc": 0, "free": 300}, "b1": {"peak": 100, "alloc": 100, "free": 400},
                "u": {"peak": 0, "alloc": 0, "free": 0}},
        "lifetimes": [["f1", "b1", 400], ["f2", "b2", 300], ["f3", "b3", 200], ["b1", "f1", 100]],
    }
    return JobModel(ops=ops, edges=list(zip(ids, ids[1:])), units=[Unit("g", 100, ["b1"], ["u"], ["g"])],
                    baseline_groups=[[0]], world_size=1, scheme="allreduce", library="gloo", framework="pytorch",
                    link=LinkCost(0.0, 0.0), memory=mem)


def test_unchanged_by_hand():
    c = evaluate_memory(small_model(), Strategy.from_groups([[0]]))
    # 1100, f1 +400, -100, f2 +320, -20, f3 +200 (1900), b3 +10 -> 1910
    assert c.peak_bytes == 1910
    assert c.iteration_us == pytest.approx(70.0)


def test_blocks_of_small_model():
    assert [(b.name, b.fw, b.bw) for b in blocks(small_model())] == [("blk", ("f1", "f2"), ("b2", "b1"))]


def test_recompute_by_hand():
    m = small_model()
    c = evaluate_memory(m, Strategy.from_groups([[0]]).with_memory(recompute=("blk",)))
    # A1 and A2 dropped after the forward (1000 after f1, f2, 1200 after f3, 1000 after b3), recomputed
    # before b2: +700 +20 temporaries -> 1720
    assert c.peak_bytes == 1720
    assert c.iteration_us == pytest.approx(90.0)  # + f1 and f2 again


def test_accumulation_by_hand():
    m = small_model()
    c = evaluate_memory(m, Strategy.from_groups([[0]]).with_memory(accum=2))
    # micro-batch 2: G (100) live from micro-batch 1, activations halved (100 + 150 + 100), f2's
    # temporaries halved (10), b3's (5): 1100 + 200 + 150 + 100 + 5 = 1555
    assert c.peak_bytes == 1555
    assert c.iteration_us == pytest.approx(70.0)  # own times halved, twice; no host gaps here
    m.ops["f1"].gap = 4.0
    assert evaluate_memory(m, Strategy.from_groups([[0]]).with_memory(accum=2)).iteration_us == pytest.approx(78.0)


def test_micro_trace_interpolation_by_hand():
    from dpro.optimizer.worker_graph import micro_own_us

    m = small_model()
    assert micro_own_us(m, ("f1", "f2"), 2) == pytest.approx(10.0)  # no second trace: 1/k
    m.micro = (0.5, {"f1": 8.0})  # f1 measured at half the batch: 8 µs (a 6 µs fixed part)
    assert micro_own_us(m, ("f1",), 2) == pytest.approx(8.0)
    assert micro_own_us(m, ("f1",), 4) == pytest.approx(7.0)  # extrapolated: 8 + (10 - 8) * (0.25 - 0.5) / 0.5
    assert micro_own_us(m, ("f2",), 4) == pytest.approx(2.5)  # not in the second trace: 1/k
    c = evaluate_memory(m, Strategy.from_groups([[0]]).with_memory(accum=2))
    assert c.iteration_us == pytest.approx(70.0 + 2 * 3.0)


def test_fit_memory_picks_fastest_that_fits_and_says_when_nothing_does():
    m = small_model()
    passes = [Recomputation(), GradientAccumulation((2,))]
    start = Strategy.from_groups([[0]])
    assert fit_memory(m, 2000, passes, start).chosen.strategy == start  # fits as it is
    fit = fit_memory(m, 1800, passes, start)
    assert fit.chosen.strategy.accum == 2 and not fit.chosen.strategy.recompute  # 70 µs beats 90 µs
    fit = fit_memory(m, 1600, passes, start)
    assert fit.chosen.peak_bytes <= 1600
    with pytest.raises(CannotFit, match=r"cannot fit in 1000 B: the best found needs [\d.]+ KiB \(checkpoint .*blk; 2 micro-batches"):
        fit_memory(m, 1000, passes, start)


def test_memory_settings_files(tmp_path):
    assert memory_settings(tmp_path).accumulation_steps == 1  # no memory.json: nothing to change
    (tmp_path / "memory.json").write_text(json.dumps({"checkpoint_modules": ["a.b"], "accumulation_steps": 4}))
    s = memory_settings(tmp_path)
    assert s.checkpoint_modules == ("a.b",) and s.accumulation_steps == 4
    (tmp_path / "memory.json").write_text(json.dumps({"accumulation_steps": 0}))
    with pytest.raises(Exception, match="accumulation_steps"):
        memory_settings(tmp_path)


def test_checkpointed_module_gives_the_same_gradients():
    torch = pytest.importorskip("torch")
    from dpro.apply import checkpoint_modules

    def grads(ckpt: bool) -> list:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)),
                                torch.nn.Linear(8, 1))
        if ckpt:
            checkpoint_modules(m, ["0"])
        m(torch.ones(4, 8)).sum().backward()
        return [p.grad.clone() for p in m.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(grads(False), grads(True)))
    x = torch.arange(6)
    assert [t[0].tolist() for t in split_batch((x,), 3)] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ValueError, match="cannot be split"):
        split_batch((x,), 4)


def test_mixed_precision_by_hand(tmp_path, monkeypatch):
    from dpro.optimizer.passes.base import PassContext
    from dpro.passes.mixed_precision import MixedPrecision, load_factors, op_class

    assert op_class("aten::linear") == "matmul" and op_class("autograd::engine::evaluate_function: AddmmBackward0") == "matmul"
    assert op_class("aten::conv2d") == "conv" and op_class("aten::scaled_dot_product_attention") == "attention"
    assert op_class("aten::relu") is None
    m = small_model()
    m.ops["f2"].name = "aten::linear"  # 10 µs -> 5 µs, keeps A2 (300 B) at half size
    m.ops["b2"].name = "autograd::engine::evaluate_function: AddmmBackward0"  # 10 µs -> 2.5 µs
    p = MixedPrecision({"matmul": {"FW": 0.5, "BW": 0.25}})
    start = Strategy.from_groups([[0]])
    (cand,) = p.candidates(PassContext(m, start, None))  # type: ignore[arg-type]
    assert cand.est_gain_us == pytest.approx(12.5)
    c = evaluate_memory(m, p.apply(PassContext(m, start, None), cand))  # type: ignore[arg-type]
    assert c.iteration_us == pytest.approx(57.5)
    # A2 and (after it: low precision) A3 halved, f1 before it not; b3's temporaries halved
    assert c.peak_bytes == 1910 - 150 - 100 - 5
    (tmp_path / "amp.json").write_text(json.dumps({"factors": {"matmul": {"FW": 0.7}}}))
    with pytest.raises(Exception, match="not an AMP calibration"):
        load_factors(tmp_path / "amp.json")
    (tmp_path / "amp.json").write_text(json.dumps({"factors": {"matmul": {"FW": 0.7, "BW": 0.6}}}))
    monkeypatch.setenv("DPRO_AMP_FACTORS", str(tmp_path / "amp.json"))
    assert MixedPrecision().factors["matmul"] == {"FW": 0.7, "BW": 0.6}


def test_broken_user_pass_module_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "broken_pass.py").write_text("def f(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = CliRunner().invoke(cli, ["optimize", "--load-pass", "broken_pass", "--list-passes"])
    assert r.exit_code == 2 and "broken_pass: cannot import the pass module: SyntaxError" in r.output
    assert "Traceback" not in r.output


# ---------------------------------------------------------------- real jobs

def _profile(config: str, out: Path) -> Path:
    import memory_fidelity as mf

    model, opt, set_to_none, view = mf.CONFIGS[config]
    cmd = [sys.executable, "-m", "dpro.cli", "profile", "-o", str(out), "--warmup", "2", "--steps", "3", "--force", "--memory",
           "--", *mf._job(["--steps", "6"], model, opt, set_to_none, view)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def _measured_peak(config: str, extra: list[str], out: Path) -> int:
    import memory_fidelity as mf

    model, opt, set_to_none, view = mf.CONFIGS[config]
    r = subprocess.run(mf._job(["--truth", str(out), "--steps", "6", *extra], model, opt, set_to_none, view),
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return max(max(json.loads(f.read_text())["peaks"].values()) for f in out.glob("rank*.json"))


def _model_of(traces: Path) -> JobModel:
    from dpro.gtrace.io import load_gtrace
    from dpro.optimizer.job_model import job_model
    from dpro.replayer.replay import replay

    gt = load_gtrace(traces)
    rr = replay(gt)
    return job_model(gt, rr.build.link_cost, rr.steps)


@pytest.fixture(scope="module")
def transformer_trace(tmp_path_factory) -> Path:
    return _profile("transformer-adamw", tmp_path_factory.mktemp("tf") / "traces")


BLOCKS = ("encoder.layers.0", "encoder.layers.1", "encoder.layers.2")


def test_real_recomputation_peak(transformer_trace, tmp_path):
    m = _model_of(transformer_trace)
    assert [b.name for b in blocks(m) if b.depth == 3] == list(BLOCKS)
    base = Strategy.from_groups(m.baseline_groups)
    pred = evaluate_memory(m, base.with_memory(recompute=BLOCKS))
    assert pred.peak_bytes < evaluate_memory(m, base).peak_bytes * 0.85
    meas = _measured_peak("transformer-adamw", ["--checkpoint", ",".join(BLOCKS)], tmp_path / "truth")
    assert abs(pred.peak_bytes - meas) / meas < 0.05, (pred.peak_bytes, meas)


def test_real_accumulation_peak(tmp_path):
    m = _model_of(_profile("mlp-sgdm", tmp_path / "traces"))
    pred = evaluate_memory(m, Strategy.from_groups(m.baseline_groups).with_memory(accum=2))
    meas = _measured_peak("mlp-sgdm", ["--accum", "2"], tmp_path / "truth")
    assert abs(pred.peak_bytes - meas) / meas < 0.05, (pred.peak_bytes, meas)


def test_cli_memory_budget(transformer_trace, tmp_path):
    m = _model_of(transformer_trace)
    before = evaluate_memory(m, Strategy.from_groups(m.baseline_groups)).peak_bytes
    out = tmp_path / "opt"
    r = CliRunner().invoke(cli, ["optimize", str(transformer_trace), "--budget", "2", "--memory-budget",
                                 str(int(before * 0.85)), "-o", str(out)])
    assert r.exit_code == 0, r.output
    mem = json.loads((out / "memory.json").read_text())
    assert mem["checkpoint_modules"] or mem["accumulation_steps"] > 1
    assert mem["predicted_peak_bytes"] <= int(before * 0.85) < mem["peak_as_profiled_bytes"]
    assert "budget" in r.output
    r = CliRunner().invoke(cli, ["optimize", str(transformer_trace), "--memory-budget", "1MiB"])
    assert r.exit_code == 3
    assert r.output.count("\n") == 1 and "cannot fit in 1.00 MiB: the best found needs" in r.output
    r = CliRunner().invoke(cli, ["optimize", str(transformer_trace), "--memory-budget", "lots"])
    assert r.exit_code == 2 and "not a size" in r.output
    r = CliRunner().invoke(cli, ["optimize", str(transformer_trace), "--micro-trace", str(ROOT / "tests/data/probe")])
    assert r.exit_code == 2 and "both need dpro's memory record" in r.output and r.output.count("\n") == 1
    out = tmp_path / "amp"
    r = CliRunner().invoke(cli, ["optimize", str(transformer_trace), "--budget", "2", "--passes", "mixed_precision",
                                 "--load-pass", "dpro.passes.mixed_precision", "-o", str(out)])
    assert r.exit_code == 0, r.output
    # measured factors: matmul/conv faster, attention slower on this CPU; the search decides
    assert (out / "amp.json").exists() == ("[mixed_precision]" in r.output)


# ---------------------------------------------------------------- op fusion priced by torch.compile

def test_fused_duration_uses_the_smallest_measured_module():
    from dpro.optimizer.passes.op_fusion import fused_duration, measured_module

    m = small_model()
    m.ops["f1"].gap = 2.0
    assert fused_duration(m, ("f1", "f2")) == pytest.approx(2.0 + 20.0)  # estimate: first gap + own times
    m.compile = {"": {"eager_us": 100.0, "compiled_us": 150.0}, "blk": {"eager_us": 100.0, "compiled_us": 50.0}}
    assert measured_module(m, ("f1", "f2")) == "blk"
    assert fused_duration(m, ("f1", "f2")) == pytest.approx(0.5 * 22.0)
    assert measured_module(m, ("f2", "f3")) == ""  # blk.b and head: only the model holds both
    assert fused_duration(m, ("f2", "f3")) == pytest.approx(1.5 * 20.0)


def test_modules_to_compile_hold_each_fusion():
    """Compiling each op's own layer cannot fuse across layers: compile.json names the
    deepest module around each fusion, and only the outermost of those."""
    from dpro.optimizer.passes.op_fusion import enclosing_module, outermost

    m = small_model()
    assert enclosing_module(m, ("f1", "f2")) == "blk"
    assert enclosing_module(m, ("f1",)) == "blk.a"
    assert enclosing_module(m, ("f2", "f3")) == ""  # blk.b and head: only the model holds both
    assert enclosing_module(m, ("b1", "u")) == ""  # u belongs to no module
    assert outermost({"blk", "blk.a", "head"}) == ["blk", "head"]
    assert outermost({"", "blk"}) == [""]


def test_compile_facts_take_the_median_over_ranks():
    from dpro.optimizer.job_model import _compile_facts

    ranks = [{"": {"class": "M", "eager_us": 100.0, "compiled_us": 141.0}, "blk": {"eager_us": 10, "compiled_us": 5}},
             {"": {"class": "M", "eager_us": 100.0, "compiled_us": 117.0}, "blk": {"eager_us": 0, "compiled_us": 5}},
             {"": {"class": "M", "eager_us": 90.0, "compiled_us": 120.0}},
             "not a dict", None]
    got = _compile_facts(ranks)
    assert got == {"": {"class": "M", "eager_us": 100.0, "compiled_us": 120.0, "ranks": 3},
                   "blk": {"class": None, "eager_us": 10.0, "compiled_us": 5.0, "ranks": 1}}
    assert _compile_facts([None, {"x": {"eager_us": -1, "compiled_us": 1}}]) is None


def test_compile_probe_measures_blocks_without_touching_training_state():
    torch = pytest.importorskip("torch")
    from dpro.profiler.pytorch.compile_probe import CompileProbe

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1)),
                                torch.nn.Linear(16, 1))
    probe = CompileProbe(model)
    probe.start()
    x = torch.randn(8, 16)
    model(x).sum().backward()
    assert set(probe.inputs) == {"", "0"} and not probe.hooks  # first inputs kept, hooks gone
    grads = [p.grad.clone() for p in model.parameters()]
    rng = torch.get_rng_state()
    res = probe.measure(budget_s=300)
    assert set(res) == {"", "0"} and res["0"]["class"] == "Sequential"
    assert all(v["eager_us"] > 0 and v["compiled_us"] > 0 for v in res.values())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert torch.equal(rng, torch.get_rng_state())


def test_compile_modules_compiles_torch_own_modules(tmp_path):
    """compile.json applied to an ``nn.Sequential`` really runs it under Dynamo: its
    ``.compile()`` is silently a no-op there (torch 2.13, pytorch/pytorch#150915)."""
    torch = pytest.importorskip("torch")
    from torch._dynamo.utils import counters

    from dpro.apply import compile_modules

    torch._dynamo.reset()
    counters.clear()
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), torch.nn.Linear(8, 1))
    x = torch.randn(4, 8)
    want = model(x)
    (tmp_path / "compile.json").write_text(json.dumps({"torch_compile_modules": ["0"]}))
    assert compile_modules(model, tmp_path) == ["0"]
    assert torch.allclose(model(x), want)
    assert counters["frames"]["ok"] == 1 and counters["stats"]["unique_graphs"] == 1
    assert list(model.state_dict()) == ["0.0.weight", "0.0.bias", "1.weight", "1.bias"]  # keys unchanged
    twin = copy.deepcopy(model)  # e.g. an EMA copy: it runs its own parameters
    with torch.no_grad():
        twin[1].bias += 1.0
    assert torch.allclose(twin(x), want + 1.0) and torch.allclose(model(x), want)
    (tmp_path / "compile.json").write_text(json.dumps({"torch_compile_modules": ["nope"]}))
    with pytest.raises(Exception, match="no module 'nope'"):
        compile_modules(model, tmp_path)
