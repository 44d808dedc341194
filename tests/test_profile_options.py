"""What the recorder records beyond op identity, order and durations: opt-in shapes and
allocations (``DPRO_RECORD_SHAPES`` / ``DPRO_PROFILE_MEMORY``, ``dpro profile --shapes
--memory``), checked on real single-process torch.profiler recordings."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpro.profiler.config import DEFAULT_PROFILE_MEMORY, DEFAULT_RECORD_SHAPES, RecordConfig

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("value,want", [("1", True), ("yes", True), ("0", False), ("false", False)])
def test_env_switches(monkeypatch, value, want):
    monkeypatch.setenv("DPRO_RECORD_SHAPES", value)
    monkeypatch.setenv("DPRO_PROFILE_MEMORY", value)
    c = RecordConfig.resolve("out", None, None)
    assert (c.record_shapes, c.profile_memory, c.enabled) == (want, want, True)


def test_defaults_and_bad_value(monkeypatch):
    monkeypatch.delenv("DPRO_RECORD_SHAPES", raising=False)
    monkeypatch.delenv("DPRO_PROFILE_MEMORY", raising=False)
    c = RecordConfig.resolve("out", None, None)
    assert (c.record_shapes, c.profile_memory) == (DEFAULT_RECORD_SHAPES, DEFAULT_PROFILE_MEMORY)
    monkeypatch.setenv("DPRO_PROFILE_MEMORY", "maybe")
    c = RecordConfig.resolve("out", None, None)
    assert not c.enabled and "DPRO_PROFILE_MEMORY" in (c.problem or "")


@pytest.mark.parametrize("var,attr,unset", [("DPRO_CUDA_LIGHT", "cuda_light", False),
                                             ("DPRO_SHALLOW_RANKS", "shallow_ranks", None)])
def test_opt_in_switches(monkeypatch, var, attr, unset):
    """Off (CUDA-light) or decided by the recorder (shallow ranks: None) unless set; 0 is off;
    a value that is not a yes/no turns recording off with the reason."""
    monkeypatch.delenv(var, raising=False)
    assert getattr(RecordConfig.resolve("o", None, None), attr) is unset
    monkeypatch.setenv(var, "0")
    assert getattr(RecordConfig.resolve("o", None, None), attr) is False
    monkeypatch.setenv(var, "1")
    assert getattr(RecordConfig.resolve("o", None, None), attr) is True
    monkeypatch.setenv(var, "perhaps")
    c = RecordConfig.resolve("o", None, None)
    assert not c.enabled and var in (c.problem or "")


JOB = textwrap.dedent("""
    import sys, torch, dpro
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 64)
    rec = dpro.Recorder(model, out_dir=sys.argv[1], warmup=1, steps=2)
    @dpro.profile(rec)
    def step():
        opt.zero_grad(); model(x).sum().backward(); opt.step()
    for _ in range(4):
        step()
