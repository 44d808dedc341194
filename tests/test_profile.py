"""`dpro profile` + the two-line Recorder on real 2-rank PyTorch DDP (gloo) jobs."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpro.gtrace.io import load_gtrace
from dpro.replayer.replay import replay

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "pytorch" / "ddp_recorder.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dpro_profile(out: Path, *job: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "dpro.cli", "profile", "-o", str(out), *extra, "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_port()), *job]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prof") / "traces"
    r = dpro_profile(out, str(EXAMPLE), "--model", "mlp", "--bucket-cap-mb", "10", "--steps", "14",
                     extra=("--warmup", "4", "--steps", "7"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "recorded 2 rank(s)" in r.stderr
    return out


@pytest.mark.slow
def test_gtrace_complete(profiled):
    gt = load_gtrace(profiled)
    assert gt.manifest.library == "gloo" and gt.manifest.world_size == 2
    assert sorted(nt.info.rank for nt in gt.nodes.values()) == [0, 1]
    # CPU-light (the default on the CPU): step 4 gave the structure, 5-10 the timing
    assert gt.manifest.steps == [5, 6, 7, 8, 9, 10]
    sys.path.insert(0, str(EXAMPLE.parent))
    from models import build

    model, _, _ = build("mlp")
    names = {n for n, _ in model.named_parameters()}
    txns = []
    for nt in gt.nodes.values():
        assert {t.name for t in nt.tensors} == names
        comm = {op.txn: op for op in nt.ops.values() if op.cat == "COMM"}
        for t in nt.tensors:
            assert t.producer in nt.ops and nt.ops[t.producer].cat == "BW"
            assert t.txn in comm, f"{t.name} is carried by no collective"
        # each bucket's bytes = the bytes of its tensors
        for txn, op in comm.items():
            assert op.bytes == sum(t.bytes for t in nt.tensors if t.txn == txn)
            assert op.tensor.startswith("bucket")
        # layers are known for the model's forward and backward ops
        assert {op.layer for op in nt.ops.values() if op.cat == "FW" and op.layer} >= {"0", "2", "4", "6"}
        assert any(op.layer for op in nt.ops.values() if op.cat == "BW")
        txns.append(sorted(comm))
    assert txns[0] == txns[1]  # transaction ids pair the ranks' collectives
    assert sorted(p.name for p in (profiled / "raw").iterdir()) == [
        "rank0.json.gz", "rank0.meta.json", "rank1.json.gz", "rank1.meta.json"]


def test_steps_after_the_window_are_timed(profiled):
    """14 calls, window 4..10: the recorder times the 3 calls after it (the settled
    unprofiled pace, dpro.graph.overhead) and adds them to each rank's meta."""
    from dpro.graph.overhead import measured_overhead

    for nt in load_gtrace(profiled).nodes.values():
        assert len(nt.meta["step_wall_us"]) == 11
        after = nt.meta["step_wall_after_us"]
        assert len(after) == 3 and all(w > 0 for w in after)
        assert measured_overhead(nt) is not None  # 1 settled call: the warm-up's pace
        # CPU over the same calls: the process's, the training thread's (which does the
        # computation: one intra-op thread) and so the collectives' (dpro.replayer.cpu_contention)
        cpu, after_cpu = nt.meta["cpu"], nt.meta["cpu_after_us"]
        assert cpu["threads"] == 1 and cpu["cores"] >= 1 and after_cpu["calls"] == 3
        assert 0 < after_cpu["thread"] < after_cpu["process"] <= cpu["cores"] * sum(after) * 1.05


def test_contention_measured_on_the_real_job(profiled):
    """The optimizer's CPU share of a rank, from the real job: on loopback gloo's threads
    keep a good part of a core busy while a collective runs (measured here: 0.6-0.8)."""
    from dpro.optimizer.job_model import job_model

    res = replay(load_gtrace(profiled))
    m = job_model(load_gtrace(profiled), res.build.link_cost, res.steps)
    assert m.cpu is not None and m.cpu.threads == 1
    assert m.cpu.cores == pytest.approx(len(__import__("os").sched_getaffinity(0)) / 2)
    assert 0.05 < m.cpu.kappa <= m.cpu.cores


@pytest.mark.slow
def test_replay_within_bound(profiled):
    res = replay(load_gtrace(profiled))
    assert res.build.expanded == 2
    assert abs(res.error_pct) <= 10.0, res.to_json()


