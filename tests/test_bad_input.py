"""Bad input through the real command line: one line on stderr naming the file and the
cause, exit code 2, no traceback, and the input left exactly as it was.

Every case runs on `dpro replay` and `dpro validate` (and `dpro import kineto` where it
reads the same input), on a gTrace directory and on a Kineto directory where it applies.
"""

from __future__ import annotations

import gzip
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import snapshot
from input_checks import edit, jload, jsave, one_line_error

READERS = ["replay", "validate"]


# --------------------------------------------------------------------------- helpers


def run_reader(run_cli, cmd: str, path: Path, tmp_path: Path):
    if cmd == "import":
        return run_cli("import", "kineto", path, "-o", tmp_path / "imported")
    return run_cli(cmd, path)


# --------------------------------------------------------------------------- gTrace cases
# Each: mutate(gtrace_dir) -> (file the message must name, phrases it must contain)

W0_DFG, W1_DFG = "worker0.dfg.json.gz", "worker1.dfg.json.gz"
W0_EV, W1_EV = "worker0.events.json.gz", "worker1.events.json.gz"
OP0 = "aten::linear@cpu:main#0"
OP1 = "aten::relu@cpu:main#1"
COMM0 = "gloo:all_reduce@comm#0"
COMM1 = "gloo:all_reduce@comm#1"


def _truncate(d: Path):
    p = d / W1_EV
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])
    return W1_EV, ["corrupt or truncated gzip"]


def _invalid_json(d: Path):
    (d / "manifest.json").write_text('{"format": "gtrace", "version": 1,')
    return "manifest.json", ["invalid JSON"]


def _empty_file(d: Path):
    (d / W0_DFG).write_bytes(b"")
    return W0_DFG, ["empty file"]


def _empty_gzip(d: Path):
    (d / W0_EV).write_bytes(gzip.compress(b"", mtime=0))
    return W0_EV, ["empty file"]


def _no_trace_events(d: Path):
    jsave(d / W1_EV, {"displayTimeUnit": "ms"})
    return W1_EV, ["no 'traceEvents' list"]


def _empty_trace(d: Path):
    edit(d / W1_EV, lambda j: j.update(traceEvents=[e for e in j["traceEvents"] if e["ph"] != "X"]))
    return W1_EV, ["empty trace: no op events"]


def _edge_unknown_op(d: Path):
    edit(d / W0_DFG, lambda j: j["edges"].append([OP0, "ghost@cpu:main#9"]))
    return W0_DFG, ["unknown op 'ghost@cpu:main#9'", "edges["]


def _event_unknown_op(d: Path):
    def f(j):
        next(e for e in j["traceEvents"] if e["ph"] == "X" and e["cat"] != "STEP")["args"]["op"] = "ghost"

    edit(d / W0_EV, f)
    return W0_EV, ["op 'ghost' is not in the node's DFG"]


def _cycle(d: Path):
    edit(d / W1_DFG, lambda j: j["edges"].append([OP1, OP0]))
    return W1_DFG, ["the DFG has a cycle:", f"{OP0} -> {OP1} -> {OP0}"]


def _coarse_missing(d: Path):
    def f(j):
        next(o for o in j["ops"] if o["id"] == COMM1)["txn"] = "allreduce.9"

    edit(d / W1_DFG, f)
    return W0_DFG, [
        "unmatched transaction id 'allreduce.1'",
        f"collective op '{COMM1}' is missing on present rank(s) [1] (found on rank(s) [0])",
    ]


def _send_without_recv(d: Path):
    def p2p(sub_op: str, peer: int, txn: str):
        def f(j):
            op = next(o for o in j["ops"] if o["id"] == COMM0)
            op.update(sub_op=sub_op, peer=peer, txn=txn)
            op.pop("group", None)

        return f

    edit(d / W0_DFG, p2p("SEND", 1, "p2p.0"))
    edit(d / W1_DFG, p2p("RECV", 0, "p2p.1"))  # the RECV of another transfer
    return W0_DFG, [f"unmatched transaction id 'p2p.0' (SEND op '{COMM0}' has no RECV on peer rank 1)"]


