"""The ``dpro`` console entry's fast path (dpro/entry.py): a cached plain ``replay --json``
printed without loading the CLI, byte for byte what the full CLI prints; anything else runs
the full CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from dpro import entry, resultcache

REPO = Path(__file__).resolve().parents[1]
#: the console script pip generates from [project.scripts], plus a check that click stayed unloaded
FAST = ("import sys; from dpro.entry import main; sys.argv[0] = 'dpro'; main(); "
        "sys.stderr.write('click loaded' if 'click' in sys.modules else 'click not loaded')")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("DPRO_CACHE_DIR", str(d))
    for var in ("DPRO_NO_CACHE", "DPRO_ENGINE", "DPRO_MAX_INPUT_BYTES", "DPRO_ALLOW_MISSING_RANKS"):
        monkeypatch.delenv(var, raising=False)
    return d


@pytest.fixture
def job(tmp_path, kineto_dir) -> Path:
    d = tmp_path / "job"
    shutil.copytree(kineto_dir, d)
    return d


def _dpro(*args: object, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", FAST, *map(str, args)], env=env, stdout=stdout,
                          stderr=subprocess.PIPE, timeout=300)


def test_fast_path_prints_the_first_replays_bytes_without_click(run_cli, job, cache_dir):
    code, first, _ = run_cli("replay", job, "--json")  # the full CLI: computes and stores
    assert code == 0
    assert first.encode() == orjson.dumps(orjson.loads(first), option=orjson.OPT_INDENT_2) + b"\n"  # print_json's
    assert entry.cached_replay(["replay", str(job), "--json"]) == first.encode()
    p = _dpro("replay", job, "--json")
    assert p.returncode == 0 and p.stdout == first.encode() and p.stderr == b"click not loaded"
    code, full_hit, _ = run_cli("replay", job, "--json")  # the full CLI's hit: the same bytes
    assert code == 0 and full_hit == first
    code, uncached, _ = run_cli("replay", job, "--json", "--no-cache")
    a, b = orjson.loads(uncached), orjson.loads(first)
    a["clock_alignment"]["time_s"] = b["clock_alignment"]["time_s"]  # the solver's wall time
    assert orjson.dumps(a, option=orjson.OPT_INDENT_2) + b"\n" == first.encode()


@pytest.mark.parametrize("args", [
    ("--no-expand",), ("--no-align",), ("--rank-pattern", r"rank(\d+)"), (r"--rank-pattern=rank(\d+)",),
])
def test_options_are_part_of_the_key(run_cli, job, cache_dir, args):
    code, out, _ = run_cli("replay", job, "--json", *args)
    assert code == 0
    assert entry.cached_replay(["replay", str(job), "--json", *args]) == out.encode()
    assert entry.cached_replay(["replay", str(job), "--json"]) is None  # another option: a miss


def test_group_options_and_their_variables(run_cli, job, cache_dir, monkeypatch):
    code, out, _ = run_cli("--max-input-bytes", "1GiB", "--allow-missing-ranks", "replay", job, "--json")
    assert code == 0
    assert entry.cached_replay(["--allow-missing-ranks", "--max-input-bytes=1GiB", "replay", str(job), "--json"]) \
        == out.encode()
    assert entry.cached_replay(["--allow-missing-ranks", "replay", str(job), "--json"]) is None
    monkeypatch.setenv("DPRO_MAX_INPUT_BYTES", "1073741824")
    assert entry.cached_replay(["--allow-missing-ranks", "replay", str(job), "--json"]) == out.encode()
    assert entry.cached_replay(["--allow-missing-ranks", "--max-input-bytes", "", "replay", str(job), "--json"]) \
        is None  # an empty size is the CLI's error, not the variable's value


def test_a_touched_file_or_another_code_fingerprint_misses(run_cli, job, cache_dir, monkeypatch):
    code, out, _ = run_cli("replay", job, "--json")
    argv = ["replay", str(job), "--json"]
    assert entry.cached_replay(argv) == out.encode()
    monkeypatch.setattr(resultcache, "code_fingerprint", lambda: "another dpro")
    assert entry.cached_replay(argv) is None
    monkeypatch.undo()
    monkeypatch.setenv("DPRO_CACHE_DIR", str(cache_dir))
    f = sorted(job.iterdir())[0]
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert entry.cached_replay(argv) is None
    monkeypatch.setenv("DPRO_ENGINE", "python")
    assert entry.cached_replay(argv) is None
    monkeypatch.setenv("DPRO_NO_CACHE", "1")
    assert entry.cached_replay(argv) is None


def test_code_fingerprint_follows_the_package_files(tmp_path):
    """Editing a file of the package (even to the same size), adding or removing one changes it."""
    pkg = tmp_path / "dpro"
    shutil.copytree(Path(resultcache.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    base = resultcache._tree_stats(str(pkg))
    f = pkg / "replayer" / "replay.py"
    st = f.stat()
    f.write_bytes(f.read_bytes().replace(b"def ", b"def_", 1))  # same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    edited = resultcache._tree_stats(str(pkg))
    assert edited != base
    (pkg / "new.py").write_text("")
    added = resultcache._tree_stats(str(pkg))
    assert added not in (base, edited)
    (pkg / "new.py").unlink()
    assert resultcache._tree_stats(str(pkg)) == edited
    fp = resultcache.code_fingerprint()
    assert len(fp) == 64 and fp == resultcache.code_fingerprint()


@pytest.mark.parametrize("argv", [
    ["replay", "P"], ["replay", "P", "--json", "--timeline", "t.json"], ["replay", "P", "--json", "--no-cache"],
    ["-v", "replay", "P", "--json"], ["replay", "P", "--json", "--top", "3"], ["replay", "P", "Q", "--json"],
    ["replay", "P", "--json", "--json"], ["replay", "--json"], ["replay", "P", "--json", "--ray", "local"],
    ["replay", "P", "--json", "--allow-missing-ranks"], ["--json", "replay", "P"], ["validate", "P", "--json"],
    ["replay", "P", "--json=1"], ["replay", "P", "--json", "--rank-pattern"], ["replay", "P", "--json", "-h"],
    ["replay", "-", "--json"], ["replay", "P", "--json", "--rank-pattern", "--no-align"], [],
])
def test_other_command_lines_are_not_the_fast_paths(argv):
    assert entry.parse_plain_replay(argv) is None


def test_parse_plain_replay():
    assert entry.parse_plain_replay(["--max-input-bytes", "1g", "replay", "--no-align", "replay", "--json"]) == {
        "path": "replay", "expand_collectives": True, "align": False, "rank_pattern": entry.DEFAULT_RANK_PATTERN,
        "max_input_bytes": "1g", "allow_missing_ranks": False}


def test_the_fallback_runs_the_full_cli(monkeypatch, job, cache_dir):
    import dpro.cli

    calls = []
    monkeypatch.setattr(dpro.cli, "main", lambda: calls.append(list(sys.argv)))
    for argv in (["dpro", "replay", str(job), "--json"], ["dpro", "replay", str(job), "--json", "--top", "3"]):
        monkeypatch.setattr(sys, "argv", argv)
        entry.main()  # a miss, then an option the fast path does not know
    assert calls == [["dpro", "replay", str(job), "--json"], ["dpro", "replay", str(job), "--json", "--top", "3"]]


def test_defaults_agree_with_the_full_cli():
    from dpro.importers.kineto.read import DEFAULT_RANK_PATTERN
    from dpro.jsonio import DEFAULT_MAX_INPUT_BYTES
    from dpro.sizes import DEFAULT_MAX_INPUT, parse_size

    assert entry.DEFAULT_RANK_PATTERN == DEFAULT_RANK_PATTERN
    assert entry.DEFAULT_MAX_INPUT == DEFAULT_MAX_INPUT
    assert entry.DEFAULT_MAX_INPUT_BYTES == parse_size(DEFAULT_MAX_INPUT, "x") == DEFAULT_MAX_INPUT_BYTES


def test_bad_input_and_a_damaged_entry_get_the_full_clis_answer(run_cli, job, cache_dir, tmp_path):
    p = _dpro("replay", tmp_path / "missing", "--json")
    assert p.returncode == 2 and p.stdout == b""
    assert p.stderr.decode().splitlines() == [f"dpro: error: {tmp_path / 'missing'}: no such file or directory"]
    code, first, _ = run_cli("replay", job, "--json")
    (f,) = (cache_dir / "results").glob("*.out")
    f.write_bytes(f.read_bytes().replace(b"\"predicted", b"\"Predicted", 1))
    p = _dpro("replay", job, "--json")  # damaged: the full CLI warns and computes again
    assert p.returncode == 0 and b"unusable" in p.stderr
    assert orjson.loads(p.stdout)["predicted_iteration_us"] == orjson.loads(first)["predicted_iteration_us"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_stdout_is_the_full_clis_one_line_error(run_cli, job, cache_dir):
    run_cli("replay", job, "--json")
    with open("/dev/full", "wb") as full:
        p = _dpro("replay", job, "--json", stdout=full)
    assert p.returncode == 2
    assert p.stderr.decode().splitlines()[0] == "dpro: error: No space left on device"
