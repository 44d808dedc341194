"""The CPU-light recording (``DPRO_CPU_LIGHT``, ``dpro profile --cpu-light``, issue #31).

The recorder runs the real torch.profiler and hooks on this machine's CPU (one process, and a
real 2-rank gloo DDP job under ``dpro profile``); the import's time map is checked on a small
hand-made structure step with hand-computed results.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpro.contracts.recording import MetaKey
from dpro.gtrace.schema import Event, NodeInfo, NodeTrace, Op
from dpro.importers.kineto.cpu_light import apply_cpu_light, structure_anchors
from dpro.importers.kineto.read import KEvent, RankFile
from dpro.importers.recording import collect

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- recorder

def _record(tmp_path: Path, monkeypatch, rank: int, calls: int = 5) -> dict:
    """One process recording a small model with DPRO_CPU_LIGHT (warm-up 1, window 3)."""
    import dpro

    monkeypatch.setenv("DPRO_CPU_LIGHT", "1")
    monkeypatch.setenv("DPRO_AFTER_STEPS", "0")
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    rec = dpro.Recorder(model, out_dir=str(tmp_path), warmup=1, steps=3)
    step = dpro.profile(rec)(lambda: model(torch.randn(4, 8)).sum().backward())
    for _ in range(calls):
        step()
    rec.close()
    return json.loads((tmp_path / f"rank{rank}.meta.json").read_text())


def test_recorder_profiles_the_first_call_and_times_the_others_by_hooks(tmp_path, monkeypatch):
    meta = _record(tmp_path, monkeypatch, 0)
    info = meta[MetaKey.CPU_LIGHT]
    assert info["structure_step"] == 1 and info["steps"] == [2, 3]
    assert isinstance(info["unix_minus_clock_us"], float)
    for anchors in info["anchors"]:
        names = sorted(a[0] for a in anchors)
        assert names == ["dpro.layer::0", "dpro.layer::1", "dpro.layer::2", "step"]
        step = next(a for a in anchors if a[0] == "step")
        assert all(step[1] <= a[1] <= a[2] <= step[2] for a in anchors)  # inside the call
    d = json.loads(gzip.decompress((tmp_path / "rank0.json.gz").read_bytes()))
    names = [e["name"] for e in d["traceEvents"] if e.get("ph") == "X"]
    assert [n for n in names if n.startswith("ProfilerStep#")] == ["ProfilerStep#1"]  # the profiler: 1 call
    assert len(meta[MetaKey.STEP_WALL_US]) == 4  # every call still timed


@pytest.mark.parametrize("env, memory, horovod, light", [
    (None, False, False, True), (None, True, False, False), (None, False, True, False),
    ("0", False, False, False), ("1", True, True, True)])
def test_on_by_default_on_the_cpu_unless_allocations_are_recorded_or_horovod(tmp_path, monkeypatch, env, memory,
                                                                              horovod, light):
    """Unset, CPU-light is on for a model on the CPU, but not with profile_memory (the memory
    estimates analyse the window's later steps) nor in a Horovod job (HOROVOD_RANK: its waits
    have no anchor); DPRO_CPU_LIGHT decides where set."""
    import dpro

    if horovod:
        monkeypatch.setenv("HOROVOD_RANK", "0")
        monkeypatch.setenv("HOROVOD_SIZE", "1")
    if env is None:
        monkeypatch.delenv("DPRO_CPU_LIGHT", raising=False)
    else:
        monkeypatch.setenv("DPRO_CPU_LIGHT", env)
    monkeypatch.setenv("DPRO_PROFILE_MEMORY", "1" if memory else "0")
    monkeypatch.setenv("DPRO_AFTER_STEPS", "0")
    model = torch.nn.Linear(4, 1)
    rec = dpro.Recorder(model, out_dir=str(tmp_path), warmup=0, steps=2)
    step = dpro.profile(rec)(lambda: model(torch.randn(2, 4)).sum().backward())
    step()
    step()
    rec.close()
    meta = json.loads((tmp_path / "rank0.meta.json").read_text())
    assert (MetaKey.CPU_LIGHT in meta) is light


def test_import_gives_every_rank_its_light_steps(tmp_path, monkeypatch):
    for r in (0, 1):
        _record(tmp_path, monkeypatch, r)
    gt = collect(tmp_path)
    assert gt.manifest.steps == [2, 3]
    assert sum("CPU-light recording: steps [2, 3] timed by the recorder's hooks" in n for n in gt.notes) == 2
    for nt in gt.nodes.values():
        assert sorted(nt.steps) == [2, 3] and {e.step for e in nt.events} == {2, 3}


def test_one_rank_that_does_not_match_keeps_every_rank_on_the_structure_step(tmp_path, monkeypatch):
    for r in (0, 1):
        _record(tmp_path, monkeypatch, r)
    p = tmp_path / "rank1.meta.json"
    meta = json.loads(p.read_text())
    meta[MetaKey.CPU_LIGHT]["anchors"][0].append(["dpro.layer::9", 1.0, 2.0])  # a layer the structure lacks
    p.write_text(json.dumps(meta))
    gt = collect(tmp_path)
    assert gt.manifest.steps == [1]
    assert any("worker1: CPU-light recording not used (light step 2: dpro.layer::9 ran 1 time(s) in a light "
               "step, 0 in the structure step)" in n for n in gt.notes)
    assert not any("CPU-light recording: steps" in n for n in gt.notes)
    for nt in gt.nodes.values():
        assert sorted(nt.steps) == [1]
        assert len(nt.meta[MetaKey.STEP_WALL_US]) == 2  # its profiled pace: the structure call's


# ----------------------------------------------------------------------------- time map

def _structure() -> tuple[NodeTrace, RankFile]:
    """Step 1 spans 1000..1100 µs; layer a 1010..1050; op x 1020..1030 (in a), op y
    1060..1080, an all-reduce c 1070..1090."""
    nt = NodeTrace(info=NodeInfo(name="worker0", role="worker", rank=0, host="h"),
                   ops={"x": Op("x", "x", "FW", "cpu:main"), "y": Op("y", "y", "BW", "cpu:main"),
                        "c": Op("c", "gloo:all_reduce", "COMM", "comm", sub_op="allreduce")})
    nt.steps[1] = (1000.0, 100.0)
    nt.events = [Event("x", 1, 1020.0, 10.0), Event("y", 1, 1060.0, 20.0), Event("c", 1, 1070.0, 20.0)]
    rf = RankFile(path=Path("rank0.json.gz"), rank=0, world_size=1, backend="gloo",
                  events=[KEvent("dpro.layer::a", "cpu_op", 1010.0, 40.0)], meta={"baseTimeNanoseconds": 3_000_000})
    return nt, rf


def _info(anchors: list[list]) -> dict:
    # the hooks' clock: Unix time minus 2000 µs; the trace's base 3000 µs: light time + 2000 - 3000
    return {"structure_step": 1, "steps": [2], "unix_minus_clock_us": 2000.0, "anchors": [anchors]}


def test_structure_anchors():
    nt, rf = _structure()
    assert structure_anchors(nt, rf, 1) == {"step": [(1000.0, 1100.0)], "dpro.layer::a": [(1010.0, 1050.0)],
                                            "comm#0": [(1070.0, 1090.0)]}


def test_ops_scaled_between_the_anchors():
    nt, rf = _structure()
    # light step on the trace's clock: 5000..5200, layer a 5020..5100, comm#0 ends at 5190
    note = apply_cpu_light(nt, rf, _info([["step", 6000, 6200], ["dpro.layer::a", 6020, 6100],
                                          ["comm#0", 6150, 6190]]))
    assert nt.steps == {2: (5000.0, 200.0)}
    got = {e.op: (e.step, e.ts, e.dur) for e in nt.events}
    # x: 1020 -> 5020 + 80 * 10/40 = 5040, 1030 -> 5060; y: 1060 on 1050->5100 .. 1090->5190
    # (slope 2.25) = 5122.5, 1080 -> 5167.5; c: 1070 -> 5145, its end anchored at 5190
    assert got == {"x": (2, 5040.0, 20.0), "y": (2, 5122.5, 45.0), "c": (2, 5145.0, 45.0)}
    assert "steps [2] timed by the recorder's hooks (3 anchors per step)" in note


def test_all_reduce_count_differs_the_anchors_go_without_it():
    nt, rf = _structure()
    note = apply_cpu_light(nt, rf, _info([["step", 6000, 6200], ["dpro.layer::a", 6020, 6100]]))
    got = {e.op: (e.ts, e.dur) for e in nt.events}
    assert got["y"] == (5120.0, 40.0)  # 1060 on 1050->5100 .. 1100->5200 (slope 2)
    assert "the all-reduces' ends not used in 1 step(s)" in note


def test_a_last_light_step_cut_short_is_left_out():
    nt, rf = _structure()
    info = _info([["step", 6000, 6200], ["dpro.layer::a", 6020, 6100]])
    info["steps"], info["anchors"] = [2, 3], info["anchors"] + [[["step", 6300, 6350]]]  # step 3 raised early
    note = apply_cpu_light(nt, rf, info)
    assert sorted(nt.steps) == [2]
    assert "light step 3 left out, the window's last (dpro.layer::a ran 0 time(s)" in note


@pytest.mark.parametrize("info, why", [
    (_info([["step", 6000, 6200]]), "dpro.layer::a ran 0 time(s) in a light step, 1 in the structure step"),
    (_info([["step", 6200, 6000], ["dpro.layer::a", 6020, 6100]]), "is not [name, start, end]"),
    (_info([["step", "a", 6000]]), "is not [name, start, end]"),
    ({"structure_step": 1, "steps": [2, 3], "unix_minus_clock_us": 0.0, "anchors": [[]]}, "of one length"),
    ({"structure_step": 1, "steps": [2], "anchors": [[]]}, "no clock"),
    ({**_info([]), "structure_step": 7}, "the structure step 7 is not among the imported steps [1]"),
])
def test_bad_anchors_say_why_and_leave_the_node_as_it_was(info, why):
    nt, rf = _structure()
    before = (dict(nt.steps), list(nt.events))
    with pytest.raises(ValueError, match=re.escape(why)):
        apply_cpu_light(nt, rf, info)
    assert (nt.steps, nt.events) == before


# ----------------------------------------------------------------------------- a real DDP job

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_real_ddp_job_with_cpu_light(tmp_path):
    """2 gloo ranks under `dpro profile --cpu-light`: each rank's light steps are timed by its
    layer, bucket and all-reduce anchors, and the replay predicts the light steps."""
    out = tmp_path / "trace"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", str(_free_port())]
    cmd = [sys.executable, "-m", "dpro.cli", "profile", "-o", str(out), "--warmup", "2", "--steps", "4",
           "--cpu-light", "--", *torchrun, str(REPO / "examples" / "pytorch" / "ddp_recorder.py"),
           "--model", "mlp", "--batch-size", "16", "--steps", "8", "--bucket-cap-mb", "10"]
    r = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1", DPRO_AFTER_STEPS="2"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    said = r.stdout + r.stderr  # dpro's notes go to stderr
    assert said.count("CPU-light recording: steps [3, 4, 5] timed by the recorder's hooks") == 2, said[-3000:]
    assert "not used" not in said
    meta = json.loads((out / "raw" / "rank0.meta.json").read_text())
    names = {a[0] for a in meta[MetaKey.CPU_LIGHT]["anchors"][0]}
    assert {"step", "dpro.bucket::0", "comm#0", "Optimizer.step#SGD.step"} <= names
    rep = subprocess.run([sys.executable, "-m", "dpro.cli", "replay", str(out), "--json"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    res = json.loads(rep.stdout)
    assert abs(res["error_pct"]) < 25, res
