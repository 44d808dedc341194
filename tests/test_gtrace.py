"""gTrace round trip: Kineto -> gTrace on disk -> back, and the writer's guarantees."""

from __future__ import annotations

import errno
import gzip
import json
import os
from pathlib import Path

import orjson
import pytest
from conftest import PROBE, STEP_US, T0, needs_probe, snapshot

import dpro.gtrace.io as gio
from dpro.errors import DproInputError
from dpro.gtrace import FORMAT_VERSION, load_gtrace, write_gtrace
from dpro.importers.kineto import import_kineto

JOBS = ["synthetic", pytest.param("probe", marks=needs_probe)]


@pytest.fixture(params=JOBS)
def job(request, kineto_dir: Path) -> Path:
    """A Kineto directory: the synthetic job, or a copy of the real probe job."""
    if request.param == "synthetic":
        return kineto_dir
    return request.getfixturevalue("probe_dir")


def _umask() -> int:
    m = os.umask(0o022)
    os.umask(m)
    return m


def test_round_trip(job: Path, tmp_path: Path) -> None:
    gt = import_kineto(job)
    out = write_gtrace(gt, tmp_path / "out")
    assert out == tmp_path / "out"
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        ["manifest.json"] + [f"{n}.{k}.json.gz" for n in gt.nodes for k in ("events", "dfg")]
    )
    for name in names:
        if name.endswith(".gz"):
            assert (out / name).read_bytes()[:2] == b"\x1f\x8b", f"{name} is not gzipped"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary siblings left behind"

    back = load_gtrace(out)
    assert back.source == str(out)
    assert back.manifest.to_json() == gt.manifest.to_json()
    assert back.manifest.version == FORMAT_VERSION
    assert list(back.nodes) == list(gt.nodes)
    for name, nt in gt.nodes.items():
        nb = back.nodes[name]
        assert nb.info == nt.info
        assert nb.ops == nt.ops  # ids, names, categories, devices, COMM attributes
        assert list(nb.ops) == list(nt.ops)  # and their order
        assert nb.edges == nt.edges
        assert nb.events == nt.events  # exact floats: JSON round-trips them
        assert nb.steps == nt.steps
    assert sum(len(nt.events) for nt in back.nodes.values()) > 0
    assert any(op.cat == "COMM" for nt in back.nodes.values() for op in nt.ops.values())

    # Writing what was loaded gives the same files again (byte for byte).
    again = write_gtrace(back, tmp_path / "again")
    for name in names:
        assert (again / name).read_bytes() == (out / name).read_bytes(), name


def test_notes_travel_with_the_trace(kineto_dir: Path, tmp_path: Path) -> None:
    """The import's notes (which steps, what was left out and why) are written into the
    manifest and read back: `dpro collect -o X` then `dpro replay X` used to lose them."""
    gt = import_kineto(kineto_dir)
    gt.notes = ["worker1: steps [4] differ in structure", "a second note"]
    back = load_gtrace(write_gtrace(gt, tmp_path / "out"))
    assert back.notes == gt.notes
    gt.notes = []
    bare = write_gtrace(gt, tmp_path / "bare")
    assert "notes" not in json.loads((bare / "manifest.json").read_text())  # none: the field is left out
    assert load_gtrace(bare).notes == []


@pytest.mark.parametrize("notes", [{"a": 1}, ["fine", 3]])
def test_bad_notes_field_is_one_line(kineto_dir: Path, tmp_path: Path, notes) -> None:
    out = write_gtrace(import_kineto(kineto_dir), tmp_path / "out")
    m = json.loads((out / "manifest.json").read_text())
    m["notes"] = notes
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DproInputError, match="field 'notes' must be a list of strings"):
        load_gtrace(out)


def test_written_files_have_normal_permissions(gtrace_dir: Path) -> None:
    mask = _umask()
    assert gtrace_dir.stat().st_mode & 0o777 == 0o777 & ~mask
    for p in gtrace_dir.iterdir():
        assert p.stat().st_mode & 0o777 == 0o666 & ~mask, p.name


