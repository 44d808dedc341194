"""python_function frames are read as times only (``read.PyFrames``), not as events.

The converter must cut exactly the same segments as when every frame was a tree node (the
behaviour before, which is still what happens to a frame kept as a ``KEvent``): checked on
random thread trees where frames outlive the annotations and operators they start in (as
a record_function's own exit frames do in real traces), tie with other events, or are a
thread's only events. The corpus sets are checked the same way by comparing the whole
imported gTrace before and after the change (commit message).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dpro.importers.kineto import convert
from dpro.importers.kineto.read import KEvent, RankFile, _Collector
from dpro.importers.kineto.segments import cpu_segments

CATS = ["cpu_op", "cpu_op", "user_annotation", "python_function", "python_function", "python_function", "cuda_runtime"]


def _thread(rng: random.Random, tid: int, t0: float, t1: float, depth: int, out: list[dict]) -> None:
    t = t0
    while t < t1 and rng.random() < 0.8:
        a = min(t1, t + rng.choice([0.0, 0.0, rng.uniform(0, 5)]))
        b = min(t1, a + rng.uniform(0, 30))
        cat = rng.choice(CATS)
        if cat == "python_function" and rng.random() < 0.3:  # outlives its parent
            b = b + rng.uniform(0, 10)
        if rng.random() < 0.05:  # ends after everything: improper nesting at any depth
            b = t1 + rng.uniform(0, 20)
        name = {"cpu_op": rng.choice(["aten::mm", "aten::add", "c10d::allreduce_", "autograd::engine::x"]),
                "user_annotation": rng.choice(["ProfilerStep#1", "dpro.layer::fc", "Optimizer.step#SGD.step",
                                               "dpro.bucket::0", "gloo:all_reduce"]),
                "python_function": rng.choice(["torch/nn/modules/module.py(1527): _call_impl", "nn.Module: Linear_0",
                                               "<built-in method add>"]),
                "cuda_runtime": rng.choice(["cudaLaunchKernel", "cudaStreamSynchronize"])}[cat]
        e = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": a, "dur": b - a, "args": {}}
        if cat == "cuda_runtime":
            e["args"] = {"correlation": len(out)}
        if cat == "python_function":
            e["args"] = {"Python id": len(out), "Python parent id": 0}
        out.append(e)
        if depth < 5 and b - a > 2:
            _thread(rng, tid, a + rng.uniform(0, 1), b, depth + 1, out)
        t = b if rng.random() < 0.8 else a  # sometimes a tie or an overlap with the next sibling


def _events(seed: int) -> list[dict]:
    rng = random.Random(seed)
    out: list[dict] = [{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 7, "ts": 0.0, "dur": 1.0}]
    for tid in (7, 3, 9)[: rng.randint(1, 3)]:
        _thread(rng, tid, rng.uniform(0, 50), 400.0, 0, out)
    if rng.random() < 0.3:  # a thread of python frames alone
        out.append({"ph": "X", "cat": "python_function", "name": "threading.py(1): run", "pid": 1, "tid": 11,
                    "ts": rng.uniform(0, 10), "dur": 500.0, "args": {}})
    rng.shuffle(out)
    return out


def _rank(events: list[dict], frames_as_events: bool) -> RankFile:
    c = _Collector(Path("r0.json"))
    c.add(events)
    rf = RankFile(path=Path("r0.json"), rank=0, world_size=1, backend=None, events=c.events, python=c.python)
    if frames_as_events:  # the reference: every frame a KEvent, in file order, as before
        byid = {id(e): e for e in c.events}
        assert len(byid) == len(c.events)
        rf = RankFile(path=rf.path, rank=0, world_size=1, backend=None, python={}, events=[
            KEvent(e["name"], e["cat"], float(e["ts"]), float(e["dur"]), e["tid"], None) if e["cat"] == "python_function"
            else c.events.pop(0) for e in events])
    return rf


@pytest.mark.parametrize("seed", range(300))
def test_segments_same_as_with_every_frame_a_tree_node(seed):
    events = _events(seed)
    dropped, full = _rank(events, False), _rank(events, True)
    assert not full.python and all(e.cat != "python_function" for e in dropped.events)
    assert convert._main_tid(dropped) == convert._main_tid(full)
    assert dropped.time_span() == full.time_span()
    for main in {convert._main_tid(full), 7, 11}:
        assert cpu_segments(dropped, main) == cpu_segments(full, main)


def test_frames_that_matter_are_kept_as_events():
    """A frame with an arg the converter reads, or a name it reads, stays an event."""
    events = [{"ph": "X", "cat": "python_function", "name": n, "tid": 1, "ts": 0, "dur": 5, "args": a}
              for n, a in [("f.py(1): g", {}), ("f.py(1): g", {"Sequence number": 3}), ("ProfilerStep#2", {}),
                           ("c10d::allreduce_", {}), ("dpro.bucket::1", {}), ("f.py(2): h", None)]]
    c = _Collector(Path("r0.json"))
    c.add(events)
    assert [e.name for e in c.events] == ["f.py(1): g", "ProfilerStep#2", "c10d::allreduce_", "dpro.bucket::1"]
    assert len(c.python[1]) == 2 and c.python[1].first == 0
