"""Issue #32: one regression test per failure class a mutation fuzzer found (hostile and
broken input). Each runs the real command line in-process (click's CliRunner, exceptions
not caught, so a traceback fails the test) on a real synthetic job (conftest) and checks:
exit 2, one line on stderr naming the file and the problem, nothing written outside OUT.

FIFOs are read under a SIGALRM guard: a hang fails the test instead of blocking it.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest
from conftest import snapshot
from fuzz.fuzzlib import deadline
from input_checks import edit, one_line_error
from scriptmod import load_script

MANIFEST = "manifest.json"


def first_x(trace: dict, name_prefix: str = "aten::") -> dict:
    return next(e for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"].startswith(name_prefix))


# --------------------------------------------------------------------------- crashes


@pytest.mark.parametrize("field", ["ts", "name"])
@pytest.mark.parametrize("cmd", ["validate", "replay", "import"])
def test_deeply_nested_value_is_a_clean_error(field: str, cmd: str, kineto_dir: Path, tmp_path: Path, run_cli) -> None:
    """Classes 1 and 2: a value nested 1,000 lists deep (orjson accepts it) used to hit a
    RecursionError in the message's repr (read.py) or in segments.py."""
    edit(kineto_dir / "rank0.json", lambda t: first_x(t).update({field: "@NESTED@"}))
    f = kineto_dir / "rank0.json"
    f.write_bytes(f.read_bytes().replace(b'"@NESTED@"', b"[" * 1000 + b"1" + b"]" * 1000, 1))
    args = ("import", "kineto", kineto_dir, "-o", tmp_path / "out") if cmd == "import" else (cmd, kineto_dir)
    one_line_error(run_cli(*args), str(kineto_dir / "rank0.json"), "nested more than 255 deep")
    assert not (tmp_path / "out").exists()


