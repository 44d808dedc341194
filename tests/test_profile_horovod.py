"""`dpro profile` + the two-line Recorder on a real 2-rank Horovod (gloo, CPU) job.

The job runs examples/pytorch/hvd_recorder.py under ``horovodrun -np 2 --gloo``; its
collectives come from rank 0's Horovod timeline (dpro/importers/horovod/atoms.py). Skipped when
``horovod.torch`` is not importable (build it with ``scripts/install_horovod.sh``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hvd_util import horovod_skip_reason, horovodrun

from dpro.contracts.recording import TIMELINE_NAME
from dpro.gtrace.io import load_gtrace
from dpro.replayer.replay import replay

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "pytorch" / "hvd_recorder.py"


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> Path:
    reason = horovod_skip_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("hvdprof") / "traces"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("HOROVOD_TIMELINE", None)
    cmd = [sys.executable, "-m", "dpro.cli", "profile", "-o", str(out), "--warmup", "4", "--steps", "10", "--",
           horovodrun(), "-np", "2", "--gloo", "-H", "localhost:2",
           sys.executable, str(EXAMPLE), "--model", "mlp", "--steps", "16"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "recorded 2 rank(s)" in r.stderr, r.stderr[-3000:]
    assert "horovod timeline not used" not in r.stderr, r.stderr[-3000:]
    return out


@pytest.mark.slow
def test_gtrace_complete(profiled):
    gt = load_gtrace(profiled)
    assert gt.manifest.library == "horovod" and gt.manifest.world_size == 2
    assert sorted(nt.info.rank for nt in gt.nodes.values()) == [0, 1]
    assert len(gt.manifest.steps) >= 4 and set(gt.manifest.steps) <= set(range(4, 14))
    # rank 0's Horovod timeline writer (it spins while HOROVOD_TIMELINE is set) was found and idled
    assert isinstance(gt.nodes["worker0"].meta.get("horovod_writer_thread"), int)
    assert gt.nodes["worker1"].meta.get("horovod_writer_thread") is None
    # it ran with Horovod's default fusion, and says so (its grouping is then Horovod's default)
    assert all(nt.meta.get("horovod_settings") == {} for nt in gt.workers())
    sys.path.insert(0, str(EXAMPLE.parent))
    from models import build

    model, _, _ = build("mlp")
    params = dict(model.named_parameters())
    txns = []
    for nt in gt.workers():
        assert {t.name for t in nt.tensors} == set(params)
        comm = {op.txn: op for op in nt.ops.values() if op.cat == "COMM"}
        assert comm and all(op.sub_op == "ALLREDUCE" and op.device == "comm" for op in comm.values())
        succ = {u: set() for u, _ in nt.edges}
        for u, v in nt.edges:
            succ[u].add(v)
        for t in nt.tensors:
            assert t.producer in nt.ops and nt.ops[t.producer].cat == "BW", t
            assert t.txn in comm, f"{t.name} is carried by no collective"
            assert comm[t.txn].id in succ[t.producer], f"{t.name}: its producer does not precede its collective"
            assert t.bytes == params[t.name].numel() * 4
        for txn, op in comm.items():
            assert op.bytes == sum(t.bytes for t in nt.tensors if t.txn == txn)
            # the wait in the optimizer's synchronize() depends on the collective
            assert any(nt.ops[v].cat == "UPDATE" for v in succ[op.id]), f"{txn} has no UPDATE consumer"
        # every profiled step has an event per collective
        steps = {(e.op, e.step) for e in nt.events}
        assert all((op.id, s) in steps for op in comm.values() for s in gt.manifest.steps)
        # fused groups recorded per step: every gradient in exactly one group of its step
        hv = nt.meta["horovod"]
        assert {n for a in hv["atoms"] for n in a["tensors"]} == set(params)
        for s in gt.manifest.steps:
            groups = hv["groups"][str(s)]
            names = [n for g in groups for n in g["tensors"]]
            assert sorted(names) == sorted(params)
            assert all(g["end_us"] >= g["start_us"] for g in groups)
        txns.append(sorted(comm))
    assert txns[0] == txns[1]  # transaction ids pair the ranks' collectives
    assert sorted(p.name for p in (profiled / "raw").iterdir()) == sorted([
        "rank0.json.gz", "rank0.meta.json", "rank1.json.gz", "rank1.meta.json", TIMELINE_NAME])


@pytest.mark.slow
def test_replay_within_bound(profiled):
    res = replay(load_gtrace(profiled))
    n_comm = len({op.txn for op in load_gtrace(profiled).workers()[0].ops.values() if op.cat == "COMM"})
    assert res.build.expanded == n_comm and res.build.kept_coarse == 0
    # 20 %, not the 10 % of the DDP tests: on this 2-core machine the two ranks' backward
    # passes slow down independently from step to step under Horovod, and a mean-based replay
    # then underestimates (docs/fidelity.md: -17 % .. 0 %; -10.4 % seen on a quiet run).
    assert abs(res.error_pct) <= 20.0, res.to_json()


# ------------------------------------------------------------------ without Horovod


def _timeline(groups: list[tuple[float, float, list[str]]]) -> bytes:
    """A Horovod timeline with one fused ALLREDUCE per (start, end, tensors)."""
    import json

    pid = {}
    recs: list[dict] = [{"name": "process_name", "ph": "M", "pid": 0,
                         "args": {"start_time_since_epoch_in_micros": 1_000_000}}]
    for s, e, names in groups:
        for n in names:
            if n not in pid:
                pid[n] = len(pid) + 1
                recs.append({"name": "process_name", "ph": "M", "pid": pid[n], "args": {"name": f"allreduce.{n}"}})
        recs += [{"ph": "B", "name": "ALLREDUCE", "ts": s, "pid": pid[n]} for n in names]
        recs += [{"ph": "B", "name": "GLOO_ALLREDUCE", "ts": s + 1, "pid": pid[n]} for n in names]
        recs += [{"ph": "E", "ts": e - 1, "pid": pid[n]} for n in names]
        recs += [{"ph": "E", "ts": e, "pid": pid[n], "args": {"dtype": "float32", "shape": "[2]"}} for n in names]
    return json.dumps(recs).encode()


def test_atoms_are_the_groups_never_split():
    from types import SimpleNamespace

    from dpro.importers.horovod.atoms import plan_atoms
    from dpro.importers.horovod.timeline import parse_horovod_timeline

    # step 1 fuses {a, b} then {c, d}; step 2 fuses {a, b, c} then {d}; step 3 is incomplete
    tl = parse_horovod_timeline(_timeline([
        (100, 200, ["a", "b"]), (300, 400, ["c", "d"]),
        (1100, 1300, ["a", "b", "c"]), (1400, 1500, ["d"]),
        (2100, 2200, ["a", "b"]),
    ]))
    params = {n: {"name": n, "bytes": 8, "shape": [2]} for n in "abcd"}
    ref = SimpleNamespace(steps={1: (0.0, 1000.0), 2: (1000.0, 1000.0), 3: (2000.0, 1000.0)})
    gt = SimpleNamespace(manifest=SimpleNamespace(steps=[1, 2, 3]))
    plan = plan_atoms(gt, tl, ref, 0.0, params)
    assert plan.steps == [1, 2] and any("[3]" in n for n in plan.notes)
    assert plan.order == ["a", "b", "c", "d"]
    assert [a.tensors for a in plan.atoms] == [["a", "b"], ["c"], ["d"]]
    assert [a.bytes for a in plan.atoms] == [16, 8, 8]
    assert len({a.txn for a in plan.atoms}) == 3
    # a group of a step is a union of atoms
    assert plan.group_of[2]["a"] is plan.group_of[2]["c"] and plan.group_of[1]["c"] is plan.group_of[1]["d"]


def test_launcher_finds_the_users_timeline(tmp_path):
    from dpro.profiler.launcher import keep_timeline, user_timeline

    assert user_timeline(["horovodrun", "-np", "2", "--timeline-filename", "t.json", "python", "x.py"], {}) == Path("t.json")
    assert user_timeline(["horovodrun", "--timeline-filename=u.json", "python"], {}) == Path("u.json")
    assert user_timeline(["python", "x.py"], {"HOROVOD_TIMELINE": "/a/b.json"}) == Path("/a/b.json")
    assert user_timeline(["python", "x.py"], {"HOROVOD_TIMELINE": "DYNAMIC"}) is None
    assert user_timeline(["torchrun", "x.py"], {}) is None
    src = tmp_path / "mine.json"
    src.write_text("[]")
    raw = tmp_path / "raw"
    raw.mkdir()
    keep_timeline(src, raw, 0.0)
    assert (raw / TIMELINE_NAME).read_text() == "[]"


def test_link_envelope_is_the_uncontended_cost():
    from dpro.importers.horovod.atoms import link_envelope

    # 2 ranks: a fused execution of m atoms and B bytes costs 2 * (m * alpha + beta * B / 2)
    samples = [(1, 1000, 10.0), (1, 1000, 30.0), (2, 3000, 25.0)]
    alpha, beta = link_envelope(samples, 2)
    assert alpha == pytest.approx(2.5) and beta == pytest.approx(0.005)
    assert all(2 * (m * alpha + beta * b / 2) <= t + 1e-9 for m, b, t in samples)
    assert link_envelope([], 2) == (0.0, 0.0)
