"""Horovod timeline parser: a real 2-rank Horovod (gloo) job, and hand-written snippets.

The real job runs examples/pytorch/train_horovod.py under ``horovodrun -np 2 --gloo``
(about 10 s); it is skipped when ``horovod.torch`` is not importable (build it with
``scripts/install_horovod.sh``).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hvd_util import horovod_skip_reason, horovodrun

from dpro.errors import DproInputError
from dpro.importers.horovod.timeline import (
    HorovodTimeline,
    TensorOp,
    load_horovod_timeline,
    parse_horovod_timeline,
)

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "pytorch" / "train_horovod.py"
STEPS, WARMUP, ACTIVE = 5, 2, 2


# ------------------------------------------------------------------------------ real job


def _check_op_intervals(op: TensorOp) -> None:
    """Phases non-negative, negotiation first, activities inside the execution, in order."""
    for p in op.phases:
        assert p.dur_us >= 0, (op.tensor, p)
    neg = op.negotiation
    acts = [p for p in op.phases if p is not neg]
    assert op.exec_start_us is not None and op.exec_end_us is not None
    assert op.exec_start_us <= op.exec_end_us
    if neg is not None:
        assert op.phases[0] is neg and neg.end_us <= op.exec_start_us
    prev = op.exec_start_us
    for p in acts:
        assert prev <= p.start_us, (op.tensor, op.phases)
        prev = p.end_us
    assert prev <= op.exec_end_us


@pytest.fixture(scope="module")
def hvd_job(tmp_path_factory) -> Path:
    reason = horovod_skip_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("hvd")
    cmd = [
        horovodrun(), "-np", "2", "--gloo", "-H", "localhost:2",
        "--timeline-filename", str(out / "timeline.json"),
        sys.executable, str(TRAIN), "--model", "mlp", "--batch-size", "16",
        "--steps", str(STEPS), "--warmup", str(WARMUP), "--active", str(ACTIVE),
        "--profile-dir", str(out / "prof"), "--timing-out", str(out / "timing_rank{rank}.json"),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return out


def _grad_names() -> list[str]:
    sys.path.insert(0, str(TRAIN.parent))
    from models import build

    model, _, _ = build("mlp")
    return [f"allreduce.{n}" for n, p in model.named_parameters() if p.requires_grad]


@pytest.mark.slow
def test_real_timeline(hvd_job: Path) -> None:
    tl = load_horovod_timeline(hvd_job / "timeline.json")
    assert not tl.truncated
    assert tl.start_epoch_us is not None and tl.start_epoch_us > 1_500_000_000 * 10**6
    grads = _grad_names()
    assert set(grads) <= set(tl.tensors), f"missing: {set(grads) - set(tl.tensors)}"
    assert len({tl.pids[t] for t in tl.tensors}) == len(tl.tensors) and 0 not in tl.pids.values()
    for t in grads:
        ops = tl.tensors[t]
        assert len(ops) == STEPS, (t, len(ops))
        for k, op in enumerate(ops):
            assert op.tensor == t and op.kind == "ALLREDUCE" and op.index == k
            assert op.comm is not None and op.comm.name == "GLOO_ALLREDUCE"
            assert op.dtype == "float32" and op.size_bytes and op.size_bytes > 0
            _check_op_intervals(op)
        for a, b in zip(ops, ops[1:]):
            assert a.end_us <= b.start_us
    # the broadcast of the initial weights is there too
    assert any(t.startswith("broadcast.") and ops[0].kind == "BROADCAST" for t, ops in tl.tensors.items())

    # fusion groups: every gradient all-reduce is in exactly one group; together they cover all
    seen: set[int] = set()
    for g in tl.fusion_groups:
        assert g.ops and len(set(g.tensors)) == len(g.tensors)
        for op in g.ops:
            assert op.fusion_group == g.index and id(op) not in seen
            seen.add(id(op))
        comms = [op.comm for op in g.ops if op.comm is not None]
        assert max(c.start_us for c in comms) <= min(c.end_us for c in comms)  # one fused transfer
    grad_ops = [op for t in grads for op in tl.tensors[t]]
    assert all(id(op) in seen for op in grad_ops)
    assert {t for g in tl.fusion_groups if g.kind == "ALLREDUCE" for t in g.tensors} == set(grads)
    assert sum(g.size_bytes for g in tl.fusion_groups if g.kind == "ALLREDUCE") == sum(
        op.size_bytes for op in grad_ops)
    assert any(len(g.ops) > 1 for g in tl.fusion_groups), "expected some fused all-reduces"


@pytest.mark.slow
def test_real_timeline_clock(hvd_job: Path) -> None:
    """Timeline ts + start_epoch_us lands each step's all-reduces inside that step, both in
    the script's own step timing (time.time) and in rank 0's torch.profiler trace."""
    tl = load_horovod_timeline(hvd_job / "timeline.json")
    grads = _grad_names()
    grad_ops = [op for t in grads for op in tl.tensors[t]]

    timing = json.loads((hvd_job / "timing_rank0.json").read_text())
    bounds = timing["step_start_epoch_us"]
    assert len(bounds) == STEPS - WARMUP + 1
    for a, b in zip(bounds, bounds[1:]):
        inside = [op.tensor for op in grad_ops if a <= tl.to_epoch_us(op.exec_start_us) < b]
        assert sorted(inside) == sorted(grads)

    trace = json.loads(gzip.decompress((hvd_job / "prof" / "rank0.json.gz").read_bytes()))
    off = tl.offset_to_kineto_us(trace["baseTimeNanoseconds"])
    steps = [e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert len(steps) == ACTIVE
    for s in steps:
        a, b = s["ts"], s["ts"] + s["dur"]
        inside = [op.tensor for op in grad_ops if a <= op.exec_start_us + off and op.exec_end_us + off <= b]
        assert sorted(inside) == sorted(grads), s["name"]


# ------------------------------------------------------------------------------ snippets

T0 = 1_700_000_000_000_000


def _meta(pid: int, name: str) -> str:
    return (f'{{"name": "process_name", "ph": "M", "pid": {pid}, "args": {{"name": "{name}"}}}},\n'
            f'{{"name": "process_sort_index", "ph": "M", "pid": {pid}, "args": {{"sort_index": {pid}}}}},\n')


def _ev(ph: str, ts: int, pid: int, name: str | None = None, args: str | None = None) -> str:
    s = f'{{"ph": "{ph}"'
    if name is not None:
        s += f', "name": "{name}"'
    s += f', "ts": {ts}, "pid": {pid}'
    if ph == "X":
        s += ', "dur": 0'
    if args:
        s += f', "args": {{{args}}}'
    return s + "},"


def _snippet() -> str:
    """A small timeline in Horovod's exact layout: metadata lines, events run together."""
    s = "[\n"
    s += (f'{{"name": "process_name", "ph": "M", "pid": 0, "args": {{"start_time_since_epoch_in_micros":{T0}}}}},\n'
          '{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},\n')
    # two gradients negotiated (first step: rank-ready X records), then fused
    s += _meta(1, "allreduce.fc.bias") + _ev("B", 100, 1, "NEGOTIATE_ALLREDUCE") + _ev("X", 101, 1, "1")
    s += _meta(2, "allreduce.fc.weight") + _ev("B", 102, 2, "NEGOTIATE_ALLREDUCE") + _ev("X", 102, 2, "1")
    s += _ev("X", 150, 1, "0") + _ev("E", 150, 1) + _ev("X", 151, 2, "0") + _ev("E", 151, 2)
    s += _ev("B", 160, 1, "ALLREDUCE") + _ev("B", 160, 2, "ALLREDUCE")
    for name, b, e in (("MEMCPY_IN_FUSION_BUFFER", 161, 170), ("GLOO_ALLREDUCE", 171, 300),
                       ("MEMCPY_OUT_FUSION_BUFFER", 302, 310)):
        s += _ev("B", b, 1, name) + _ev("B", b, 2, name) + _ev("E", e, 1) + _ev("E", e + 1, 2)
    s += _ev("E", 312, 1, args='"dtype": "float32", "shape": "[16]"')
    s += _ev("E", 313, 2, args='"dtype": "float32", "shape": "[16, 8]"')
    # one gradient alone: no fusion buffer
    s += _meta(3, "allreduce.emb.weight") + _ev("B", 320, 3, "NEGOTIATE_ALLREDUCE") + _ev("E", 400, 3)
    s += _ev("B", 410, 3, "ALLREDUCE") + _ev("B", 411, 3, "GLOO_ALLREDUCE") + _ev("E", 500, 3)
    s += _ev("E", 501, 3, args='"dtype": "float16", "shape": "[100, 4]"')
    # a barrier: negotiated, no 'B BARRIER', but an 'E'
    s += _meta(4, "barrier.noname") + _ev("B", 600, 4, "NEGOTIATE_BARRIER") + _ev("X", 600, 4, "1")
    s += _ev("X", 610, 4, "0") + _ev("E", 610, 4) + _ev("E", 620, 4)
    # second step of emb.weight (cached: no X), still running when the file ends
    s += _ev("B", 700, 3, "NEGOTIATE_ALLREDUCE") + _ev("E", 710, 3) + _ev("B", 720, 3, "ALLREDUCE")
    s += _ev("B", 721, 3, "GLOO_ALLREDUCE")
    return s[:-1] + "]"


