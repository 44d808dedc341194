"""The MXNet PS collector's push model, on a hand-built recording (no MXNet needed).

Two workers, one server, one key, two steps; in each step a different worker is the
straggler (its backward op takes 5 ms instead of 1 ms), as in our 4-worker traces where a
different worker pushes last in each step.  The server updates when the last push is in.

    step s (times from the step start, both workers start together):
      straggler  BW [100, 5100]  push/pull op [5100, 7600]
      other      BW [100, 1100]  push/pull op [1100, 7600]
      server     update [6100, 6600]            step ends at 7700

Replayed by hand: each worker's BW op lasts 3000 on average (gap 100) and its push starts
at 3100; the last push's way in is u0 - max a = 1000, so pushes arrive at 4100.  A push
waits at the server until the key's update, as seen from the step start: 6100 - 2100 =
4000 for the early worker, 0 for the straggler, 2000 on average, so the update starts at
6100, ends at 6600, the pulls (1000) end at 7600 and the step (gap 100) at 7700 -- the
measured step.  Without the wait (the earlier model) the update would start at 4100 and
the replay predict 5700 (-26 %).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

pytest.importorskip("scipy")

from dpro.profiler.mxnet.backend import _with_header  # noqa: E402
from dpro.importers.mxnet.convert import collect_mxnet  # noqa: E402
from dpro.graph.overhead import measured_overhead  # noqa: E402
from dpro.replayer.replay import replay  # noqa: E402

T0 = 1_700_000_000_000_000.0
STEP = 10_000.0
KEY = {"key": 0, "name": "dense0_weight", "bytes": 4096, "shape": [32, 32], "dtype": "float32"}


def _op(name: str, ts: float, end: float, tid: int = 1) -> list[dict]:
    return [{"name": name, "cat": "operator", "ph": "B", "ts": ts, "pid": 1, "tid": tid},
            {"name": name, "cat": "operator", "ph": "E", "ts": end, "pid": 1, "tid": tid}]


def _recording(root: Path, walls: list[float] | None = None) -> Path:
    steps = [0, 1]
    for w in (0, 1):
        evs: list[dict] = []
        for s in steps:
            t0 = T0 + s * STEP
            bw_end = 5100.0 if w == s else 1100.0  # worker s straggles in step s
            evs += _op("_backward_FullyConnected", t0 + 100, t0 + bw_end)
            evs += _op("KVStoreDistDefaultStoragePushPull", t0 + bw_end, t0 + 7600, tid=2)
        with gzip.open(root / f"rank{w}.json.gz", "wt") as f:
            json.dump({"traceEvents": evs}, f)
        meta = {"framework": "mxnet", "rank": w, "world_size": 2, "kvstore": "dist_sync",
                "steps": [{"step": s, "ts": T0 + s * STEP, "dur": 7700.0} for s in steps],
                "keys": [KEY], "symbol": None, "memory": None}
        if walls is not None:
            meta["step_wall_us"] = walls
        (root / f"rank{w}.meta.json").write_text(json.dumps(meta))
    ups = [[0, s, T0 + s * STEP + 6100, T0 + s * STEP + 6100, T0 + s * STEP + 6600, 4096] for s in steps]
    (root / "server0.kv.json").write_text(json.dumps({"rank": 0, "host": "h", "updates": ups}))
    return root


def test_straggler_wait_reproduces_the_step(tmp_path: Path) -> None:
    gt = collect_mxnet(_recording(tmp_path), progress=False)
    srv = gt.nodes["server0"]
    waits = {(e.op, e.step): e.dur for e in srv.events if e.op.startswith("push:")}
    assert waits[("push:dense0_weight@w0", 0)] == pytest.approx(0.0)       # w0 straggles in step 0
    assert waits[("push:dense0_weight@w1", 0)] == pytest.approx(4000.0)
    assert waits[("push:dense0_weight@w0", 1)] == pytest.approx(4000.0)
    r = replay(gt)
    assert r.measured_iteration_us == pytest.approx(7700.0)
    assert r.predicted_iteration_us == pytest.approx(7700.0)


def test_step_walls_reach_the_node_meta(tmp_path: Path) -> None:
    walls = [90_000.0, 20_000.0, 9_000.0, 8_000.0, 8_500.0, 8_200.0, 12_000.0, 10_000.0]
    # the recording's steps are 0 and 1, so with 6 warm-up calls the window is calls 6, 7
    rec = _recording(tmp_path, walls)
    for w in (0, 1):
        p = rec / f"rank{w}.meta.json"
        m = json.loads(p.read_text())
        for i, s in enumerate(m["steps"]):
            s["step"] = 6 + i
        p.write_text(json.dumps(m))
    ups = [[0, 6 + s, T0 + s * STEP + 6100, T0 + s * STEP + 6100, T0 + s * STEP + 6600, 4096] for s in (0, 1)]
    (rec / "server0.kv.json").write_text(json.dumps({"rank": 0, "host": "h", "updates": ups}))
    gt = collect_mxnet(rec, progress=False)
    nt = gt.nodes["worker0"]
    assert nt.meta["step_wall_us"] == walls and nt.meta["steps"] == [6, 7]
    ov = measured_overhead(nt)
    assert ov is not None
    assert ov.unprofiled_us == pytest.approx(8_000.0)   # fastest of the warm-up's second half
    assert ov.profiled_us == pytest.approx(10_000.0)    # the window without its first call


def test_profiler_dump_without_header_is_repaired() -> None:
    body = b',\n    {"name": "x", "ph": "C", "ts": 1}\n    ],\n    "displayTimeUnit": "ms"\n}\n'
    doc = json.loads(_with_header(body))
    assert doc["traceEvents"] == [{"name": "x", "ph": "C", "ts": 1}]
    ok = b'{"traceEvents": []}'
    assert _with_header(ok) == ok


def test_floating_op_is_taken_off_the_chain() -> None:
    from dpro.importers.mxnet.convert import _floating_ops
    from dpro.importers.mxnet.read import Interval

    def seq(names: list[str]) -> list[Interval]:
        return [Interval(n, 10.0 * i, 10.0 * i + (1.0 if n == "SetValueOp" else 5.0), 1) for i, n in enumerate(names)]

    # as in the mlp traces: SetValueOp after FullyConnected#0 in some steps, after Activation#0 in others
    a = seq(["FullyConnected", "SetValueOp", "Activation", "FullyConnected"])
    b = seq(["FullyConnected", "Activation", "SetValueOp", "FullyConnected"])
    assert _floating_ops([a, b, a]) == {("SetValueOp", 0)}
    assert _floating_ops([a, a]) == set()