def test_events_file_is_a_chrome_trace(job: Path, tmp_path: Path) -> None:
    gt = import_kineto(job)
    out = write_gtrace(gt, tmp_path / "out")
    for pid, info in enumerate(gt.manifest.nodes):
        with gzip.open(out / info.events, "rt") as f:
            doc = json.load(f)  # plain JSON a viewer can read (no NaN, no orjson-only forms)
        assert isinstance(doc, dict) and doc.get("displayTimeUnit") in ("ms", "ns")
        evs = doc["traceEvents"]
        assert {e["ph"] for e in evs} == {"X", "M"}
        meta = [e for e in evs if e["ph"] == "M"]
        xs = [e for e in evs if e["ph"] == "X"]
        assert {"process_name", "thread_name"} <= {e["name"] for e in meta}
        assert any(e["name"] == "process_name" and e["args"]["name"] == info.name for e in meta)
        named_tids = {e["tid"] for e in meta if e["name"] == "thread_name"}
        for e in xs:
            assert isinstance(e["name"], str) and isinstance(e["cat"], str)
            assert e["pid"] == pid and isinstance(e["tid"], int) and e["tid"] in named_tids
            assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
            assert e["dur"] >= 0
        # timestamps are µs on the node's clock: the step markers are the profiler's steps
        nt = gt.nodes[info.name]
        steps = {e["args"]["step"]: (e["ts"], e["dur"]) for e in xs if e["cat"] == "STEP"}
        assert steps == {s: nt.steps[s] for s in gt.manifest.steps}
        ops = [e for e in xs if e["cat"] != "STEP"]
        assert len(ops) == len(nt.events)
        assert all(e["args"]["op"] in nt.ops for e in ops)
        if job.name == "kineto":  # the synthetic job: steps start every STEP_US µs from T0
            first = min(gt.manifest.steps)
            assert steps[first] == (T0, STEP_US - 100)
            assert steps[first + 1][0] - steps[first][0] == STEP_US
        else:  # the probe: iterations take tens to hundreds of milliseconds
            assert all(1e4 < dur < 1e6 for _, dur in steps.values())


