"""Shallow ranks (``DPRO_SHALLOW_RANKS``, experimental, issue #31): ranks other than 0 record
the window's first call only; the importer gives them rank 0's later steps.

The recorder runs the real torch.profiler on CPU, one process, its rank from ``RANK``; the
import is checked on hand-made traces with hand-computed results.
"""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from dpro.contracts.recording import MetaKey
from dpro.gtrace.schema import Event, GTrace, Manifest, NodeInfo, NodeTrace, Op
from dpro.importers.recording.shallow import fill_shallow_steps


def _record(tmp_path, monkeypatch, rank: int) -> tuple[dict, list[str]]:
    import dpro

    monkeypatch.setenv("DPRO_SHALLOW_RANKS", "1")
    monkeypatch.setenv("DPRO_CPU_LIGHT", "0")  # the full window: shallow ranks are what is tested
    monkeypatch.setenv("DPRO_AFTER_STEPS", "0")
    monkeypatch.setenv("RANK", str(rank))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    rec = dpro.Recorder(model, out_dir=str(tmp_path), warmup=1, steps=3)
    step = dpro.profile(rec)(lambda: model(torch.randn(4, 8)).sum().backward())
    for _ in range(5):
        step()
    rec.close()
    meta = json.loads((tmp_path / f"rank{rank}.meta.json").read_text())
    d = json.loads(gzip.decompress((tmp_path / f"rank{rank}.json.gz").read_bytes()))
    return meta, [e["name"] for e in d["traceEvents"] if e.get("ph") == "X"]


def test_shallow_rank_records_the_first_call_only(tmp_path, monkeypatch):
    meta, names = _record(tmp_path, monkeypatch, 1)
    assert meta[MetaKey.SHALLOW] == {"deep_steps": [1]}
    assert [n for n in names if n.startswith("ProfilerStep#")] == ["ProfilerStep#1"]
    assert any(n.startswith("dpro.layer::") for n in names)  # the structure: layers recorded in that call
    assert len(meta[MetaKey.STEP_WALL_US]) == 4  # every call still timed


def test_rank0_records_the_whole_window(tmp_path, monkeypatch):
    meta, names = _record(tmp_path, monkeypatch, 0)
    assert MetaKey.SHALLOW not in meta
    assert sorted(n for n in names if n.startswith("ProfilerStep#")) == ["ProfilerStep#1", "ProfilerStep#2",
                                                                        "ProfilerStep#3"]


# ----------------------------------------------------------------------------- import

def _node(rank: int, steps: dict[int, float], ops: tuple[str, ...] = ("a", "b")) -> NodeTrace:
    """A node whose step s starts at ``steps[s]`` and lasts 100 µs; op i of it starts 10 * (i + 1)
    µs in and lasts 5 + rank µs."""
    nt = NodeTrace(info=NodeInfo(name=f"worker{rank}", role="worker", rank=rank, host="h"),
                   ops={o: Op(o, o, "FW", "cpu:main") for o in ops})
    for s, t0 in steps.items():
        nt.steps[s] = (t0, 100.0)
        nt.events += [Event(o, s, t0 + 10.0 * (i + 1), 5.0 + rank) for i, o in enumerate(ops)]
    return nt


def _gtrace(*nodes: NodeTrace) -> GTrace:
    common = sorted(set.intersection(*(set(nt.steps) for nt in nodes)))
    man = Manifest(framework="pytorch", scheme="allreduce", library="gloo", world_size=len(nodes),
                   nodes=[nt.info for nt in nodes], steps=common)
    return GTrace(manifest=man, nodes={nt.info.name: nt for nt in nodes})


SHALLOW = {MetaKey.SHALLOW: {"deep_steps": [3]}}


def test_shallow_rank_gets_rank0s_later_steps_shifted():
    r0 = _node(0, {3: 1000.0, 4: 1200.0, 5: 1350.0})
    r1 = _node(1, {3: 1030.0})  # its clock 30 µs ahead of rank 0's in the shared step
    gt = _gtrace(r0, r1)
    fill_shallow_steps(gt, {0: {}, 1: SHALLOW})
    assert gt.manifest.steps == [3, 4, 5]
    assert r1.steps == {3: (1030.0, 100.0), 4: (1230.0, 100.0), 5: (1380.0, 100.0)}
    later = sorted((e.step, e.op, e.ts, e.dur) for e in r1.events if e.step > 3)
    assert later == [(4, "a", 1240.0, 5.0), (4, "b", 1250.0, 5.0), (5, "a", 1390.0, 5.0), (5, "b", 1400.0, 5.0)]
    assert [(e.ts, e.dur) for e in r1.events if e.step == 3] == [(1040.0, 6.0), (1050.0, 6.0)]  # its own
    assert len(r0.events) == 6  # rank 0 untouched
    assert any("worker1: shallow rank" in n and "[4, 5]" in n for n in gt.notes)