""")


def _record(tmp_path: Path, shapes: str, memory: str) -> list[dict]:
    pytest.importorskip("torch")
    out = tmp_path / f"s{shapes}m{memory}"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "DPRO_RECORD_SHAPES": shapes,
           "DPRO_PROFILE_MEMORY": memory, "DPRO_AFTER_STEPS": "0"}
    r = subprocess.run([sys.executable, "-c", JOB, str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    with gzip.open(out / "rank0.json.gz", "rt") as f:
        return json.load(f)["traceEvents"]


@pytest.mark.parametrize("shapes,memory", [("0", "0"), ("1", "1")])
def test_recorded_events_follow_the_switches(tmp_path, shapes, memory):
    evs = _record(tmp_path, shapes, memory)
    names = {e.get("name") for e in evs}
    # what the replay needs is there either way: ops, layers, steps
    assert "aten::addmm" in names and "dpro.layer::0" in names and "ProfilerStep#1" in names
    has_dims = any("Input Dims" in (e.get("args") or {}) for e in evs)
    assert has_dims == (shapes == "1")
    assert ("[memory]" in names) == (memory == "1")


def test_cli_passes_the_switches(tmp_path):
    probe = tmp_path / "env.json"
    code = ("import json, os, sys; json.dump({k: os.environ.get(k) for k in "
            "('DPRO_RECORD_SHAPES', 'DPRO_PROFILE_MEMORY')}, open(sys.argv[1], 'w'))")
    for flags, want in ((["--shapes", "--no-memory"], ["1", "0"]), ([], [None, None])):
        r = subprocess.run([sys.executable, "-m", "dpro.cli", "profile", "-o", str(tmp_path / "t"), *flags, "--",
                            sys.executable, "-c", code, str(probe)], cwd=REPO, capture_output=True, text=True,
                           timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
        assert r.returncode == 2, r.stderr  # nothing recorded: the job has no Recorder
        assert list(json.loads(probe.read_text()).values()) == want


def test_tf_host_tracer_level_and_deferred_write(monkeypatch):
    monkeypatch.setenv("DPRO_TF_HOST_TRACER_LEVEL", "1")
    monkeypatch.setenv("DPRO_DEFER_WRITE", "0")
    c = RecordConfig.resolve("out", None, None)
    assert (c.tf_host_tracer_level, c.defer_write, c.enabled) == (1, False, True)
    monkeypatch.setenv("DPRO_TF_HOST_TRACER_LEVEL", "5")
    c = RecordConfig.resolve("out", None, None)
    assert not c.enabled and "DPRO_TF_HOST_TRACER_LEVEL=5" in (c.problem or "")


def test_tf_prime_steps(monkeypatch):
    monkeypatch.delenv("DPRO_TF_PRIME_STEPS", raising=False)
    assert RecordConfig.resolve("out", None, None).tf_prime_steps == 4
    monkeypatch.setenv("DPRO_TF_PRIME_STEPS", "0")
    assert RecordConfig.resolve("out", None, None).tf_prime_steps == 0
    monkeypatch.setenv("DPRO_TF_PRIME_STEPS", "-1")
    c = RecordConfig.resolve("out", None, None)
    assert not c.enabled and "DPRO_TF_PRIME_STEPS=-1" in (c.problem or "")


def test_trace_written_after_the_window_not_in_it(tmp_path):
    """Deferred (default): the rank's files appear once the calls after the window are timed
    (here: at exit), with the after-window walls in the meta; DPRO_DEFER_WRITE=0: the same files."""
    pytest.importorskip("torch")
    for defer in ("1", "0"):
        out = tmp_path / f"d{defer}"
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "DPRO_DEFER_WRITE": defer}
        r = subprocess.run([sys.executable, "-c", JOB, str(out)], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        meta = json.loads((out / "rank0.meta.json").read_text())
        assert meta["steps"] == [1, 2] and len(meta["step_wall_after_us"]) == 1
        assert (out / "rank0.json.gz").stat().st_size > 0


def test_layer_ranges_are_exported_as_annotations(tmp_path):
    """The recorder opens its layer ranges with torch's C++ range (cheaper than
    record_function), which torch exports as cpu_op; the trace it writes calls them
    user_annotation, as record_function does, so that the importer reads them as layers and
    not as ops. A real torch.profiler export, relabelled by copy_trace."""
    import gzip
    import json

    import pytest
    import torch
    from torch.profiler import ProfilerActivity, profile

    from dpro.contracts.recording import LAYER_PREFIX
    from dpro.profiler.pytorch.backend import copy_trace, fast_range

    fast = fast_range()
    if fast is None:
        pytest.skip("this torch has no _RecordFunctionFast")
    lin, x = torch.nn.Linear(4, 4), torch.ones(2, 4)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with fast(LAYER_PREFIX + "fc"):
            lin(x)
    raw = tmp_path / "raw.json"
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as fin, gzip.open(tmp_path / "t.json.gz", "wb") as fout:
        assert copy_trace(fin, fout, True) == 1
    events = json.loads(gzip.open(tmp_path / "t.json.gz").read())["traceEvents"]
    layer = [e for e in events if e.get("name") == LAYER_PREFIX + "fc"]
    assert [e["cat"] for e in layer] == ["user_annotation"]
    assert any(e.get("name") == "aten::linear" and e["cat"] == "cpu_op" for e in events)
    # without relabel the copy is byte for byte
    with raw.open("rb") as fin, (tmp_path / "same.json").open("wb") as fout:
        assert copy_trace(fin, fout, False) == 0
    assert (tmp_path / "same.json").read_bytes() == raw.read_bytes()


@pytest.mark.parametrize("flag,value", [("--shallow-ranks", "1"), ("--no-shallow-ranks", "0"), (None, "unset")])
def test_profile_shallow_ranks_flag_reaches_the_job(tmp_path, flag, value):
    """`dpro profile --shallow-ranks / --no-shallow-ranks` sets DPRO_SHALLOW_RANKS for the job;
    without either the job decides (the variable stays unset)."""
    seen = tmp_path / "seen"
    job = [sys.executable, "-c", f"import os; open({str(seen)!r}, 'w').write(os.environ.get('DPRO_SHALLOW_RANKS', 'unset'))"]
    env = {k: v for k, v in os.environ.items() if k != "DPRO_SHALLOW_RANKS"}
    cmd = [sys.executable, "-m", "dpro.cli", "profile", "-o", str(tmp_path / "out"), *([flag] if flag else []), "--", *job]
    subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)  # records nothing: exit 2, said
    assert seen.read_text() == value

