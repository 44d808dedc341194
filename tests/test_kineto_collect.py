"""The Kineto reader's compiled per-event loop (dpro/importers/kineto/_collect.c) keeps
exactly what its Python reference (``_Collector.add_python``) keeps: the same KEvents,
shared the same way, the same python frames, counters and errors; on random and odd
event lists and on every rank file of the corpus. Without the build, the Python loop
runs and ``dpro replay`` says so."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dpro.errors import DproInputError
from dpro.importers.kineto import read
from dpro.importers.kineto.read import _Collector, trace_files
from dpro.jsonio import read_array_stream

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "corpus"
needs_c = pytest.mark.skipif(isinstance(read._compiled(), str), reason=f"compiled reader loop {read._compiled()}")


def _state(c: _Collector) -> tuple:
    """Everything the collector kept, with which kept objects are one and the same."""
    ids: dict[int, int] = {}

    def ref(x: object) -> object:
        return (type(x).__name__, x, ids.setdefault(id(x), len(ids))) if x is not None else None

    evs = [(ref(e.name), ref(e.cat), e.ts, e.dur, type(e.ts), type(e.dur), ref(e.tid), ref(e.args)) for e in c.events]
    py = {(type(t).__name__, t): (list(f.ts), list(f.dur), f.first) for t, f in c.python.items()}
    return (evs, py, list(c.python), c.index, c.legacy, c.has_op, sorted(c.cats), list(c._strings.items()),
            sorted(map(repr, c._plans)))


def _run(batches: list[list], compiled: bool) -> tuple:
    c = _Collector(Path("r0.json"))
    try:
        for b in batches:
            (c.add if compiled else c.add_python)(b)
    except Exception as e:  # noqa: BLE001 - the error itself is compared
        return ("error", type(e).__name__, str(e), c.legacy, c.has_op)
    return _state(c)


def _same(batches: list[list]) -> tuple:
    py, c = _run(batches, False), _run(batches, True)
    assert c == py
    return py


ODD_VALUES = [None, True, False, 0, -1, 1, 3, 2**62, 2**62 - 1, -(2**62), 2**63, 2**70, -(2**70), 1.5, -2.5, 0.0, -0.0,
              float("nan"), float("inf"), -float("inf"), 2.0**62, 1e300, "x", "", "12", [], [1], {}, {"a": 1}]


def _odd_event(rng: random.Random, i: int) -> object:
    if rng.random() < 0.03:
        return rng.choice([None, 1, "X", [], {"ph": "X"}])
    e: dict = {}
    if rng.random() < 0.95:
        e["ph"] = rng.choice(["X"] * 8 + ["B", "i", None, 1])
    names = ["aten::mm", "ProfilerStep#3", "c10d::allreduce_", "nccl:all_reduce", "dpro.layer::fc1", "foo.py(12): f",
             "cudaLaunchKernel", "record_param_comms", "gloo:all_reduce"]
    for key, vals in [
        ("name", names + [None, 7, ""]),
        ("cat", ["cpu_op", "python_function", "kernel", "Kernel", "Operator", "Runtime", "user_annotation", "cuda_runtime",
                 "gpu_memcpy", None, 3, "ac2g"]),
        ("ts", [float(rng.randint(0, 10**6)) + rng.random(), rng.randint(0, 10**6), 1694128201545123.5]),
        ("dur", [float(rng.randint(0, 100)), rng.randint(0, 100), 0]),
        ("tid", [1, 2, "stream 7", 7, 0]),
        ("pid", [0, 1, "proc"]),
    ]:
        r = rng.random()
        if r < 0.9:
            e[key] = rng.choice(vals)
        elif r < 0.95:
            e[key] = rng.choice(ODD_VALUES)
    if rng.random() < 0.7:
        args = {}
        for k in rng.sample(["Sequence number", "correlation", "device", "stream", "Input Dims", "Input type", "External id",
                             "Concrete Inputs", "Collective name", "In msg nelems", "dtype", "Python id", "Ev Idx"],
                            rng.randint(0, 5)):
            args[k] = rng.choice([rng.randint(0, 5), [[4, 8], [8]], ["float"], "float", [1.5], None, [["a"]], i])
        e["args"] = args if rng.random() < 0.97 else rng.choice(ODD_VALUES)
    return e


@needs_c
@pytest.mark.parametrize("seed", range(40))
def test_random_event_lists_are_kept_identically(seed):
    rng = random.Random(seed)
    events = [_odd_event(rng, i) for i in range(rng.randint(1, 400))]
    cut = sorted(rng.sample(range(len(events) + 1), min(3, len(events) + 1)))
    _same([events[a:b] for a, b in zip([0] + cut, cut + [len(events)])])


@needs_c
def test_common_events_and_each_error_path():
    ok = [{"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 10.5, "dur": 2, "tid": 1, "pid": 0,
           "args": {"Sequence number": 4, "Input Dims": [[2, 3]], "External id": 9}},
          {"ph": "X", "name": "k", "cat": "Kernel", "ts": 11, "dur": 1.25, "tid": "stream 7", "args": {"correlation": 5}},
          {"ph": "X", "name": "f.py(1): g", "cat": "python_function", "ts": 9, "tid": 1},
          {"ph": "X", "name": "f.py(1): g", "cat": "python_function", "ts": 9.5, "dur": 3, "tid": 2,
           "args": {"Python id": 3}},
          {"ph": "X", "name": "ProfilerStep#1", "cat": "python_function", "ts": 1, "dur": 30, "tid": 1}]
    state = _same([ok, ok])
    assert len(state[0]) == 6 and state[4] == 2  # two legacy Kernel events; the frames stay frames
    bad = [{"ts": "1"}, {"ts": 1, "dur": -1}, {"ts": 1, "dur": float("nan")}, {"ts": 2**62}, {"ts": 1.0, "dur": 2**70},
           {"ts": 1, "args": [1]}, {"ts": 1, "tid": None}, {"ts": 1, "pid": 1.5}, {"ts": 1, "tid": True},
           {"ts": 2**80, "dur": 1.0}, {"ts": -(2**62) + 1, "dur": 1}, {"ts": 1, "name": None, "cat": 5}]
    for b in bad:
        err = _same([ok, [{"ph": "X", "name": "x", "cat": "cpu_op", "tid": 1, **b}]])
        if err[0] == "error":
            assert err[1] == "DproInputError" and "traceEvents[" in err[2]


@needs_c
@pytest.mark.skipif(not CORPUS.is_dir(), reason="the trace corpus (../shared/traces/corpus) is not here")
def test_every_corpus_rank_file_is_read_identically():
    files = [trace_files(d)[0] for d in sorted(CORPUS.iterdir()) if d.is_dir()]  # a rank of each set
    assert len(files) > 20
    for f in files:
        states = []
        for compiled in (False, True):
            c = _Collector(f)
            try:
                read_array_stream(f, "traceEvents", c.add if compiled else c.add_python, c.reset)
                states.append(_state(c))
            except DproInputError as e:
                states.append(str(e))
        assert states[0] == states[1], f


def test_without_the_build_the_python_loop_runs_and_replay_says_so(monkeypatch, tmp_path):
    """Where the C loop is missing (the build failed), the reader uses the Python loop, with
    the same result, and ``dpro replay`` prints a line saying so."""
    from click.testing import CliRunner

    from dpro.cli import cli

    src = Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp_gloo_2rank_mlp"
    ranks = sorted(src.glob("*.json*")) if src.is_dir() else []
    if not ranks:
        pytest.skip("no bundled multi-rank Kineto example")
    monkeypatch.setattr(read, "_compiled", lambda: "not built (No module named 'dpro.importers.kineto._collect')")
    assert "compiled loop is not built" in read.reader_line()
    res = CliRunner().invoke(cli, ["replay", str(src), "--no-cache"])
    assert res.exit_code == 0, res.output
    assert "kineto reader: python (the compiled loop is not built" in res.output


@needs_c
def test_the_compiled_depth_check_answers_as_jsonio_too_deep():
    """For orjson-parsed batches around the limit (lists and objects mixed), the reader's
    nesting check says what jsonio.too_deep (orjson's own limit) says."""
    import orjson

    from dpro.jsonio import MAX_DEPTH, too_deep

    check, rng, deep = read._depth_check(), random.Random(1), 0
    for _ in range(300):
        x = rng.choice([0, "a", [], {}, [1]])
        for _ in range(rng.randint(MAX_DEPTH - 12, MAX_DEPTH + 4)):
            x = rng.choice([[x], {"k": x}, [1, x, {}], {"a": 1, "b": x}])
        batch = [rng.choice([{}, 1, x]) for _ in range(3)] if rng.random() < 0.8 else [x]
        if not too_deep(batch):
            batch = orjson.loads(orjson.dumps(batch))
        deep += too_deep(batch)
        assert check(batch) == too_deep(batch)
    assert 20 < deep < 280


def test_a_replay_without_the_compiled_loops_gives_the_same_result(tmp_path):
    """The modules made unimportable (as where the build failed): the Python loops run,
    ``dpro replay --json`` prints the same result as with them."""
    import json
    import os
    import subprocess
    import sys

    src = Path(__file__).resolve().parents[1] / "examples" / "traces" / "ddp_gloo_2rank_mlp"
    run = ("import sys\n"
           "if sys.argv[1] == 'off':\n"
           "    sys.modules['dpro.importers.kineto._collect'] = sys.modules['dpro.importers.kineto._segments'] = None\n"
           "from dpro.cli import main\n"
           "sys.argv = ['dpro', 'replay', sys.argv[2], '--json', '--no-cache']\n"
           "main()\n")
    env = dict(os.environ, DPRO_CACHE_DIR=str(tmp_path / "cache"))
    out = {}
    for mode in ("on", "off"):
        r = subprocess.run([sys.executable, "-c", run, mode, str(src)], capture_output=True, text=True, env=env,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        out[mode] = _no_time(json.loads(r.stdout))
    assert out["on"] == out["off"]


def _no_time(x: object) -> object:
    """A result without the solver's wall time (``time_s``), which varies from run to run."""
    if isinstance(x, dict):
        return {k: _no_time(v) for k, v in x.items() if k != "time_s"}
    return [_no_time(v) for v in x] if isinstance(x, list) else x
