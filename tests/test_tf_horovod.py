"""TensorFlow 2 + Horovod (gloo, CPU): `dpro profile` with the two-line Recorder, then replay.

The job (examples/tensorflow/hvd_recorder.py, 2 workers under ``horovodrun --gloo``) runs
in the TensorFlow venv ``.venv-tf`` (``scripts/setup_tf.sh``); ``dpro profile`` and the
import run here, in the test's interpreter, which needs no TensorFlow: the ranks convert
their profile themselves (dpro/profiler/tensorflow/backend.py). Skipped when ``.venv-tf`` is not
set up. About 30-60 s on the 2-core machine.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpro.contracts.recording import TIMELINE_NAME
from dpro.errors import DproInputError
from dpro.gtrace.io import load_gtrace
from dpro.gtrace.validate import find_cycle
from dpro.importers.horovod.timeline import load_horovod_timeline
from dpro.importers.tensorflow.convert import collect_tf
from dpro.replayer.replay import replay

REPO = Path(__file__).resolve().parents[1]
TF_VENV = Path(os.environ.get("DPRO_TF_VENV", REPO / ".venv-tf"))
EXAMPLE = REPO / "examples" / "tensorflow" / "hvd_recorder.py"
WARMUP, STEPS = 4, 6

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> Path:
    py, hvdrun = TF_VENV / "bin" / "python", TF_VENV / "bin" / "horovodrun"
    if not (py.is_file() and hvdrun.is_file()):
        pytest.skip(f"{TF_VENV} is not set up (run scripts/setup_tf.sh)")
    tmp = tmp_path_factory.mktemp("tfhvd")
    out = tmp / "traces"
    env = dict(os.environ)
    env.pop("HOROVOD_TIMELINE", None)
    cmd = [sys.executable, "-m", "dpro.cli", "profile", "-o", str(out), "--warmup", str(WARMUP),
           "--steps", str(STEPS), "--measure-compile", "--", str(hvdrun), "-np", "2", "--gloo", "-H", "localhost:2",
           str(py), str(EXAMPLE), "--model", "convnet", "--steps", str(WARMUP + STEPS + 4),
           "--timing-out", str(tmp / "timing")]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "recorded 2 rank(s)" in r.stderr, r.stderr[-3000:]
    assert "horovod timeline not used" not in r.stderr, r.stderr[-3000:]
    return out


def _raw(profiled: Path, rank: int) -> dict:
    return json.loads(gzip.decompress((profiled / "raw" / f"rank{rank}.json.gz").read_bytes()))


def test_recording_files(profiled):
    raw = profiled / "raw"
    assert sorted(p.name for p in raw.iterdir()) == sorted(
        [f"rank{r}.{x}" for r in (0, 1) for x in ("json.gz", "meta.json", "xplane.pb")] + [TIMELINE_NAME])
    meta = json.loads((raw / "rank0.meta.json").read_text())
    assert meta["framework"] == "tensorflow" and meta["library"] == "horovod" and meta["world_size"] == 2
    gt = load_gtrace(profiled)
    assert gt.manifest.framework == "tensorflow" and gt.manifest.library == "horovod"
    assert len(gt.manifest.steps) >= STEPS - 2 and set(gt.manifest.steps) <= set(range(WARMUP, WARMUP + STEPS))


def test_every_traced_graph_op_is_in_the_dfg(profiled):
    gt = load_gtrace(profiled)
    for nt in gt.workers():
        d = _raw(profiled, nt.info.rank)
        graph = {n["name"]: n["op"] for g in d["graphs"] for n in g}
        windows = [d["steps"][str(s)] for s in gt.manifest.steps]
        traced = {e[0] for e in d["events"] if e[5] != "done" and any(t <= e[3] <= t + dur for t, dur in windows)}
        in_graph = traced & set(graph)
        assert len(in_graph) > 50 and traced == in_graph, sorted(traced - in_graph)[:5]
        by_node = {op.id.rsplit("@", 1)[0]: op for op in nt.ops.values() if op.cat != "COMM" and op.name != "STEP_END"}
        assert set(by_node) == in_graph  # one to one
        for n, op in by_node.items():
            assert op.name == graph[n] and not op.id.endswith("#generic")
        cats = {op.cat for op in nt.ops.values()}
        assert {"FW", "BW", "UPDATE", "IO", "COMM"} <= cats
        assert nt.ops["IteratorGetNext@io"].cat == "IO"
        assert all(op.cat == "BW" for n, op in by_node.items() if n.startswith("gradient_tape/"))
        assert all(op.cat == "UPDATE" for op in nt.ops.values() if op.name in ("AssignSubVariableOp", "AssignAddVariableOp")
                   or op.id.startswith("sgd/Mul"))
        # graph data edges are DFG edges (both ends traced)
        edges = set(nt.edges)
        for g in d["graphs"]:
            for node in g:
                if node["name"] in by_node:
                    for i in node["inputs"]:
                        u = i.split(":")[0]
                        if u in by_node:
                            assert (by_node[u].id, by_node[node["name"]].id) in edges
        assert find_cycle(sorted(edges)) is None
        steps = {(e.op, e.step) for e in nt.events}
        assert all((oid, s) in steps for oid in nt.ops for s in gt.manifest.steps)


def test_gradients_matched_to_their_allreduce(profiled):
    gt = load_gtrace(profiled)
    meta = json.loads((profiled / "raw" / "rank0.meta.json").read_text())
    params = {p["name"]: p for p in meta["params"]}
    assert len(params) == 10  # convnet: 5 layers, kernel + bias
    tl = load_horovod_timeline(profiled / "raw" / TIMELINE_NAME)
    txns = []
    for nt in gt.workers():
        succ: dict[str, set[str]] = {}
        for u, v in nt.edges:
            succ.setdefault(u, set()).add(v)
        comm = {op.txn: op for op in nt.ops.values() if op.cat == "COMM"}
        assert comm and all(op.sub_op == "ALLREDUCE" and op.device == "comm" for op in comm.values())
        assert {t.name for t in nt.tensors} == set(params)
        by_grad = {t["gradient"]: t for t in nt.meta["horovod"]["tensors"]}
        for t in nt.tensors:
            assert t.bytes == params[t.name]["bytes"] and list(t.shape) == params[t.name]["shape"]
            assert t.producer in nt.ops and nt.ops[t.producer].cat == "BW", t
            assert t.txn in comm, f"{t.name} is carried by no collective"
            h = by_grad[t.name]
            # joined by name: the graph's allreduce node is Horovod's tensor
            assert h["horovod_name"] in tl.tensors and tl.tensors[h["horovod_name"]][0].size_bytes == t.bytes
            enq = h["enqueue_op"]
            assert nt.ops[enq].name == "HorovodAllreduce" and enq.startswith(h["horovod_name"] + "@")
            assert enq in succ[t.producer] or any(enq in succ.get(x, ()) for x in succ[t.producer])
            assert comm[t.txn].id in succ[enq]
            assert h["consumers"] and all(c in succ[comm[t.txn].id] for c in h["consumers"])
            assert all(nt.ops[c].cat == "UPDATE" for c in h["consumers"])
        for txn, op in comm.items():
            assert op.bytes == sum(t.bytes for t in nt.tensors if t.txn == txn)
        txns.append(sorted(comm))
    assert txns[0] == txns[1]  # transaction ids pair the ranks' collectives


def test_fused_groups_recorded(profiled):
    gt = load_gtrace(profiled)
    tl = load_horovod_timeline(profiled / "raw" / TIMELINE_NAME)
    params = {t.name for t in gt.workers()[0].tensors}
    for nt in gt.workers():
        hv = nt.meta["horovod"]
        assert {n for a in hv["atoms"] for n in a["tensors"]} == params
        for s in gt.manifest.steps:
            groups = hv["groups"][str(s)]
            assert sorted(n for g in groups for n in g["tensors"]) == sorted(params)
            # the same groups as Horovod's timeline in this step's window
            t0, dur = nt.steps[s]
            lo, hi = t0 - tl.start_epoch_us, t0 + dur - tl.start_epoch_us
            tl_groups = [g for g in tl.fusion_groups if g.kind == "ALLREDUCE" and lo <= g.exec_start_us < hi]
            assert len(tl_groups) == len(groups)
            assert sorted(len(g.ops) for g in tl_groups) == sorted(len(g["tensors"]) for g in groups)
            assert sum(g.size_bytes for g in tl_groups) == sum(g["bytes"] for g in groups)


def test_xla_measured_and_weighed(profiled):
    """--measure-compile: every rank timed the model's forward + backward as a graph and
    under XLA after the window; the import keeps it and `dpro optimize` weighs XLA."""
    gt = load_gtrace(profiled)
    for nt in gt.workers():
        c = nt.meta["compile"][""]
        assert c["compiler"] == "xla" and c["class"] == "Sequential"
        assert c["eager_us"] > 500 and c["compiled_us"] > 0
    r = subprocess.run([sys.executable, "-m", "dpro.cli", "optimize", str(profiled), "--budget", "5", "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    from dpro.optimizer.optimize import XLA_BASELINE

    doc = json.loads(r.stdout)
    assert doc["baselines_us"][XLA_BASELINE] > 0


def test_xla_strategy_is_applied(tmp_path):
    """compile.json's ``xla_jit_compile``: the example computes loss and gradients under
    tf.function(jit_compile=True), Horovod outside it; the job trains (the loss falls) and
    XLA really compiled a cluster (TF's log line)."""
    py, hvdrun = TF_VENV / "bin" / "python", TF_VENV / "bin" / "horovodrun"
    if not (py.is_file() and hvdrun.is_file()):
        pytest.skip(f"{TF_VENV} is not set up (run scripts/setup_tf.sh)")
    strategy = tmp_path / "s"
    strategy.mkdir()
    (strategy / "horovod.json").write_text(json.dumps({"groups": None, "keep_default": True}))
    (strategy / "compile.json").write_text(json.dumps({"framework": "tensorflow", "xla_jit_compile": True}))
    env = {**os.environ, "DPRO_DISABLE": "1", "TF_CPP_MIN_LOG_LEVEL": "0"}
    env.pop("HOROVOD_TIMELINE", None)
    r = subprocess.run([str(hvdrun), "-np", "2", "--gloo", "-H", "localhost:2", str(py), str(EXAMPLE),
                        "--model", "convnet", "--steps", "12", "--skip", "2", "--timing-out", str(tmp_path / "t"),
                        "--dpro-strategy", str(strategy)], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    for rank in (0, 1):
        t = json.loads((tmp_path / f"t.{rank}.json").read_text())
        assert t["xla"] is True and t["last_loss"] < t["first_loss"]  # one batch, 12 steps: it fits
    assert "Compiled cluster using XLA" in r.stdout + r.stderr


def test_replay_within_bound(profiled):
    gt = load_gtrace(profiled)
    res = replay(gt)
    n_comm = len({op.txn for op in gt.workers()[0].ops.values() if op.cat == "COMM"})
    assert res.build.expanded == n_comm and res.build.kept_coarse == 0
    # 30 %: the ranks share 2 cores with each other and with whatever else runs; quiet runs
    # are within a few % (docs/tensorflow.md), loaded ones drifted up to +20 %.
    assert abs(res.error_pct) <= 30.0, res.to_json()
    # dpro's measured iteration agrees with the script's own clock over the profiled steps
    own = [json.loads((profiled.parent / f"timing.{r}.json").read_text())["median_step_us_profiled"] for r in (0, 1)]
    assert res.measured_iteration_us == pytest.approx(sum(own) / 2, rel=0.3)


# ---------------------------------------------------------------- foreign / unknown input


def _copy_raw(profiled: Path, tmp: Path) -> Path:
    raw = tmp / "raw"
    shutil.copytree(profiled / "raw", raw)
    return raw


def _rewrite(raw: Path, rank: int, fn) -> None:
    p = raw / f"rank{rank}.json.gz"
    d = json.loads(gzip.decompress(p.read_bytes()))
    fn(d)
    p.write_bytes(gzip.compress(json.dumps(d).encode()))


def test_unknown_ops_become_generic_nodes(profiled, tmp_path, caplog):
    raw = _copy_raw(profiled, tmp_path)
    steps = _raw(profiled, 0)["steps"]

    def add_foreign(d):  # what another TF version might emit: an op the graph does not know, every step
        for t, dur in steps.values():
            d["events"].append(["FancyNewOp_7", "FancyNewType", "tf_Compute/1", t + dur / 2, 3.0, "op"])
            d["events"].append(["tf.SomeV3Thing", "", "tf_Compute/1", t + 1.0, 2.0, "op"])

    _rewrite(raw, 0, add_foreign)
    gt = collect_tf(raw, progress=False)
    nt = gt.nodes["worker0"]
    generic = [op for op in nt.ops.values() if op.id.endswith("#generic")]
    assert sorted(op.name for op in generic) == ["?", "FancyNewType"]
    assert {op.cat for op in generic} <= {"FW", "OTHER"}
    assert any("2 traced op(s) not in the recorded graph" in n for n in gt.notes), gt.notes
    assert "unknown op(s) imported as generic nodes" in caplog.text
    assert not [op for op in gt.nodes["worker1"].ops.values() if op.id.endswith("#generic")]
    res = replay(gt)  # still replays
    assert res.predicted_iteration_us > 0


def test_trace_without_graph_still_imports(profiled, tmp_path):
    raw = _copy_raw(profiled, tmp_path)
    _rewrite(raw, 1, lambda d: d.update(graphs=[]))
    gt = collect_tf(raw, progress=False)
    assert any("no TF graph was recorded" in n for n in gt.notes)
    ops = gt.nodes["worker1"].ops.values()
    assert ops and all(op.id.endswith("#generic") or op.cat == "COMM" or op.name == "STEP_END" for op in ops)


@pytest.mark.parametrize("change, problem", [
    (lambda d: d.update(format="something-else"), "not a dpro TensorFlow rank recording"),
    (lambda d: d["events"].append(["x", "T"]), "malformed event"),
    (lambda d: d["graphs"].append([{"op": "MatMul"}]), "graph node must have"),
    (lambda d: d.update(steps={}), "no profiled step"),
])
def test_bad_recording_is_one_line_error(profiled, tmp_path, change, problem):
    raw = _copy_raw(profiled, tmp_path)
    _rewrite(raw, 0, change)
    with pytest.raises(DproInputError) as e:
        collect_tf(raw, progress=False)
    assert problem in str(e.value) and "rank0.json.gz" in str(e.value) and "\n" not in str(e.value)


def test_timeline_writer_runs_at_idle_priority(profiled):
    """Rank 0's Horovod timeline writer spins for the whole job once HOROVOD_TIMELINE is set
    (dpro profile sets DYNAMIC): the recorder found it and moved it to SCHED_IDLE."""
    tid = json.loads((profiled / "raw" / "rank0.meta.json").read_text()).get("horovod_writer_thread")
    assert isinstance(tid, int) and tid > 0
    assert json.loads((profiled / "raw" / "rank1.meta.json").read_text()).get("horovod_writer_thread") is None
    gt = load_gtrace(profiled)
    assert len(gt.nodes["worker0"].meta["step_wall_us"]) == WARMUP + STEPS


@pytest.mark.parametrize("model, groups", [
    # two biases of one shape in different groups, out of the variables' order
    ("convnet", [["convnet/fc2/kernel", "convnet/fc2/bias", "convnet/conv2/bias"],
                 ["convnet/fc1/kernel", "convnet/fc1/bias"], ["convnet/conv1/bias", "convnet/conv3/kernel"]]),
    # the second block's tensors first; both blocks have the same shapes
    ("transformer", [["b1_attn/value/kernel", "b1_attn/value/bias", "b1_ln2/gamma", "b1_ln2/beta"],
                     ["b0_ln1/gamma", "b0_ln1/beta", "b0_attn/query/kernel", "b0_attn/query/bias"]]),
])
def test_dpro_groups_are_applied_and_modelled(profiled, tmp_path, model, groups):
    """examples/tensorflow/hvd_recorder.py --dpro-strategy: each horovod.json group is one
    ``hvd.grouped_allreduce``; the recording names every gradient after its variable and
    Horovod reduced each group as one; the trace optimizes."""
    py, hvdrun = TF_VENV / "bin" / "python", TF_VENV / "bin" / "horovodrun"
    strategy = tmp_path / "s"
    strategy.mkdir()
    (strategy / "horovod.json").write_text(json.dumps({"groups": groups, "HOROVOD_FUSION_THRESHOLD": 64 << 20}))
    env = dict(os.environ)
    env.pop("HOROVOD_TIMELINE", None)
    out = tmp_path / "traces"
    r = subprocess.run([sys.executable, "-m", "dpro.cli", "profile", "-o", str(out), "--warmup", "3", "--steps", "3",
                        "--", str(hvdrun), "-np", "2", "--gloo", "-H", "localhost:2", str(py), str(EXAMPLE),
                        "--model", model, "--steps", "8", "--dpro-strategy", str(strategy)],
                       cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    gt = load_gtrace(out)
    params = [p["name"] for p in json.loads((out / "raw" / "rank0.meta.json").read_text())["params"]]
    from dpro.optimizer.horovod import ran_defaults

    assert all(not ran_defaults(nt) for nt in gt.workers())  # its own groups: not Horovod's default
    assert ran_defaults(load_gtrace(profiled).nodes["worker0"])
    for nt in gt.workers():
        assert nt.meta["horovod_settings"] == {"HOROVOD_FUSION_THRESHOLD": str(64 << 20)}
        assert sorted(t.name for t in nt.tensors) == sorted(params)
        atoms = [set(a["tensors"]) for a in nt.meta["horovod"]["atoms"]]
        for g in groups:
            assert any(set(g) <= a for a in atoms), (g, atoms)
        # each gradient's enqueue op is its group's HorovodGroupedAllreduce node
        enq = {t["gradient"]: t["enqueue_op"] for t in nt.meta["horovod"]["tensors"]}
        assert all(enq[n] == enq[g[0]] and "HorovodGroupedAllreduce" in enq[n] for g in groups for n in g)
    r = subprocess.run([sys.executable, "-m", "dpro.cli", "optimize", str(out), "--budget", "5"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "synchronisation groups" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]


RECORDER_WINDOW = r'''
import os, sys, json
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import tensorflow as tf
import dpro
from models import build
model, ds, loss_fn = build("convnet", 8, seed=0)
opt = tf.keras.optimizers.SGD(0.01)
it = iter(ds)
rec = dpro.Recorder(model, out_dir=sys.argv[1], warmup=2, steps=2)
@tf.function
def train_step(it):
    x, y = next(it)
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss
seen = []
@dpro.profile(rec)
def step():
    float(train_step(it))
for i in range(5):
    step()
    seen.append({"call": i, "collecting": rec._backend.collecting,
                 "written": (Path(sys.argv[1]) / "rank0.json.gz").exists()})
print("STATE " + json.dumps(seen), flush=True)
'''


def _run_recorder_script(script: str, out: Path, **env_set: str) -> list[dict]:
    """Run ``script`` (RECORDER_WINDOW or a variant) in the TF venv, recording into ``out``,
    with the recorder's switches at their defaults but ``env_set``; the STATE it prints."""
    py = TF_VENV / "bin" / "python"
    if not py.is_file():
        pytest.skip(f"{TF_VENV} is not set up (run scripts/setup_tf.sh)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "DPRO_AFTER_STEPS": "20"}
    for k in ("DPRO_DISABLE", "DPRO_TF_COLLECT_IN_WINDOW", "DPRO_TF_DEVICE_TRACER_LEVEL", "DPRO_DEFER_WRITE",
              "DPRO_TF_PRIME_STEPS", "DPRO_TF_PROFILER", "HOROVOD_TIMELINE", "MALLOC_TOP_PAD_",
              "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES"):
        env.pop(k, None)
    env.update(env_set)
    r = subprocess.run([str(py), "-c", script, str(out), str(EXAMPLE.parent)], cwd=REPO,
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(next(line for line in r.stdout.splitlines() if line.startswith("STATE "))[6:])


def test_tf_window_defers_the_export_and_stops_graph_collection(tmp_path):
    """One TF process (no GPU): graph collection stops at the window's start (the warm-up
    collected the step's graphs), the xplane is converted after the window, not in its last
    call, and the graphs are in the rank's file."""
    out = tmp_path / "raw"
    state = _run_recorder_script(RECORDER_WINDOW, out)
    assert [s["collecting"] for s in state] == [True, True, False, False, False]  # window: calls 2, 3
    assert not any(s["written"] for s in state)  # 3 calls after the window < 20: written at exit
    rank = json.loads(gzip.decompress((out / "rank0.json.gz").read_bytes()))
    assert sorted(rank["steps"]) == ["2", "3"] and rank["events"]
    assert any(n["op"] == "MatMul" or "MatMul" in n["op"] for g in rank["graphs"] for n in g)


RECORDER_PRIME = RECORDER_WINDOW.replace(
    'def step():\n    float(train_step(it))',
    'def step():\n    b = rec._backend\n    seen.append({"prime": b._prime_dir is not None, "window": b.active, "kept": b.heap.kept})\n'
    '    float(train_step(it))',
).replace('    seen.append({"call": i, "collecting"', '    seen.append({"after": i, "collecting"').replace(
    'rec = dpro.Recorder(model, out_dir=sys.argv[1], warmup=2, steps=2)',
    'rec = dpro.Recorder(model, out_dir=sys.argv[1], warmup=3, steps=2)')


def test_tf_prime_session_runs_in_the_warmup_only(tmp_path):
    """``DPRO_TF_PRIME_STEPS=1`` (one TF process): a throwaway profiler session over the last
    warm-up call, glibc's heaps kept from its start to the window's end; the window records
    as without it (only its own steps, the graphs collected in the warm-up)."""
    out = tmp_path / "raw"
    state = _run_recorder_script(RECORDER_PRIME, out, DPRO_TF_PRIME_STEPS="1")
    inside = [s for s in state if "prime" in s]  # as each call ran: warm-up 0-2, window 3-4
    assert [s["prime"] for s in inside] == [False, False, True, False, False]
    assert [s["window"] for s in inside] == [False, False, False, True, True]
    assert [s["kept"] for s in inside] == [False, False, True, True, True]
    after = [s for s in state if "after" in s]
    assert [s["collecting"] for s in after] == [True, True, True, False, False]
    rank = json.loads(gzip.decompress((out / "rank0.json.gz").read_bytes()))
    assert sorted(rank["steps"]) == ["3", "4"] and rank["events"]  # nothing of the throwaway session
    assert any("MatMul" in n["op"] for g in rank["graphs"] for n in g)


def test_tf_profiler_switch_off_keeps_the_rest_of_the_recorder(tmp_path):
    """``DPRO_TF_PROFILER=0`` (the #31 diagnostic, one TF process): no throwaway session, no
    window session, no kept heaps, no xplane; the window is still counted, the graphs are
    still collected in the warm-up and the rank's files are written, its trace without events."""
    out = tmp_path / "raw"
    state = _run_recorder_script(RECORDER_PRIME, out, DPRO_TF_PRIME_STEPS="1", DPRO_TF_PROFILER="0")
    inside = [s for s in state if "prime" in s]
    assert len(inside) == 5
    assert not any(s["prime"] or s["window"] or s["kept"] for s in inside)
    after = [s for s in state if "after" in s]
    assert [s["collecting"] for s in after] == [True, True, True, False, False]
    rank = json.loads(gzip.decompress((out / "rank0.json.gz").read_bytes()))
    assert rank["events"] == [] and rank["steps"] == {}
    assert any("MatMul" in n["op"] for g in rank["graphs"] for n in g)
    assert not list(out.glob("*.xplane.pb"))
    meta = json.loads((out / "rank0.meta.json").read_text())
    assert meta["steps"] == [3, 4]