def _huge_step(t: dict) -> None:
    next(e for e in t["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))["name"] = "ProfilerStep#" + "9" * 23


def _huge_nelems(t: dict) -> None:
    for e in t["traceEvents"]:
        if e.get("name") == "gloo:all_reduce":
            e["args"]["In msg nelems"] = 2**63


def _huge_dims(t: dict) -> None:
    for e in t["traceEvents"]:
        if e.get("name") in ("gloo:all_reduce", "c10d::allreduce_"):
            e["args"]["Input Dims"] = [[10**18, 10**18]]


@pytest.mark.parametrize("mutate", [_huge_step, _huge_nelems, _huge_dims], ids=["step", "nelems", "dims"])
@pytest.mark.parametrize("cmd", ["validate", "replay", "import"])
def test_numbers_beyond_64_bits(mutate, cmd: str, kineto_dir: Path, tmp_path: Path, run_cli) -> None:
    """Class 3: a step number, message size or tensor shape beyond 64 bits crashed
    `import kineto` when writing (jsonio), while validate and replay said ok. Now every
    command either refuses it in one line or accepts it and writes a loadable trace."""
    for f in ("rank0.json", "rank1.json"):
        edit(kineto_dir / f, mutate)
    args = ("import", "kineto", kineto_dir, "-o", tmp_path / "out") if cmd == "import" else (cmd, kineto_dir)
    code, out, err = run_cli(*args)
    if code == 0:  # the value was not used (e.g. a shape the importer ignores): the output must load
        assert "Traceback" not in err
        if cmd == "import":
            assert run_cli("validate", tmp_path / "out").code == 0
    else:
        one_line_error((code, out, err), "64")


def test_byteps_absurd_partition_count(tmp_path: Path, run_cli) -> None:
    """Class 4: "partitioned to 10^26 parts" in a BytePS log: OverflowError/MemoryError."""
    mod = load_script("make_traces", "tests/data/byteps/make_traces.py")
    raw = tmp_path / "raw"
    mod.generate(raw, machines=1, gpus=2, servers=1, steps=2, start_step=1, seed=0)
    log = next(raw.rglob("*.log"))
    text = log.read_text()
    import re

    text = re.sub(r"partitioned to \d+ part", "partitioned to " + "1" + "0" * 26 + " part", text, count=1)
    log.write_text(text)
    one_line_error(run_cli("import", "byteps", raw, "-o", tmp_path / "out"), str(log), "out of range")


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom"])
def test_device_files_are_not_read(target: str, gtrace_dir: Path, kineto_dir: Path, tmp_path: Path, run_cli) -> None:
    """Class 5: a manifest path, a ps-lite file, a comm.json or a rank file that is (a link
    to) a device was read without bound (MemoryError)."""
    ev = gtrace_dir / "worker0.events.json.gz"
    ev.unlink()
    ev.symlink_to(target)
    with deadline():
        one_line_error(run_cli("validate", gtrace_dir), str(ev), "is a character device, expected a regular file")
    (kineto_dir / "rank1.json").unlink()
    (kineto_dir / "rank1.json").symlink_to(target)
    with deadline():
        one_line_error(run_cli("validate", kineto_dir), "rank1.json", "character device")
    ps = tmp_path / "ps"
    ps.mkdir()
    (ps / "pslite.host.1.jsonl").symlink_to(target)
    with deadline():
        one_line_error(run_cli("import", "pslite", ps, "-o", tmp_path / "o1"), "pslite.host.1.jsonl", "character device")
    bp = tmp_path / "bp" / "0"
    bp.mkdir(parents=True)
    (bp / "comm.json").symlink_to(target)
    with deadline():
        one_line_error(run_cli("import", "byteps", tmp_path / "bp", "-o", tmp_path / "o2"), "comm.json", "character device")


@pytest.mark.parametrize("ws", [10**12, 10**8, 2**63 - 1])
def test_absurd_world_size(ws: int, gtrace_dir: Path, run_cli) -> None:
    """Class 6: world_size 10^12 in the manifest: MemoryError in validate (set(range(...)))."""
    edit(gtrace_dir / MANIFEST, lambda m: m.update(world_size=ws))
    with deadline():
        one_line_error(run_cli("validate", gtrace_dir), f"world_size {ws} is out of range")
        one_line_error(run_cli("--allow-missing-ranks", "replay", gtrace_dir), "out of range")


def test_world_size_beyond_the_files_is_missing_ranks(gtrace_dir: Path, run_cli) -> None:
    edit(gtrace_dir / MANIFEST, lambda m: m.update(world_size=4))
    one_line_error(run_cli("validate", gtrace_dir), "2 of 4 worker ranks present", "missing rank(s) 2, 3")
    code, out, err = run_cli("--allow-missing-ranks", "validate", gtrace_dir)
    assert code == 0, err
    assert "2 of 4 workers" in out and "missing rank(s) 2, 3" in out


# --------------------------------------------------------------------------- hangs


def test_fifos_never_block(gtrace_dir: Path, kineto_dir: Path, tmp_path: Path, run_cli) -> None:
    """A FIFO as a manifest's events file, a BytePS comm.json, a ps-lite .jsonl or the
    manifest itself blocked forever; the FIFO manifest was blamed on another file."""
    ev = gtrace_dir / "worker1.events.json.gz"
    ev.unlink()
    os.mkfifo(ev)
    with deadline():
        one_line_error(run_cli("validate", gtrace_dir), str(ev), "is a FIFO (named pipe)")
    g2 = tmp_path / "g2"
    g2.mkdir()
    for f in gtrace_dir.iterdir():
        if f.name != "worker1.events.json.gz":
            (g2 / f.name).write_bytes(f.read_bytes())
    (g2 / MANIFEST).unlink()
    os.mkfifo(g2 / MANIFEST)
    with deadline():
        one_line_error(run_cli("replay", g2), str(g2 / MANIFEST), "FIFO")
    ps = tmp_path / "ps"
    ps.mkdir()
    os.mkfifo(ps / "pslite.host.1.jsonl")
    with deadline():
        one_line_error(run_cli("import", "pslite", ps, "-o", tmp_path / "o1"), "pslite.host.1.jsonl", "FIFO")
    bp = tmp_path / "bp" / "0"
    bp.mkdir(parents=True)
    os.mkfifo(bp / "comm.json")
    with deadline():
        one_line_error(run_cli("import", "byteps", tmp_path / "bp", "-o", tmp_path / "o2"), "comm.json", "FIFO")


# --------------------------------------------------------------------------- escapes


def test_node_name_cannot_escape_the_output(gtrace_dir: Path, tmp_path: Path, run_cli) -> None:
    """A node named ``../ESCAPED`` made `dpro align IN -o OUT` write beside OUT."""
    def rename(m):
        m["nodes"][0]["name"] = "../ESCAPED"

    edit(gtrace_dir / MANIFEST, rename)
    before = sorted(p.name for p in tmp_path.iterdir())
    one_line_error(run_cli("align", gtrace_dir, "-o", tmp_path / "OUT"), "node name '../ESCAPED' must be a plain name")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_write_gtrace_confines_node_names(gtrace_dir: Path, tmp_path: Path) -> None:
    """Even a trace built in memory with a hostile node name writes only inside OUT."""
    from dpro.gtrace.io import load_gtrace, write_gtrace

    gt = load_gtrace(gtrace_dir)
    nt = gt.nodes.pop("worker0")
    nt.info.name = "../../ESCAPED"
    nt.info.events = nt.info.dfg = "/tmp/x/../ESCAPED"
    gt.nodes[nt.info.name] = nt
    out = tmp_path / "deep" / "OUT"
    write_gtrace(gt, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep", "gtrace", "kineto"]
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["OUT"]
    assert "node0.events.json.gz" in {p.name for p in out.iterdir()}


@pytest.mark.parametrize("where", ["../x", "/etc/passwd", "/proc/self/environ", "sub/../../x"])
def test_manifest_paths_stay_inside(where: str, gtrace_dir: Path, run_cli) -> None:
    """Manifest paths such as ../x, /etc/passwd and /proc/self/environ were opened."""
    edit(gtrace_dir / MANIFEST, lambda m: m["nodes"][1].update(events=where))
    one_line_error(run_cli("validate", gtrace_dir), str(gtrace_dir / MANIFEST),
                   f"field 'events' ('{where}') must name a file inside the trace directory")


def test_symlink_out_of_the_trace_dir_is_refused(gtrace_dir: Path, tmp_path: Path, run_cli) -> None:
    outside = tmp_path / "outside.json.gz"
    (gtrace_dir / "worker1.dfg.json.gz").rename(outside)
    (gtrace_dir / "worker1.dfg.json.gz").symlink_to(outside)
    one_line_error(run_cli("validate", gtrace_dir), "worker1.dfg.json.gz", "links outside the trace directory")


# --------------------------------------------------------------------------- silent skips


def _dir(p: Path) -> None:
    p.mkdir()


def _broken(p: Path) -> None:
    p.symlink_to(p.parent / "nowhere.json")


def _loop(p: Path) -> None:
    p.symlink_to(p)


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _zero(p: Path) -> None:
    p.symlink_to("/dev/zero")


@pytest.mark.parametrize("make,why", [(_dir, "is a directory"), (_broken, "broken symbolic link"),
                                      (_loop, "cannot read"), (_fifo, "FIFO"), (_zero, "character device")],
                         ids=["dir", "broken-link", "link-loop", "fifo", "dev-zero"])
def test_every_rank_file_is_read_or_reported(make, why: str, kineto_dir: Path, run_cli, caplog) -> None:
    """A file named like a rank file was dropped without a word ("ok: 2 of 2 workers" for a
    folder of 3 rank files). Now an error naming it, or with --allow-missing-ranks a warning."""
    bad = kineto_dir / "rank2.json"
    make(bad)
    with deadline():
        one_line_error(run_cli("validate", kineto_dir), str(bad), why, "--allow-missing-ranks")
        code, out, err = run_cli("--allow-missing-ranks", "validate", kineto_dir)
    assert code == 0, err
    assert f"{bad}: " in caplog.text and why in caplog.text and "skipped (--allow-missing-ranks)" in caplog.text


def test_unlisted_node_file_is_reported(gtrace_dir: Path, run_cli, caplog) -> None:
    """A node file of a gTrace directory that its manifest does not list is said, not dropped silently."""
    (gtrace_dir / "worker7.events.json.gz").write_bytes((gtrace_dir / "worker1.events.json.gz").read_bytes())
    code, out, err = run_cli("validate", gtrace_dir)
    assert code == 0, err
    assert f"{gtrace_dir / 'worker7.events.json.gz'}: not listed in manifest.json; ignored" in caplog.text


def test_two_nodes_cannot_share_an_events_file(gtrace_dir: Path, run_cli) -> None:
    edit(gtrace_dir / MANIFEST, lambda m: m["nodes"][1].update(events=m["nodes"][0]["events"]))
    one_line_error(run_cli("validate", gtrace_dir), "nodes 'worker0' and 'worker1' share the file 'worker0.events.json.gz'")


# --------------------------------------------------------------------------- wrong successes


def _rename_marker(t: dict) -> None:
    for e in t["traceEvents"]:
        if e.get("name", "").startswith("ProfilerStep#"):
            e["name"] = e["name"].replace("ProfilerStep#", "ProfilerStep#1")  # steps 11, 12, 13


def _arabic_digit(t: dict) -> None:
    for e in t["traceEvents"]:
        if e.get("name", "").startswith("ProfilerStep#"):
            e["name"] = "ProfilerStep#" + chr(0x0660 + int(e["name"][-1]) + 5)


@pytest.mark.parametrize("mutate", [_rename_marker, _arabic_digit], ids=["renamed", "arabic-digit"])
@pytest.mark.parametrize("cmd", ["validate", "replay"])
def test_no_common_step_is_an_error(mutate, cmd: str, kineto_dir: Path, run_cli) -> None:
    """No step common to all ranks gave "ok ... steps []" and measured_iteration_us null."""
    edit(kineto_dir / "rank1.json", mutate)
    one_line_error(run_cli(cmd, kineto_dir), str(kineto_dir), "no step is common to all ranks")


def test_manifest_steps_must_be_in_the_events(gtrace_dir: Path, run_cli) -> None:
    """`steps: [10^18]` predicted 0.0 µs with exit 0."""
    edit(gtrace_dir / MANIFEST, lambda m: m.update(steps=[10**18]))
    one_line_error(run_cli("replay", gtrace_dir), str(gtrace_dir), "lists step(s) 1000000000000000000, which no events hold")


@pytest.mark.parametrize("cmd", ["validate", "replay"])
def test_astronomical_times(cmd: str, gtrace_dir: Path, kineto_dir: Path, run_cli) -> None:
    """`ts` 1.7e308 with `dur` 1e300 predicted 5.7e307 µs with negative breakdown parts."""
    def far(t):
        e = next(e for e in t["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "STEP")
        e.update(ts=1.7e308, dur=1e300)

    edit(gtrace_dir / "worker0.events.json.gz", far)
    one_line_error(run_cli(cmd, gtrace_dir), "worker0.events.json.gz", "out of range")
    edit(kineto_dir / "rank0.json", far)
    one_line_error(run_cli(cmd, kineto_dir), "rank0.json", "out of range")


# --------------------------------------------------------------------------- messages


def test_control_characters_are_escaped(kineto_dir: Path, tmp_path: Path, run_cli) -> None:
    """Newlines in file names or fields were printed raw: multi-line errors."""
    bad = kineto_dir / "rank1\nINJECTED.json"
    (kineto_dir / "rank1.json").rename(bad)
    edit(bad, lambda t: first_x(t).update(name="evil\nname\r\x1b[31m", dur=-1))
    line = one_line_error(run_cli("validate", kineto_dir), "rank1\\nINJECTED.json", "evil\\nname\\r\\x1b[31m")
    assert "\x1b" not in line


def test_nul_bytes_are_called_binary(gtrace_dir: Path, run_cli) -> None:
    """A file of NULs read as "Not enough memory to allocate buffer"."""
    (gtrace_dir / "worker0.dfg.json.gz").write_bytes(b"\0" * 4096)
    one_line_error(run_cli("validate", gtrace_dir), "worker0.dfg.json.gz", "binary data (NUL bytes), not JSON")


def test_leftover_temporary_output_is_cleaned(kineto_dir: Path, tmp_path: Path, run_cli) -> None:
    """A killed `dpro import -o OUT` leaves `.OUT.tmp<pid>-*`; the next run removes it (its
    process is gone) and never touches a live writer's."""
    dead = tmp_path / ".OUT.tmp999999999-abc"  # no such pid
    dead.mkdir()
    (dead / "manifest.json").write_text("{}")
    live = tmp_path / f".OUT.tmp{os.getppid()}-abc"
    live.mkdir()
    code, out, err = run_cli("import", "kineto", kineto_dir, "-o", tmp_path / "OUT")
    assert code == 0, err
    assert not dead.exists() and live.is_dir()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".OUT.") and p != live]


def test_interrupted_swap_restores_the_previous_output(tmp_path: Path, kineto_dir: Path, run_cli) -> None:
    """Killed between moving the old OUT aside and moving the new one in: the next run puts
    the old one back before writing (nothing of the user's is lost)."""
    old = tmp_path / ".OUT.old999999999-x"
    (old / "x").mkdir(parents=True)
    (old / "x" / "keep.txt").write_text("mine")
    code, out, err = run_cli("import", "kineto", kineto_dir, "-o", tmp_path / "OUT")
    assert code == 2 and "not empty" in err  # the restored OUT is not replaced without --force
    assert (tmp_path / "OUT" / "keep.txt").read_text() == "mine" and not old.exists()


# --------------------------------------------------------------------------- size


def test_gzip_bomb_is_bounded(gtrace_dir: Path, run_cli) -> None:
    """A small gzip that expands past the limit is refused (the message names the limit);
    --max-input-bytes raises it."""
    ev = gtrace_dir / "worker0.events.json.gz"
    data = gzip.decompress(ev.read_bytes())
    bomb = data[:-1] + b" " * (3 * 2**20) + data[-1:]  # valid JSON padded with 3 MiB of spaces
    ev.write_bytes(gzip.compress(bomb, mtime=0))
    assert ev.stat().st_size < 64 * 1024
    one_line_error(run_cli("--max-input-bytes", "2MiB", "validate", gtrace_dir), str(ev),
                   "decompresses to more than the input limit of 2097152 bytes", "--max-input-bytes")
    assert run_cli("--max-input-bytes", "8MiB", "validate", gtrace_dir).code == 0
    assert run_cli("validate", gtrace_dir).code == 0


def test_plain_file_over_the_limit(kineto_dir: Path, run_cli) -> None:
    one_line_error(run_cli("--max-input-bytes", "1000", "replay", kineto_dir), "rank0.json", "more than the input limit of 1000 bytes")


def test_input_is_left_unchanged(gtrace_dir: Path, tmp_path: Path, run_cli) -> None:
    before = snapshot(gtrace_dir)
    edit(gtrace_dir / MANIFEST, lambda m: m.update(world_size=10**12))
    before = snapshot(gtrace_dir)
    one_line_error(run_cli("align", gtrace_dir, "-o", tmp_path / "OUT"))
    assert snapshot(gtrace_dir) == before


@pytest.mark.parametrize("make,why", [(_broken, "broken symbolic link"), (_zero, "character device"), (_fifo, "FIFO")],
                         ids=["broken-link", "dev-zero", "fifo"])
def test_recording_timeline_is_read_or_reported(make, why: str, tmp_path: Path, run_cli) -> None:
    """A Horovod timeline that is not a regular file was ignored by `dpro collect` (found by
    the fuzzer, benchmarks/fuzz.py): now an error naming it."""
    import shutil

    src = Path(__file__).parent / "data" / "golden" / "recordings" / "horovod_torch_mlp" / "raw"
    if not src.is_dir():
        pytest.skip("no Horovod recording")
    raw = tmp_path / "raw"
    shutil.copytree(src, raw)
    (raw / "horovod_timeline.json").unlink()
    make(raw / "horovod_timeline.json")
    with deadline():
        one_line_error(run_cli("collect", raw, "-o", tmp_path / "OUT"), str(raw / "horovod_timeline.json"), why)
    assert not (tmp_path / "OUT").exists()


def test_recording_timeline_nested_deep(tmp_path: Path, run_cli) -> None:
    """A Horovod timeline record nested 1,000 deep hit a RecursionError (timeline.py reads it
    with its own salvaging parser; found by the fuzzer): now the timeline is refused like any
    unusable timeline, and the output says so."""
    import shutil

    src = Path(__file__).parent / "data" / "golden" / "recordings" / "horovod_torch_mlp" / "raw"
    if not src.is_dir():
        pytest.skip("no Horovod recording")
    raw = tmp_path / "raw"
    shutil.copytree(src, raw)
    tl = raw / "horovod_timeline.json"
    text = tl.read_bytes()
    i = text.index(b'"ph"')
    tl.write_bytes(text[:i] + b'"ph": ' + b"[" * 1000 + b"1" + b"]" * 1000 + b', "was_ph"' + text[i + 4:])
    code, out, err = run_cli("collect", raw, "-o", tmp_path / "OUT")
    assert code == 0, err
    assert "horovod timeline not used" in out and "nested more than 255 deep" in out


def test_recorded_allocation_beyond_64_bits(tmp_path: Path, run_cli) -> None:
    """A recorded allocation of 2^64-1 bytes crashed `dpro collect` writing its memory sums
    (found by the fuzzer); now a clean error naming the user's file (not the merged copy)."""
    import shutil

    src = Path(__file__).parent / "data" / "golden" / "recordings" / "ddp_mlp" / "raw"
    raw = tmp_path / "raw"
    shutil.copytree(src, raw)

    def huge(t):
        next(e for e in t["traceEvents"] if e.get("name") == "[memory]")["args"]["Bytes"] = 2**64 - 1

    edit(raw / "rank1.json.gz", huge)
    one_line_error(run_cli("collect", raw, "-o", tmp_path / "OUT"), f"{raw / 'rank1.json.gz'}: a [memory] event",
                   "out of range")
    assert not (tmp_path / "OUT").exists()


def test_meta_memory_that_is_not_an_object(tmp_path: Path, run_cli) -> None:
    """A rank's meta.json whose 'memory' is a number crashed `dpro collect` (TypeError in
    importers/recording/allocations.py; found by the final 10,000-case fuzzing run): now a
    clean error naming the meta file."""
    import shutil

    src = Path(__file__).parent / "data" / "golden" / "recordings" / "ddp_mlp" / "raw"
    raw = tmp_path / "raw"
    shutil.copytree(src, raw)
    edit(raw / "rank0.meta.json", lambda m: m.__setitem__("memory", 5))
    one_line_error(run_cli("collect", raw, "-o", tmp_path / "OUT"), f"{raw / 'rank0.meta.json'}: unexpected rank meta data",
                   "'memory' is not an object")
    assert not (tmp_path / "OUT").exists()