def _check_snippet(tl: HorovodTimeline) -> None:
    assert tl.start_epoch_us == T0 and tl.to_epoch_us(100) == T0 + 100
    assert tl.offset_to_kineto_us(T0 * 1000 - 5_000_000) == 5000.0
    assert tl.pids == {"allreduce.fc.bias": 1, "allreduce.fc.weight": 2, "allreduce.emb.weight": 3,
                       "barrier.noname": 4}
    bias, = tl.tensors["allreduce.fc.bias"]
    assert [(p.name, p.start_us, p.end_us) for p in bias.phases] == [
        ("NEGOTIATE_ALLREDUCE", 100, 150), ("MEMCPY_IN_FUSION_BUFFER", 161, 170),
        ("GLOO_ALLREDUCE", 171, 300), ("MEMCPY_OUT_FUSION_BUFFER", 302, 310)]
    assert (bias.exec_start_us, bias.exec_end_us, bias.start_us, bias.end_us) == (160, 312, 100, 312)
    assert bias.rank_ready_us == {1: 101, 0: 150}
    assert bias.dtype == "float32" and bias.shape == (16,) and bias.size_bytes == 64
    emb, = tl.tensors["allreduce.emb.weight"]
    assert [p.name for p in emb.phases] == ["NEGOTIATE_ALLREDUCE", "GLOO_ALLREDUCE"]
    assert emb.size_bytes == 800 and emb.rank_ready_us == {}
    barrier, = tl.tensors["barrier.noname"]
    assert barrier.kind == "BARRIER" and barrier.exec_start_us is None and barrier.exec_end_us == 620
    assert barrier.fusion_group is None and barrier.rank_ready_us == {1: 600, 0: 610}
    g0, g1 = tl.fusion_groups
    assert g0.tensors == ["allreduce.fc.bias", "allreduce.fc.weight"] and g0.kind == "ALLREDUCE"
    assert g0.comm_name == "GLOO_ALLREDUCE" and (g0.comm_start_us, g0.comm_end_us) == (171, 301)
    assert g0.size_bytes == 64 + 512 and (g0.exec_start_us, g0.exec_end_us) == (160, 313)
    assert g1.tensors == ["allreduce.emb.weight"] and g1.size_bytes == 800
    assert bias.fusion_group == 0 and emb.fusion_group == 1
    assert ("allreduce.emb.weight", "ALLREDUCE", 720) in tl.unfinished


