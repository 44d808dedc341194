"""Kineto import and replay on the real GPU traces in ../shared/traces/kineto/.

These come from GPU clusters (see that directory's README); each file is one rank of a
larger job, so collectives keep their measured durations.
"""

from __future__ import annotations

import os
from pathlib import Path

import networkx as nx
import pytest

from dpro.gtrace.validate import validate
from dpro.importers.kineto import import_kineto
from dpro.replayer.replay import replay

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DPRO_SHARED", REPO.parent / "shared")) / "traces" / "kineto"
FILES = sorted(SHARED.glob("*.json.gz")) if SHARED.is_dir() else []

pytestmark = [pytest.mark.skipif(not FILES, reason=f"shared Kineto traces not found at {SHARED}"),
              pytest.mark.usefixtures("allow_missing_ranks")]  # one rank of a 2- or 128-rank job


@pytest.fixture(scope="module", params=[f.name for f in FILES] or ["none"])
def imported(request):
    path = SHARED / request.param
    return path, import_kineto(path)


def test_structure(imported):
    path, gt = imported
    (nt,) = gt.nodes.values()
    validate(gt)
    assert nx.is_directed_acyclic_graph(nx.DiGraph(nt.edges))
    devices = {op.device for op in nt.ops.values()}
    assert "cpu:main" in devices and any(d.startswith("gpu") for d in devices)
    cats = {op.cat for op in nt.ops.values()}
    assert {"FW", "BW", "UPDATE", "COMM"} <= cats
    # every op has an event in every kept step
    steps = set(gt.manifest.steps)
    seen = {(e.op, e.step) for e in nt.events}
    assert all((op, s) in seen for op in nt.ops for s in steps)
    # every GPU op was joined to its launch or to another stream (nothing floats)
    preds = {b for _, b in nt.edges}
    gpu_ops = [o for o in nt.ops.values() if o.device.startswith("gpu")]
    assert all(o.id in preds for o in gpu_ops)


def test_comm_metadata(imported):
    path, gt = imported
    (nt,) = gt.nodes.values()
    comm = [o for o in nt.ops.values() if o.cat == "COMM"]
    assert comm, "NCCL kernels must become COMM ops"
    assert all(o.name.startswith(("ncclKernel_", "ncclDevKernel_")) for o in comm)
    assert len({o.txn for o in comm}) == len(comm)
    if path.name.startswith("a100"):
        # this trace carries collective metadata: sizes from 'In msg nelems' x dtype
        ar = [o for o in comm if o.sub_op == "ALLREDUCE"]
        assert ar and all(o.bytes > 0 and o.bytes % 4 == 0 for o in ar)
        assert all(o.group == (0, 1) for o in ar)
    assert gt.manifest.library == "nccl"
    assert any("ranks present" in n for n in gt.notes)


def test_replay_matches_measured(imported):
    path, gt = imported
    res = replay(gt)
    assert res.measured_iteration_us and res.measured_iteration_us > 100_000
    assert abs(res.error_pct) <= 5.0
    assert res.build.expanded == 0  # peers absent: measured collective times
    cp = res.critical_path
    assert cp and cp[-1].start_us + cp[-1].dur_us == pytest.approx(res.predicted_iteration_us)
    for a, b in zip(cp, cp[1:]):
        assert b.start_us >= a.start_us + a.dur_us - 1e-6
    bd = res.breakdown_us
    assert bd["FW"] > 0 and bd["BW"] > 0 and bd["COMM"] > 0


def test_join_edge_main_thread_waits_for_backward_thread() -> None:
    """On a GPU job `loss.backward()` blocks the main thread while autograd's device thread runs
    the backward pass: the main thread's next op depends on that thread's last op (recorded
    on an H200: main resumed 300-480 µs after it), so the wait is not replayed as host time."""
    from dpro.importers.kineto.deps import join_edges
    from dpro.importers.kineto.segments import Seg

    main = [Seg("cpu:main", "aten::ones_like", 0.0, 20.0), Seg("cpu:main", "aten::_foreach_add_", 5400.0, 5460.0)]
    bwd = [Seg("cpu:t1", "evaluate_function: A", 100.0, 2500.0), Seg("cpu:t1", "evaluate_function: B", 2600.0, 5000.0)]
    assert join_edges({"cpu:main": main, "cpu:t1": bwd}) == [(bwd[1], main[1])]
    # a thread that finished long before the main thread resumed is not what it waited for
    early = [Seg("cpu:t2", "loader", 100.0, 1000.0)]
    assert join_edges({"cpu:main": main, "cpu:t2": early}) == []
    # no wait on the main thread (gap < 50 µs): no join
    busy = [Seg("cpu:main", "a", 0.0, 5000.0), Seg("cpu:main", "b", 5010.0, 5020.0)]
    assert join_edges({"cpu:main": busy, "cpu:t1": bwd}) == []
