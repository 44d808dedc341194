"""Gloo collectives in a Kineto trace: which execution belongs to which issue, and which op
waited for it, when ProcessGroupGloo's two threads run two buckets at once.

Hand-built two-rank traces of a DDP-like step (forward, two backward ops each issuing one
bucket, a wait, one ``copy_bucket_to_grad`` per bucket, the optimizer) where the right
answer is known by construction.  Two things seen on real loaded runs are reproduced:
bucket 1's execution is recorded starting before bucket 0's, and in one step bucket 1 ends
after bucket 0 (in the others it ends first).  The real-job checks are test_ddp_real.py
and test_alignment.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from dpro.alignment import align
from dpro.importers.kineto import import_kineto

MS = 1000.0
NUMEL = (1000, 2000)  # bucket 0, bucket 1 (elements)


def _x(name: str, cat: str, tid: int, t0_ms: float, t1_ms: float, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": t0_ms * MS, "dur": (t1_ms - t0_ms) * MS,
            "args": args}


def _step(k: int, base: float, *, swap_starts: bool, late_bucket1: bool) -> list[dict]:
    """One step from ``base`` ms: bucket 0 issued at 20 ms, bucket 1 at 30 ms."""
    main, t0, t1 = 1, 11, 12
    ev = [_x(f"ProfilerStep#{k}", "user_annotation", main, base, base + 80)]
    at = lambda a, b, *r, **kw: _x(*r[:2], main, base + a, base + b, **kw)  # noqa: E731
    ev.append(at(0, 10, "aten::linear", "cpu_op"))
    for i, (a, b) in enumerate([(10, 20), (20, 30)]):
        ev.append(at(a, b, "autograd::engine::evaluate_function: AddmmBackward0", "cpu_op"))
        ev.append(at(b - 1, b, "c10d::allreduce_", "cpu_op", **{"Input Dims": [[[NUMEL[i]]]], "Input type": ["TensorList"]}))
    # executions: bucket 0 on one gloo thread, bucket 1 on the other
    s0, s1 = (31.0, 30.5) if swap_starts else (20.2, 30.2)
    e0, e1 = 50.0, (70.0 if late_bucket1 else 45.0)
    ev.append(_x("gloo:all_reduce", "user_annotation", t0, base + s0, base + e0, **{"Input Dims": [[NUMEL[0]]], "Input type": ["float"]}))
    ev.append(_x("gloo:all_reduce", "user_annotation", t1, base + s1, base + e1, **{"Input Dims": [[NUMEL[1]]], "Input type": ["float"]}))
    # the main thread waits for bucket 0, copies it back, then waits for bucket 1 (if still running)
    c1 = max(e1, 51.0)
    ev.append(at(50, 51, "torch.distributed.ddp.reducer::copy_bucket_to_grad", "cpu_op"))
    ev.append(at(c1, c1 + 1, "torch.distributed.ddp.reducer::copy_bucket_to_grad", "cpu_op"))
    ev.append(at(c1 + 2, c1 + 8, "Optimizer.step#SGD.step", "user_annotation"))
    ev.append(at(c1 + 2, c1 + 8, "aten::add_", "cpu_op"))
    return ev


def _trace(dir_: Path, late_step: int, swap_step: int) -> Path:
    for rank in (0, 1):
        ev: list[dict] = []
        for k in range(6):
            ev += _step(k, 100.0 * k, swap_starts=k == swap_step and rank == 0, late_bucket1=k == late_step)
        (dir_ / f"rank{rank}.json").write_text(json.dumps({"traceEvents": ev}))
    return dir_


def _comm(gt, node: str):
    nt = gt.nodes[node]
    return {o.id: o for o in nt.ops.values() if o.cat == "COMM"}


def test_issue_takes_the_execution_of_its_size(tmp_path):
    """Bucket 1's execution recorded first (step 2, rank 0): still bucket 1's, on both ranks."""
    gt = import_kineto(_trace(tmp_path, late_step=-1, swap_step=2))
    per_rank = []
    for n in sorted(gt.nodes):
        comm = _comm(gt, n)
        per_rank.append(sorted((o.txn, o.bytes) for o in comm.values()))
        for e in gt.nodes[n].events:
            if e.op in comm and e.step == 2:
                # each execution keeps its own recorded times
                want = 50.0 if comm[e.op].bytes == 4 * NUMEL[0] else 45.0
                assert abs((e.ts + e.dur) / MS - (200.0 + want)) < 1e-6
    assert per_rank[0] == per_rank[1] == [("allreduce.0", 4 * NUMEL[0]), ("allreduce.1", 4 * NUMEL[1])]


def test_consumer_holds_in_every_step(tmp_path):
    """Bucket 1 ends before bucket 0 in five steps and after it in one (step 3).  The
    dependency is the one found in most steps (bucket 1 -> the first copy: in those steps
    the thread's one wait covers both buckets), but step 3's bucket 1 is not clipped to
    that copy's start, 20 ms before it ended: it keeps its end (70 ms, where the second
    copy starts), so the trace does not contradict its own clock."""
    gt = import_kineto(_trace(tmp_path, late_step=3, swap_step=-1))
    for n, nt in gt.nodes.items():
        comm = _comm(gt, n)
        b1 = next(i for i, o in comm.items() if o.bytes == 4 * NUMEL[1])
        ends = {e.step: (e.ts + e.dur) / MS - 100.0 * e.step for e in nt.events if e.op == b1}
        assert abs(ends[3] - 70.0) < 1e-6 and all(abs(v - 45.0) < 1e-6 for s, v in ends.items() if s != 3), ends
        consumers = [nt.ops[b] for a, b in nt.edges if a == b1]
        first_ts = {e.op: e.ts for e in nt.events if e.step == 0}
        copies = sorted((o.id for o in nt.ops.values() if "copy_bucket_to_grad" in o.name), key=first_ts.get)
        assert len(copies) == 2 and copies[0] in {c.id for c in consumers}, (consumers, copies)
    for nt in gt.nodes.values():  # two hosts, so that there are clocks to align
        nt.info.host = f"host{nt.info.rank}"
    for info in gt.manifest.nodes:
        info.host = f"host{info.rank}"
    res = align(gt)
    assert res.status.startswith("optimal"), res.notes
    assert res.terms.get("max_violation_ms", 0.0) <= 1e-3, res.notes