def test_snippet(tmp_path: Path) -> None:
    f = tmp_path / "timeline.json"
    f.write_text(_snippet())
    tl = load_horovod_timeline(f)
    assert not tl.truncated
    _check_snippet(tl)


def test_snippet_gzip(tmp_path: Path) -> None:
    f = tmp_path / "timeline.json.gz"
    f.write_bytes(gzip.compress(_snippet().encode()))
    _check_snippet(load_horovod_timeline(f))


@pytest.mark.parametrize("tail", ["", ",", ",\n", "  \n"])
def test_missing_closing_bracket(tmp_path: Path, tail: str) -> None:
    f = tmp_path / "timeline.json"
    f.write_text(_snippet()[:-1] + tail)
    tl = load_horovod_timeline(f)
    assert tl.truncated
    _check_snippet(tl)


def test_truncated_last_record(tmp_path: Path) -> None:
    s = _snippet()
    cut = s.rindex('{"ph": "B", "name": "GLOO_ALLREDUCE"') + 25  # inside the last record
    f = tmp_path / "timeline.json"
    f.write_text(s[:cut])
    tl = load_horovod_timeline(f)
    assert tl.truncated
    assert [("allreduce.emb.weight", "ALLREDUCE", 720.0)] == tl.unfinished
    assert len(tl.fusion_groups) == 2 and len(tl.tensors["allreduce.emb.weight"]) == 1