def _negative_duration(d: Path):
    def f(j):
        next(e for e in j["traceEvents"] if e["ph"] == "X" and e["cat"] != "STEP")["dur"] = -3.5

    edit(d / W0_EV, f)
    return W0_EV, ["negative duration -3.5"]


def _missing_rank_file(d: Path):
    (d / W1_EV).unlink()
    return W1_EV, ["file not found (manifest.json lists it for node 'worker1')"]


def _unknown_category(d: Path):
    edit(d / W0_DFG, lambda j: j["ops"][0].update(cat="FORWARD"))
    return W0_DFG, ["unknown category 'FORWARD' (expected one of FW, BW, UPDATE, IO, COMM, OTHER)"]


def _unknown_sub_op(d: Path):
    def f(j):
        next(o for o in j["ops"] if o["id"] == COMM0)["sub_op"] = "SCATTERGATHER"

    edit(d / W0_DFG, f)
    return W0_DFG, ["unknown sub_op 'SCATTERGATHER'"]


def _newer_version(d: Path):
    edit(d / "manifest.json", lambda j: j.update(version=99))
    return "manifest.json", ["gTrace version 99 is newer than this dpro supports (1)"]


def _not_a_manifest(d: Path):
    jsave(d / "manifest.json", {"traceEvents": []})
    return "manifest.json", ['not a gTrace manifest (expected "format": "gtrace")']


def _duplicate_ranks(d: Path):
    edit(d / "manifest.json", lambda j: j["nodes"][1].update(rank=0))
    return "manifest.json", ["nodes 'worker0' and 'worker1' are both worker rank 0"]


def _rank_outside_world(d: Path):
    edit(d / "manifest.json", lambda j: j["nodes"][1].update(rank=7))
    return "manifest.json", ["node 'worker1': rank 7 is outside world_size 2"]


def _wrong_type(d: Path):
    edit(d / "manifest.json", lambda j: j.update(world_size="2"))
    return "manifest.json", ["manifest: field 'world_size' has the wrong type (str)"]


def _missing_field(d: Path):
    edit(d / W1_DFG, lambda j: j["ops"][0].pop("device"))
    return W1_DFG, ["ops[0]: missing field 'device'"]


def _bad_step_type(d: Path):
    def f(j):
        next(e for e in j["traceEvents"] if e["ph"] == "X" and e["cat"] != "STEP")["args"]["step"] = "two"

    edit(d / W1_EV, f)
    return W1_EV, ["args.step 'two' is not a 64-bit integer"]


def _negative_bytes(d: Path):
    def f(j):
        next(o for o in j["ops"] if o["id"] == COMM0)["bytes"] = -4

    edit(d / W0_DFG, f)
    return W0_DFG, [f"({COMM0}): negative bytes"]


def _dfg_is_a_directory(d: Path):
    (d / W0_DFG).unlink()
    (d / W0_DFG).mkdir()
    return W0_DFG, ["is a directory, expected a regular file"]


GTRACE_CASES = {
    f.__name__.strip("_"): f
    for f in (
        _truncate,
        _invalid_json,
        _empty_file,
        _empty_gzip,
        _no_trace_events,
        _empty_trace,
        _edge_unknown_op,
        _event_unknown_op,
        _cycle,
        _coarse_missing,
        _send_without_recv,
        _negative_duration,
        _missing_rank_file,
        _unknown_category,
        _unknown_sub_op,
        _newer_version,
        _not_a_manifest,
        _duplicate_ranks,
        _rank_outside_world,
        _wrong_type,
        _missing_field,
        _bad_step_type,
        _negative_bytes,
        _dfg_is_a_directory,
    )
}