@pytest.mark.slow
def test_optimize_json_of_a_profiled_job(profiled):
    """`dpro optimize --json` on what `dpro profile` wrote: one JSON document, whatever the
    search found. It used to fail with a traceback when the best strategy fused ops, whose
    estimated times were numpy numbers (the make-demo job)."""
    r = subprocess.run([sys.executable, "-m", "dpro.cli", "optimize", str(profiled), "--json", "--budget", "10"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["best_us"] <= doc["baseline_us"] and doc["speedup"] >= 1.0
    for f in doc["best"]["strategy"]["op_fusion"]:
        assert isinstance(f["dur_us"], float) and f["ops"]


def test_print_json_writes_numpy_numbers(capsys):
    import numpy as np

    from dpro.jsonio import print_json

    print_json({"a": np.float64(1.5), "b": [np.int64(2)], "c": 3})
    assert json.loads(capsys.readouterr().out) == {"a": 1.5, "b": [2], "c": 3}


@pytest.mark.slow
def test_refuses_existing_output_without_force(profiled, tmp_path):
    before = sorted(p.name for p in profiled.iterdir())
    r = subprocess.run([sys.executable, "-m", "dpro.cli", "profile", "-o", str(profiled), "--", "true"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"dpro: error: {profiled}: already exists and is not empty (use --force to replace it)"]
    assert sorted(p.name for p in profiled.iterdir()) == before


def test_unwritable_output(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = subprocess.run([sys.executable, "-m", "dpro.cli", "profile", "-o", str(f / "out"), "--", "true"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and str(f) in r.stderr


def test_step_function_never_called(tmp_path):
    script = tmp_path / "never.py"
    script.write_text(textwrap.dedent("""
        import torch, dpro
        model = torch.nn.Linear(4, 4)
        recorder = dpro.Recorder(model)
        @dpro.profile(recorder)
        def step():
            model(torch.ones(1, 4)).sum().backward()
        print("training done")
    """))
    r = subprocess.run([sys.executable, "-m", "dpro.cli", "profile", "-o", str(tmp_path / "out"), str(script)],
                       capture_output=True, text=True, timeout=120)
    assert "training done" in r.stdout  # the job's output passes through
    assert "ran 0 time(s)" in r.stderr and "nothing was recorded" in r.stderr
    assert "recorded nothing" in r.stderr
    assert r.returncode == 2 and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_job_crashing_mid_window(tmp_path):
    out = tmp_path / "traces"
    r = dpro_profile(out, str(EXAMPLE), "--model", "mlp", "--steps", "14", "--crash-at", "7",
                     extra=("--warmup", "4", "--steps", "7"))
    assert r.returncode != 0  # the job's failure passes through
    assert "the job exited with code" in r.stderr and "recorded 2 rank(s)" in r.stderr
    gt = load_gtrace(out)
    # the complete steps before the crash (CPU-light: 4 the structure, 5 and 6 light, 7 cut short)
    assert gt.manifest.steps == [5, 6]
    assert any("light step 7 left out, the window's last" in n for n in gt.notes)
    assert replay(gt).predicted_iteration_us > 0


def test_nccl_plugin_is_loaded_into_jobs(tmp_path, monkeypatch):
    """`dpro profile` points NCCL at dpro's profiler plugin (built by `make setup`) and its
    output at the recording directory, unless the user chose a plugin."""
    from dpro.profiler.launcher import NCCL_PLUGIN_NAME, nccl_plugin_env, nccl_plugin_library

    lib = tmp_path / NCCL_PLUGIN_NAME
    lib.write_bytes(b"")
    monkeypatch.setenv("DPRO_NCCL_PLUGIN", str(lib))
    assert nccl_plugin_library() == lib
    env: dict[str, str] = {}
    nccl_plugin_env(env, tmp_path / "raw")
    assert env == {"NCCL_PROFILER_PLUGIN": str(lib), "DPRO_NCCL_TRACE_DIR": str((tmp_path / "raw" / "nccl").resolve())}
    env = {"NCCL_PROFILER_PLUGIN": "/their/plugin.so"}
    nccl_plugin_env(env, tmp_path / "raw")
    assert env == {"NCCL_PROFILER_PLUGIN": "/their/plugin.so"}
    monkeypatch.delenv("DPRO_NCCL_PLUGIN")
    built = REPO / "native" / "nccl_patch" / "build" / NCCL_PLUGIN_NAME
    assert nccl_plugin_library() == (built if built.is_file() else None)