def test_refuses_non_empty_directory_without_force(gtrace_dir: Path, kineto_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "existing"
    target.mkdir()
    (target / "keep.txt").write_text("precious")
    before = snapshot(target)
    with pytest.raises(DproInputError, match=r"not empty \(use --force"):
        write_gtrace(import_kineto(kineto_dir), target)
    assert snapshot(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing", "gtrace", "kineto"]


def test_refuses_to_replace_a_file_even_with_force(kineto_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "afile"
    target.write_text("precious")
    for force in (False, True):
        with pytest.raises(DproInputError, match="not a directory"):
            write_gtrace(import_kineto(kineto_dir), target, force=force)
        assert target.read_text() == "precious"


def test_writes_into_an_existing_empty_directory(kineto_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    write_gtrace(import_kineto(kineto_dir), tmp_path / "empty")
    assert load_gtrace(tmp_path / "empty").nodes


def test_force_replaces(gtrace_dir: Path, kineto_dir: Path, tmp_path: Path) -> None:
    (gtrace_dir / "stale.txt").write_text("old")
    write_gtrace(import_kineto(kineto_dir), gtrace_dir, force=True)
    assert not (gtrace_dir / "stale.txt").exists()
    assert load_gtrace(gtrace_dir).nodes
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


class _Boom(RuntimeError):
    pass


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"), _Boom("bug")])
@pytest.mark.parametrize("existing", [False, True])
def test_failure_mid_write_leaves_nothing_behind(
    exc: Exception, existing: bool, kineto_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gt = import_kineto(kineto_dir)
    out = tmp_path / "out"
    if existing:
        write_gtrace(gt, out)
        (out / "mine.txt").write_text("user file")
    before = snapshot(out) if existing else None
    calls = []
    real = gio.dump_json

    def failing(path, obj, **kw):
        calls.append(path)
        if len(calls) == 3:  # after the first node's two files
            raise exc
        return real(path, obj, **kw)

    monkeypatch.setattr(gio, "dump_json", failing)
    if isinstance(exc, OSError):
        with pytest.raises(DproInputError) as ei:
            write_gtrace(gt, out, force=True)
        assert str(ei.value) == f"{out}: cannot write: No space left on device"
    else:
        with pytest.raises(_Boom):
            write_gtrace(gt, out, force=True)
    assert len(calls) == 3
    if existing:
        assert snapshot(out) == before  # the old trace is intact
    else:
        assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["kineto"] + (["out"] if existing else []))


def test_failure_in_the_final_swap_restores_the_old_trace(
    kineto_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gt = import_kineto(kineto_dir)
    out = write_gtrace(gt, tmp_path / "out")
    (out / "mine.txt").write_text("user file")
    before = snapshot(out)
    real = Path.rename
    calls = []

    def rename(self, target):
        calls.append((self, target))
        if len(calls) == 2:  # the new trace into place
            raise OSError(errno.EIO, "Input/output error")
        return real(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(DproInputError, match="cannot write: Input/output error"):
        write_gtrace(gt, out, force=True)
    monkeypatch.undo()
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kineto", "out"]


def test_write_refuses_an_invalid_trace(kineto_dir: Path, tmp_path: Path) -> None:
    gt = import_kineto(kineto_dir)
    nt = gt.nodes["worker0"]
    a, b = nt.edges[0]
    nt.edges.append((b, a))
    with pytest.raises(DproInputError, match="the DFG has a cycle"):
        write_gtrace(gt, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    write_gtrace(gt, tmp_path / "out", check=False)  # on request it writes anyway
    with pytest.raises(DproInputError, match="the DFG has a cycle"):
        load_gtrace(tmp_path / "out")


def test_replay_same_prediction_on_kineto_and_converted_gtrace(job: Path, tmp_path: Path, run_cli) -> None:
    out = tmp_path / "converted"
    code, stdout, err = run_cli("import", "kineto", job, "-o", out)
    assert code == 0, err
    assert stdout.strip() == f"wrote {out} ({2} nodes)"
    code, stdout, err = run_cli("validate", out)
    assert code == 0 and stdout.startswith(f"{out}: ok: pytorch/gloo allreduce, 2 of 2 workers"), err
    results = []
    for path in (job, out):
        code, stdout, err = run_cli("replay", path, "--json")
        assert code == 0, err
        results.append(orjson.loads(stdout))
    k, g = results
    assert k["predicted_iteration_us"] > 0
    assert g["predicted_iteration_us"] == pytest.approx(k["predicted_iteration_us"], rel=1e-12)
    assert g["measured_iteration_us"] == pytest.approx(k["measured_iteration_us"], rel=1e-12)
    assert g["breakdown_us"] == pytest.approx(k["breakdown_us"], rel=1e-9, abs=1e-9)


def test_import_cli_refuses_then_forces(gtrace_dir: Path, kineto_dir: Path, run_cli) -> None:
    (gtrace_dir / "stale.txt").write_text("old")
    before = snapshot(gtrace_dir)
    code, out, err = run_cli("import", "kineto", kineto_dir, "-o", gtrace_dir)
    assert code == 2 and out == ""
    assert err == f"dpro: error: {gtrace_dir}: already exists and is not empty (use --force to replace it)\n"
    assert snapshot(gtrace_dir) == before
    code, out, err = run_cli("import", "kineto", kineto_dir, "-o", gtrace_dir, "--force")
    assert code == 0, err
    assert not (gtrace_dir / "stale.txt").exists()
    assert load_gtrace(gtrace_dir).nodes


@needs_probe
def test_probe_is_what_we_think() -> None:
    """The probe job the round trip runs on: 2 ranks, gloo, both collectives present."""
    assert PROBE is not None
    gt = import_kineto(PROBE)
    assert gt.manifest.library == "gloo" and gt.manifest.world_size == 2 and len(gt.nodes) == 2
    assert all(any(op.cat == "COMM" for op in nt.ops.values()) for nt in gt.nodes.values())