@pytest.mark.parametrize("cmd", READERS)
@pytest.mark.parametrize("case", list(GTRACE_CASES))
def test_bad_gtrace(case: str, cmd: str, gtrace_dir: Path, tmp_path: Path, run_cli) -> None:
    fname, needles = GTRACE_CASES[case](gtrace_dir)
    before = snapshot(gtrace_dir)
    res = run_reader(run_cli, cmd, gtrace_dir, tmp_path)
    line = one_line_error(res, *needles)
    assert line.startswith(f"dpro: error: {gtrace_dir / fname}: "), line
    assert res.out == ""
    assert snapshot(gtrace_dir) == before


# --------------------------------------------------------------------------- Kineto cases
# Each: mutate(kineto_dir) -> (file the message must name, or None for the directory; phrases)


def _k_events(j) -> list[dict]:
    return j["traceEvents"]


def _k_first_op(j) -> dict:
    return next(e for e in j["traceEvents"] if e.get("cat") == "cpu_op")


def _k_truncate(d: Path):
    data = gzip.compress((d / "rank1.json").read_bytes(), mtime=0)
    (d / "rank1.json").unlink()
    (d / "rank1.json.gz").write_bytes(data[: len(data) // 2])
    return "rank1.json.gz", ["corrupt or truncated gzip"]


def _k_invalid_json(d: Path):
    (d / "rank0.json").write_text('{"traceEvents": [{"ph": "X",')
    return "rank0.json", ["invalid JSON"]


def _k_empty_file(d: Path):
    (d / "rank1.json").write_bytes(b"")
    return "rank1.json", ["empty file"]


def _k_whitespace_file(d: Path):
    (d / "rank1.json").write_text("  \n")
    return "rank1.json", ["empty file"]


def _k_no_trace_events(d: Path):
    jsave(d / "rank1.json", {"schemaVersion": 1, "distributedInfo": {"rank": 1, "world_size": 2}})
    return "rank1.json", ["not a Chrome trace (no 'traceEvents' list)"]


def _k_not_an_object(d: Path):
    (d / "rank1.json").write_text('"rank one"')
    return "rank1.json", ["not a Chrome trace (no 'traceEvents' list)"]


def _k_empty_trace(d: Path):
    edit(d / "rank1.json", lambda j: j.update(traceEvents=[e for e in _k_events(j) if e["ph"] != "X"]))
    return "rank1.json", ["empty trace: no complete ('X') events"]


def _k_unknown_categories(d: Path):
    def f(j):
        for e in _k_events(j):
            if e.get("cat") == "cpu_op":
                e["cat"] = "mystery_op"

    edit(d / "rank1.json", f)
    return "rank1.json", ["empty trace: no operator events", "categories found: mystery_op, user_annotation"]


def _k_negative_duration(d: Path):
    edit(d / "rank1.json", lambda j: _k_first_op(j).update(dur=-5))
    return "rank1.json", ["(aten::linear): negative duration -5"]


def _k_ts_not_a_number(d: Path):
    edit(d / "rank0.json", lambda j: _k_first_op(j).update(ts="1000100"))
    return "rank0.json", ["(aten::linear): 'ts' is missing or not a number ('1000100')"]


def _k_missing_ts(d: Path):
    edit(d / "rank0.json", lambda j: _k_first_op(j).pop("ts"))
    return "rank0.json", ["(aten::linear): 'ts' is missing or not a number (None)"]


def _k_args_not_object(d: Path):
    edit(d / "rank0.json", lambda j: _k_first_op(j).update(args=[1, 2]))
    return "rank0.json", ["(aten::linear): 'args' is not an object"]


def _k_tid_a_list(d: Path):
    edit(d / "rank0.json", lambda j: _k_first_op(j).update(tid=[1]))
    return "rank0.json", ["(aten::linear): 'tid' is neither a number nor a string"]


def _k_duplicate_ranks(d: Path):
    shutil.copyfile(d / "rank1.json", d / "rank1_again.json")
    return "rank1_again.json", ["rank 1 also in rank1.json (set --rank-pattern?)"]


def _k_world_size_mismatch(d: Path):
    edit(d / "rank1.json", lambda j: j["distributedInfo"].update(world_size=4))
    return "rank1.json", ["world_size 4, but rank0.json says 2: not one job"]


def _k_rank_outside_world(d: Path):
    edit(d / "rank1.json", lambda j: j["distributedInfo"].update(rank=5))
    return "rank1.json", ["rank 5 is outside world_size 2 (distributedInfo)"]


def _k_collective_missing(d: Path):
    """Rank 1 never ran the second all-reduce of a step (issue and execution gone)."""

    def f(j):
        for name in ("c10d::allreduce_", "gloo:all_reduce"):
            evs = sorted((e for e in _k_events(j) if e.get("name") == name), key=lambda e: e["ts"])
            for e in evs[1::2]:
                j["traceEvents"].remove(e)

    edit(d / "rank1.json", f)
    return None, [
        "worker0 (rank 0): unmatched transaction id 'allreduce.1': collective op "
        f"'{COMM1}' is missing on present rank(s) [1] (found on rank(s) [0])"
    ]


KINETO_CASES = {
    f.__name__.strip("_"): f
    for f in (
        _k_truncate,
        _k_invalid_json,
        _k_empty_file,
        _k_whitespace_file,
        _k_no_trace_events,
        _k_not_an_object,
        _k_empty_trace,
        _k_unknown_categories,
        _k_negative_duration,
        _k_ts_not_a_number,
        _k_missing_ts,
        _k_args_not_object,
        _k_tid_a_list,
        _k_duplicate_ranks,
        _k_world_size_mismatch,
        _k_rank_outside_world,
        _k_collective_missing,
    )
}


@pytest.mark.parametrize("cmd", READERS + ["import"])
@pytest.mark.parametrize("case", list(KINETO_CASES))
def test_bad_kineto(case: str, cmd: str, kineto_dir: Path, tmp_path: Path, run_cli) -> None:
    fname, needles = KINETO_CASES[case](kineto_dir)
    before = snapshot(kineto_dir)
    res = run_reader(run_cli, cmd, kineto_dir, tmp_path)
    line = one_line_error(res, *needles)
    if fname:
        assert line.startswith(f"dpro: error: {kineto_dir / fname}: "), line
    else:  # a cross-rank problem: the directory (or, if the importer records it, the rank's file)
        assert re.match(rf"dpro: error: {re.escape(str(kineto_dir))}(/rank\d\.json)?: ", line), line
    assert res.out == ""
    assert snapshot(kineto_dir) == before
    assert not (tmp_path / "imported").exists()  # import wrote nothing
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_kineto_single_file_is_named(kineto_dir: Path, run_cli) -> None:
    """A single rank file given directly (not its directory) is checked the same way."""
    edit(kineto_dir / "rank0.json", lambda j: _k_first_op(j).update(dur=-1))
    for cmd in READERS:
        line = one_line_error(run_cli(cmd, kineto_dir / "rank0.json"), "negative duration -1")
        assert line.startswith(f"dpro: error: {kineto_dir / 'rank0.json'}: ")


def test_kineto_missing_rank_is_an_error_unless_allowed(kineto_dir: Path, run_cli) -> None:
    """A Kineto directory holding some ranks only is an error (issue #32); with
    --allow-missing-ranks it is a partial trace, and the output says so."""
    (kineto_dir / "rank0.json").unlink()
    one_line_error(run_cli("validate", kineto_dir), "1 of 2 worker ranks present", "missing rank(s) 0",
                          "--allow-missing-ranks")
    code, out, err = run_cli("--allow-missing-ranks", "validate", kineto_dir)
    assert code == 0, err
    assert "1 of 2 workers" in out and "1 of 2 ranks present: collectives keep their measured durations" in out


def test_optimize_one_worker_without_collectives(run_cli) -> None:
    """A one-process GPU trace (no collective) cannot be optimized: one line says why and
    what to ask instead; a rank whose peers are absent gets the other reason."""
    data = Path(__file__).parent / "data"
    one_line_error(run_cli("optimize", data / "gpu_h200" / "mlp_launch_bound"), "no collective in the trace (1 worker(s))",
                   "dpro whatif PATH --workers N --platform FILE")
    one_line_error(run_cli("--allow-missing-ranks", "optimize", data / "hta_extra" / "negative_queue_rank0"),
                   "no link cost could be fitted", "on every rank of its group")


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize("cmd", READERS + ["import"])
def test_path_does_not_exist(cmd: str, tmp_path: Path, run_cli) -> None:
    missing = tmp_path / "nope"
    line = one_line_error(run_reader(run_cli, cmd, missing, tmp_path))
    assert line == f"dpro: error: {missing}: no such file or directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("cmd", READERS)
def test_directory_with_no_traces(cmd: str, tmp_path: Path, run_cli) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    line = one_line_error(run_cli(cmd, tmp_path))
    assert line == (
        f"dpro: error: {tmp_path}: neither a gTrace directory (manifest.json) nor torch.profiler traces (*.json[.gz])"
    )


def test_bad_rank_pattern(kineto_dir: Path, run_cli) -> None:
    line = one_line_error(run_cli("validate", kineto_dir, "--rank-pattern", "rank(\\d+"))
    assert "bad --rank-pattern 'rank(\\d+'" in line
    line = one_line_error(run_cli("validate", kineto_dir, "--rank-pattern", "rank\\d+"))
    assert "needs a group" in line


# --------------------------------------------------------------------------- outputs


def test_import_output_under_a_regular_file(kineto_dir: Path, tmp_path: Path, run_cli) -> None:
    blocker = tmp_path / "somefile"
    blocker.write_text("not a directory")
    before = snapshot(tmp_path)
    for out in (blocker / "out", blocker / "deeper" / "out"):
        line = one_line_error(run_cli("import", "kineto", kineto_dir, "-o", out))
        assert line == f"dpro: error: {out}: cannot write: {blocker} is a file, not a directory"
    assert snapshot(tmp_path) == before


def test_import_output_is_a_regular_file(kineto_dir: Path, tmp_path: Path, run_cli) -> None:
    blocker = tmp_path / "somefile"
    blocker.write_text("not a directory")
    before = snapshot(tmp_path)
    for extra in ([], ["--force"]):
        line = one_line_error(run_cli("import", "kineto", kineto_dir, "-o", blocker, *extra))
        assert line == f"dpro: error: {blocker}: already exists and is not a directory"
    assert snapshot(tmp_path) == before


def test_import_of_bad_trace_writes_nothing_even_with_force(gtrace_dir: Path, kineto_dir: Path, run_cli) -> None:
    """A failed import with --force leaves the existing output directory as it was."""
    before_out = snapshot(gtrace_dir)
    KINETO_CASES["k_negative_duration"](kineto_dir)
    one_line_error(run_cli("import", "kineto", kineto_dir, "-o", gtrace_dir, "--force"), "negative duration")
    assert snapshot(gtrace_dir) == before_out


@pytest.mark.parametrize("kind", ["gtrace", "kineto"])
def test_timeline_to_unwritable_path(kind: str, gtrace_dir: Path, kineto_dir: Path, tmp_path: Path, run_cli) -> None:
    src = gtrace_dir if kind == "gtrace" else kineto_dir
    blocker = tmp_path / "somefile"
    blocker.write_text("not a directory")
    before = snapshot(tmp_path)
    target = blocker / "timeline.json"
    line = one_line_error(run_cli("replay", src, "--timeline", target))
    assert line == f"dpro: error: {target}: cannot write: {blocker} is a file, not a directory"
    # a directory where the file should go
    line = one_line_error(run_cli("replay", src, "--timeline", tmp_path))
    assert line == f"dpro: error: {tmp_path}: cannot write: is a directory, expected a file name"
    assert snapshot(tmp_path) == before


def test_timeline_ok_still_works(gtrace_dir: Path, tmp_path: Path, run_cli) -> None:
    target = tmp_path / "sub" / "tl.json"
    code, out, err = run_cli("replay", gtrace_dir, "--timeline", target, "--json")
    assert code == 0, err
    doc = orjson.loads(target.read_bytes())
    assert doc["traceEvents"]
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()  # not mkstemp's 0600


def _umask() -> int:
    m = os.umask(0o022)
    os.umask(m)
    return m


# --------------------------------------------------------------------------- the real executable


def test_real_entry_point_prints_one_line(gtrace_dir: Path, tmp_path: Path) -> None:
    """`python -m dpro.cli` (what the installed `dpro` runs) behaves like the in-process runs."""
    GTRACE_CASES["cycle"](gtrace_dir)
    blocker = tmp_path / "somefile"
    blocker.write_text("x")
    for args, needle in (
        (["validate", str(gtrace_dir)], "the DFG has a cycle"),
        (["import", "kineto", str(tmp_path / "nope"), "-o", str(tmp_path / "o")], "no such file or directory"),
        (["replay", str(gtrace_dir.parent / "kineto"), "--timeline", str(blocker / "t.json")], "is a file, not a directory"),
    ):
        r = subprocess.run([sys.executable, "-m", "dpro.cli", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr + r.stdout
        assert len(r.stderr.splitlines()) == 1 and needle in r.stderr, r.stderr
        assert r.stdout == ""


# --------------------------------------------------------------------------- random damage

_JUNK = [None, -1, 0, 1, 2.5, "x", "", [], {}, [1], {"a": 1}, True, "FW", "COMM", "SEND", 99, 10**18]


def _damage(obj, rnd: random.Random) -> None:
    """Delete or overwrite one randomly chosen value somewhere inside ``obj``."""
    spots = []

    def walk(x, parent, key):
        if parent is not None:
            spots.append((parent, key))
        items = x.items() if isinstance(x, dict) else enumerate(x[:40]) if isinstance(x, list) else ()
        for k, v in items:
            walk(v, x, k)

    walk(obj, None, None)
    parent, key = rnd.choice(spots)
    if rnd.random() < 0.3:
        del parent[key]
    else:
        parent[key] = rnd.choice(_JUNK)


@pytest.mark.parametrize("kind", ["gtrace", "kineto"])
def test_random_damage_never_gives_a_traceback(kind: str, gtrace_dir: Path, kineto_dir: Path, run_cli) -> None:
    """Seeded: 60 randomly damaged copies; each is accepted or refused in one line."""
    src = gtrace_dir if kind == "gtrace" else kineto_dir
    rnd = random.Random(f"dpro-{kind}")
    work = src.parent / f"damaged-{kind}"
    refused = 0
    for _ in range(60):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(src, work)
        files = sorted(work.iterdir())
        for _ in range(rnd.randint(1, 3)):
            f = rnd.choice(files)
            obj = jload(f)
            _damage(obj, rnd)
            jsave(f, obj)
        before = snapshot(work)
        for cmd in ("validate", "replay"):
            code, out, err = run_cli(cmd, work)  # an unexpected exception fails the test here
            assert "Traceback" not in out + err
            if code:
                assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"dpro: error: {work}"), err
                refused += cmd == "validate"
            else:
                assert err == ""
        assert snapshot(work) == before
    assert refused > 10  # the damage is mostly noticed


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_stdout_write_error_is_one_line(gtrace_dir: Path) -> None:
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-m", "dpro.cli", "validate", str(gtrace_dir)], stdout=full, stderr=subprocess.PIPE, text=True
        )
    assert "Traceback" not in r.stderr
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "No space left on device" in r.stderr