def test_every_prefix_parses_or_fails_cleanly() -> None:
    """A killed writer may stop at any byte: never a crash, and finished ops only grow."""
    s = _snippet().encode()
    first_record_end = s.index(b"},") + 1
    done_before = 0
    for n in range(1, len(s) + 1):
        try:
            tl = parse_horovod_timeline(s[:n], "cut.json")
        except DproInputError as e:
            assert n <= first_record_end + 1, (n, str(e))
            continue
        done = sum(len(v) for v in tl.tensors.values())
        assert done >= done_before, n
        done_before = done
        for ops in tl.tensors.values():
            for op in ops:
                assert all(p.dur_us >= 0 for p in op.phases)
    assert done_before == 4


@pytest.mark.parametrize(
    "content, problem",
    [
        ("", "empty file"),
        ("   \n", "empty file"),
        ("hello world", "expected a JSON array"),
        ('{"traceEvents": []}', "found a JSON object"),
        ("[]", "no process_name records"),
        ("[1, 2]", "record 0 is not a JSON object"),
        ('[{"ph": "B", "name": "ALLREDUCE", "ts": "soon", "pid": 1}]', "'ts' is missing or not a number"),
        ('[{"ph": "B", "name": "ALLREDUCE", "ts": 5}]', "'pid' is missing or not an integer"),
        ('[{"ph": "B", "ts": 5, "pid": 1}]', "without a name"),
        ('[{"ph": "B", "name": "A", "ts": 5, "pid": 1},{"ph": "E", "ts": 4, "pid": 1}]', "before its 'B'"),
        ('[{"ph": "B", "name": "A", "ts": 5, "pid": 1},GARBAGE,{"ph": "E", "ts": 6, "pid": 1}]', "invalid JSON"),
        ('[{"ph": "B", "name": "A", "ts": 5, "pid": 1},{"ph": "E", "ts": 6, "pid" 1},{"ph": "E"}]', "invalid JSON"),
        ("[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"start_time", "invalid JSON"),
    ],
)
def test_bad_files_one_line_error(tmp_path: Path, content: str, problem: str) -> None:
    f = tmp_path / "timeline.json"
    f.write_text(content)
    with pytest.raises(DproInputError) as ei:
        load_horovod_timeline(f)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(str(f)) and problem in msg, msg


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DproInputError, match="file not found"):
        load_horovod_timeline(tmp_path / "nope.json")