@pytest.mark.parametrize("r1, metas, why", [
    (_node(1, {3: 0.0}, ("a", "b", "c")), {0: {}, 1: SHALLOW}, "ops differ"),
    (_node(1, {3: 0.0}), {0: SHALLOW, 1: SHALLOW}, "no rank 0"),
    (_node(1, {2: 0.0}), {0: {}, 1: SHALLOW}, "no step recorded by both"),
])
def test_mismatch_keeps_the_common_steps_with_a_note(r1, metas, why):
    r0 = _node(0, {3: 1000.0, 4: 1200.0})
    gt = _gtrace(r0, r1)
    unfilled = fill_shallow_steps(gt, metas)
    assert unfilled and all(why in u for u in unfilled)  # collect refuses when no common step is left
    assert set(r1.steps) == {next(iter(r1.steps))}
    assert gt.manifest.steps == sorted(set(r0.steps) & set(r1.steps))
    assert any(why in n for n in gt.notes)


def test_different_op_counts_in_the_shared_step_refused():
    r0, r1 = _node(0, {3: 0.0, 4: 200.0}), _node(1, {3: 0.0})
    r1.events.append(Event("a", 3, 60.0, 1.0))  # "a" ran twice on rank 1
    gt = _gtrace(r0, r1)
    fill_shallow_steps(gt, {0: {}, 1: SHALLOW})
    assert gt.manifest.steps == [3]
    assert any("1 ops ran a different number of times" in n for n in gt.notes)


def test_no_shallow_rank_changes_nothing():
    r0, r1 = _node(0, {3: 0.0, 4: 200.0}), _node(1, {3: 0.0, 4: 210.0})
    gt = _gtrace(r0, r1)
    assert fill_shallow_steps(gt, {0: {}, 1: {}}) == []
    assert gt.manifest.steps == [3, 4] and not gt.notes and len(r1.events) == 4


# ----------------------------------------------------------------------------- end to end

@pytest.mark.slow
def test_ddp_job_with_shallow_ranks(tmp_path, monkeypatch):
    """`dpro profile` of a 2-rank DDP job: rank 1 records one call, the gTrace has the whole
    window on both ranks (rank 1's later steps rank 0's), and the replay runs on it."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from dpro.gtrace.io import load_gtrace
    from dpro.replayer.replay import replay

    repo = Path(__file__).resolve().parents[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("DPRO_SHALLOW_RANKS", "1")
    monkeypatch.setenv("DPRO_CPU_LIGHT", "0")  # the full window: shallow ranks are what is tested
    out = tmp_path / "traces"
    r = subprocess.run([sys.executable, "-m", "dpro.cli", "profile", "-o", str(out), "--warmup", "2", "--steps", "3",
                        "--", sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_addr", "127.0.0.1", "--master_port", str(port),
                        str(repo / "examples" / "pytorch" / "ddp_recorder.py"), "--model", "mlp", "--steps", "7"],
                       cwd=repo, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    meta1 = json.loads((out / "raw" / "rank1.meta.json").read_text())
    assert meta1[MetaKey.SHALLOW] == {"deep_steps": [2]}
    assert MetaKey.SHALLOW not in json.loads((out / "raw" / "rank0.meta.json").read_text())
    gt = load_gtrace(out)
    assert gt.manifest.steps == [2, 3, 4]
    w0, w1 = gt.workers()
    assert w1.steps[4][1] == w0.steps[4][1] and w1.steps[2][1] != w0.steps[2][1]
    res = replay(gt)
    assert res.predicted_iteration_us > 0 and abs(res.error_pct) <= 25.0, res.to_json()


def _first(nt: NodeTrace, step: int, start: float, end: float, ops=("/a", "/b")) -> NodeTrace:
    nt.first_step = {"step": step, "start": start, "end": end, "cpu_ops": sorted(ops)}
    return nt


def test_first_step_left_out_by_rank0_takes_its_whole_dfg():
    """On a GPU rank 0 leaves out the profiler's first step (another structure), the only one a
    shallow rank records: the shallow rank then takes rank 0's DFG and kept steps, shifted by
    the difference of the first step's ends (its start waited 50 µs on rank 1)."""
    r0 = _first(_node(0, {4: 1200.0, 5: 1350.0}), 3, 1000.0, 1100.0)
    r0.edges = [("a", "b")]
    r1 = _first(_node(1, {3: 980.0}, ("a", "b", "c")), 3, 980.0, 1130.0)  # its own step: an extra op
    gt = _gtrace(r0, r1)
    assert fill_shallow_steps(gt, {0: {}, 1: SHALLOW}) == []
    assert gt.manifest.steps == [4, 5]
    assert set(r1.ops) == {"a", "b"} and r1.edges == [("a", "b")] and r1.ops["a"] is not r0.ops["a"]
    assert r1.steps == {4: (1230.0, 100.0), 5: (1380.0, 100.0)}
    assert sorted((e.step, e.op, e.ts, e.dur) for e in r1.events)[:2] == [(4, "a", 1240.0, 5.0), (4, "b", 1250.0, 5.0)]
    assert any("worker0 left out the step it recorded ([3]" in n and "shifted by 30 µs" in n for n in gt.notes)


def test_first_steps_with_other_operators_refused():
    r0 = _first(_node(0, {4: 1200.0}), 3, 1000.0, 1100.0)
    r1 = _first(_node(1, {3: 980.0}), 3, 980.0, 1130.0, ops=("/a", "/other"))
    gt = _gtrace(r0, r1)
    unfilled = fill_shallow_steps(gt, {0: {}, 1: SHALLOW})
    assert unfilled and "first profiled steps ran different operators" in unfilled[0]
    assert gt.manifest.steps == []
