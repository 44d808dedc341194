"""BytePS trace import (dpro.importers.byteps) on constructed traces.

The BytePS worker cannot be built or run without CUDA, so these traces are CONSTRUCTED:
tests/data/byteps/make_traces.py writes comm.json, server_profile.json and the DEBUG log
lines exactly as BytePS 0.2.5 / ps-lite write them (docs/byteps.md), from a timing model
whose per-step communication span is known (truth.json).  What they cannot show is that
real GPU traces look like the model; see docs/byteps.md, "Unvalidated".
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from dpro.cli_imports import register_import_commands
from dpro.errors import DproInputError
from dpro.gtrace.io import load_gtrace, write_gtrace
from dpro.gtrace.validate import validate
from dpro.importers.byteps import import_byteps
from dpro.replayer.replay import replay
from scriptmod import load_script

make_traces = load_script("make_traces", "tests/data/byteps/make_traces.py")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("byteps") / "traces"
    truth = make_traces.generate(d, machines=2, gpus=2, servers=2, steps=4, start_step=3, seed=0)
    return d, truth


def test_structure_and_pairing(job):
    d, truth = job
    gt = import_byteps(d, start_step=3)
    validate(gt)
    m = gt.manifest
    assert (m.scheme, m.library, m.world_size, m.steps) == ("ps", "byteps", 4, truth["steps"])
    workers = gt.workers()
    assert [w.info.rank for w in workers] == [0, 1, 2, 3]
    assert {w.info.host for w in workers} == {"worker0", "worker1"}
    servers = sorted(n for n, nt in gt.nodes.items() if nt.info.role == "server")
    assert servers == ["server0", "server1"]
    # every partition of every tensor, with its key and byte size, on every GPU
    sizes = {int(k): b for k, b in truth["partition_bytes"].items()}
    for w in workers:
        reduce = {op.id.rsplit("#", 1)[1]: op for op in w.ops.values() if op.name.endswith(".REDUCE")}
        assert {int(k) for k in reduce} == set(sizes)
        assert all(op.bytes == sizes[int(k)] and op.sub_op == "REDUCESCATTER" for k, op in reduce.items())
        assert all(len(op.group) == 2 for op in reduce.values())
    # the root GPU (largest local rank) pushes and pulls; its peers signal it
    root = gt.nodes["worker1"]
    subs = {op.sub_op for op in root.ops.values()}
    assert {"PUSH_REQ", "PULL_RES", "RECV", "SEND"} <= subs
    assert not any(op.sub_op in ("PUSH_REQ", "PULL_RES") for op in gt.nodes["worker0"].ops.values())
    # transaction pairs across nodes: worker push -> server, server answer -> worker pull
    by = {(op.sub_op, op.txn): name for name, nt in gt.nodes.items() for op in nt.ops.values() if op.cat == "COMM"}
    pushes = [t for s, t in by if s == "PUSH_REQ"]
    assert len(pushes) == 2 * truth["partitions"]
    for t in pushes:
        assert by[("PUSH_RES", t)].startswith("server")
        assert ("PULL_REQ", t.replace("push", "pull")) in by
    # stage order within a partition: REDUCE -> COPYD2H -> PUSH -> PULL -> COPYH2D -> BROADCAST
    edges = set(root.edges)
    k = "0"
    t = "Comm.Gradient.layer6.weight"
    chain = [f"{t}.{s}#{k}" for s in ("REDUCE", "COPYD2H", "PUSH", "PULL", "COPYH2D", "BROADCAST")]
    assert all((a, b) in edges for a, b in zip(chain, chain[1:]))
    # events: one per op per step
    for nt in gt.nodes.values():
        assert {e.step for e in nt.events} == set(truth["steps"])


def test_step_inference_without_start_step(job):
    d, truth = job
    gt = import_byteps(d)  # servers profile every sync: the offset is found by time
    assert gt.manifest.steps == truth["steps"]
    assert any("matched to worker steps by time" in n for n in gt.notes)


def test_write_load_and_replay(job, tmp_path):
    d, truth = job
    out = write_gtrace(import_byteps(d, start_step=3), tmp_path / "g")
    gt = load_gtrace(out)
    res = replay(gt)
    span = truth["comm_span_us"]
    # the step marker is the communication span of a step, as the model defines it
    assert res.measured_iteration_us == pytest.approx(span, rel=0.02)
    # the replayed iteration follows the model's dependencies (REDUCE, copies, push, server sum,
    # pull, broadcast); constructed data, so a tight bound
    assert res.predicted_iteration_us == pytest.approx(span, rel=0.05)
    assert res.breakdown_us["COMM"] > 0 and res.breakdown_us["BW"] > 0


def test_replay_with_clock_skew(tmp_path):
    d = tmp_path / "t"
    truth = make_traces.generate(d, machines=3, gpus=2, servers=1, steps=5, start_step=2, skew_us=400.0, seed=3)
    res = replay(import_byteps(d, start_step=2))
    assert res.predicted_iteration_us == pytest.approx(truth["comm_span_us"], rel=0.10)


def test_without_server_profile(tmp_path):
    d = tmp_path / "t"
    truth = make_traces.generate(d, machines=2, gpus=1, servers=1, steps=3, start_step=5, seed=2, with_server=False)
    gt = import_byteps(d)
    validate(gt)
    assert gt.manifest.steps == [0, 1, 2]
    assert all(nt.info.role == "worker" for nt in gt.nodes.values())
    push = [op for nt in gt.nodes.values() for op in nt.ops.values() if op.name.endswith(".PUSH")]
    assert push and all(op.sub_op == "SENDRECV" and op.group == (0, 1) for op in push)
    res = replay(gt)
    assert res.predicted_iteration_us == pytest.approx(truth["comm_span_us"], rel=0.10)


def test_cli_hook(job, tmp_path, run_cli):
    d, _ = job

    @click.group()
    def imp() -> None:
        pass

    register_import_commands(imp)
    out = tmp_path / "g"
    r = CliRunner().invoke(imp, ["byteps", str(d), "-o", str(out), "--start-step", "3"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    code, stdout, _ = run_cli("replay", out, "--json")
    assert code == 0
    assert json.loads(stdout)["predicted_iteration_us"] > 0


def _comm(d: Path) -> Path:
    return d / "worker0" / "0" / "comm.json"


@pytest.mark.parametrize(
    "mutate, problem",
    [
        (lambda p: p.write_text("{\n    \"traceEvents\": [\n{\"ph\": \"X\""), "invalid JSON"),
        (lambda p: p.write_text("{\"traceEvents\": 3}"), "no 'traceEvents' list"),
        (lambda p: p.write_text(json.dumps({"traceEvents": [{"ph": "X", "pid": "x", "name": "x", "ts": 1, "dur": 1, "tid": "total"}]})),
         "expected pid and name 'Comm.<tensor>"),
        (lambda p: p.write_text(json.dumps({"traceEvents": [{"ph": "X", "pid": "Comm.g", "name": "Comm.g.FOO", "ts": 1, "dur": 1, "tid": "7"}]})),
         "does not end in a BytePS stage"),
        (lambda p: p.write_text(json.dumps({"traceEvents": [{"ph": "X", "pid": "Comm.g", "name": "Comm.g.PUSH", "ts": 1, "dur": -5, "tid": "7"}]})),
         "negative duration"),
        (lambda p: p.write_text(json.dumps({"traceEvents": [{"ph": "X", "pid": "Comm.g", "name": "Comm.g.PUSH", "ts": "a", "dur": 5, "tid": "7"}]})),
         "not numbers"),
        (lambda p: p.write_text(json.dumps({"traceEvents": [{"ph": "X", "pid": "Comm.g", "name": "Comm.g.PUSH", "ts": 1, "dur": 5, "tid": "k"}]})),
         "neither 'total' nor a partition key"),
        (lambda p: p.write_text(json.dumps({"traceEvents": [{"ph": "X", "pid": "Comm.g", "name": "Comm.g", "ts": 1, "dur": 5, "tid": "total"}]})),
         "no partition stage events"),
    ],
)
def test_bad_comm_json(tmp_path, mutate, problem):
    d = tmp_path / "t"
    make_traces.generate(d, machines=1, gpus=1, servers=1, steps=2, start_step=2)
    mutate(_comm(d))
    with pytest.raises(DproInputError) as e:
        import_byteps(d)
    assert str(_comm(d)) in str(e.value) and problem in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "tail, problem",
    [
        ("\t\t{\"name\": \"sum-9\", \"ph\": \"B\", \"pid\": 2, \"tid\": 2, \"ts\": 5},\n\t\t{\"name\": \"push-9\", \"ph\": \"B\", \"pid\": 2, \"tid\": 2, \"ts\": 5}",
         "expected name 'push-<sender>'"),
        ("\t\t{\"name\": \"push-9\", \"ph\": \"E\", \"pid\": 99, \"tid\": 99, \"ts\": 5},\n\t\t{\"name\": \"push-9\", \"ph\": \"B\", \"pid\": 2, \"tid\": 2, \"ts\": 5}",
         "without a begin"),
    ],
)
def test_bad_server_profile(tmp_path, tail, problem):
    d = tmp_path / "t"
    make_traces.generate(d, machines=1, gpus=1, servers=1, steps=2, start_step=2)
    p = d / "server0" / "server_profile.json"
    p.write_text("{\n\t\"traceEvents\": [\n" + tail)
    with pytest.raises(DproInputError) as e:
        import_byteps(d)
    assert str(p) in str(e.value) and problem in str(e.value)


def test_server_of_another_job(tmp_path):
    d = tmp_path / "t"
    make_traces.generate(d, machines=1, gpus=1, servers=1, steps=2, start_step=2)
    p = d / "server0" / "server_profile.json"
    p.write_text("{\"traceEvents\": [{\"name\": \"push-9\", \"ph\": \"B\", \"pid\": 123456789, \"tid\": 1, \"ts\": 5}]}")
    with pytest.raises(DproInputError, match="match no partition key"):
        import_byteps(d)


def test_not_a_byteps_dir(tmp_path):
    with pytest.raises(DproInputError, match="no BytePS comm.json"):
        import_byteps(tmp_path)
    with pytest.raises(DproInputError, match="no such file"):
        import_byteps(tmp_path / "missing")
    with pytest.raises(DproInputError, match="at least 1"):
        make_traces.generate(tmp_path / "t", machines=1, gpus=1, servers=1, steps=2, start_step=2)
        import_byteps(tmp_path / "t", start_step=0)
