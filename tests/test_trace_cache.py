"""The trace cache (dpro.gtrace.cache): a second open of unchanged torch.profiler traces
comes from the cache, identical to the import; a changed file, --no-cache, a cache inside
the input or a damaged entry never give a stale or wrong trace."""

from __future__ import annotations

import gzip
import logging
import os
import shutil
from pathlib import Path

import orjson
import pytest

from dpro.gtrace.cache import TraceCache, default_dir
from dpro.loader import open_trace

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "traces" / "corpus"


def _golden():
    import golden

    return golden


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("DPRO_CACHE_DIR", str(d))
    monkeypatch.delenv("DPRO_NO_CACHE", raising=False)
    return d


def entries(d: Path) -> list[Path]:
    return sorted(p for p in d.glob("*/*") if p.is_dir()) if d.is_dir() else []


def test_default_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("DPRO_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_dir() == tmp_path / "dpro" / "traces"
    monkeypatch.setenv("DPRO_CACHE_DIR", "/somewhere/else")
    assert default_dir() == Path("/somewhere/else")


CASES = [REPO / "examples" / "traces" / "ddp_gloo_2rank_mlp", REPO / "tests" / "data" / "probe"] + [
    CORPUS / n for n in ("param_dlrm_8rank", "tl_mi300_ddp_resnet18", "kineto_resnet50_nw0_old")
]


@pytest.mark.parametrize("src", [pytest.param(p, id=p.name) for p in CASES])
def test_second_open_comes_from_the_cache_identical(src, cache_dir, tmp_path, monkeypatch):
    if not src.exists():
        pytest.skip(f"{src} not here")
    golden = _golden()
    want = golden.gtrace_digest(open_trace(src, cache=False))
    first = open_trace(src)
    assert len(entries(cache_dir)) == 1 and golden.gtrace_digest(first) == want
    import dpro.importers.kineto as kin

    monkeypatch.setattr(kin, "import_kineto", lambda *a, **k: pytest.fail("imported again"))
    second = open_trace(src)
    assert golden.gtrace_digest(second) == golden.gtrace_digest(first)
    assert second.notes == first.notes and second.source == first.source
    # with the cache off: imported (here: fails), nothing new stored
    with pytest.raises(pytest.fail.Exception, match="imported again"):
        open_trace(src, cache=False)
    assert len(entries(cache_dir)) == 1


def test_a_failed_import_is_not_cached(cache_dir):
    from dpro.errors import DproInputError

    src = CORPUS / "hta_cpu_only"  # a trace dpro rejects (nothing inside the profiled steps)
    if not src.exists():
        pytest.skip(f"{src} not here")
    for _ in range(2):
        with pytest.raises(DproInputError, match="empty trace"):
            open_trace(src)
    assert entries(cache_dir) == []


def test_a_changed_file_is_imported_again(kineto_dir, cache_dir, tmp_path):
    src = tmp_path / "job"
    shutil.copytree(kineto_dir, src)
    a = open_trace(src)
    f = sorted(src.iterdir())[0]
    raw = f.read_bytes()
    doc = orjson.loads(gzip.decompress(raw) if f.name.endswith(".gz") else raw)
    for e in doc["traceEvents"]:
        if e.get("name") == "aten::relu":
            e["dur"] = e["dur"] * 3  # a different trace, same file name
    data = orjson.dumps(doc)
    f.write_bytes(gzip.compress(data) if f.name.endswith(".gz") else data)
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    b = open_trace(src)
    assert len(entries(cache_dir)) == 2
    golden = _golden()
    assert golden.gtrace_digest(a) != golden.gtrace_digest(b)
    assert golden.gtrace_digest(open_trace(src, cache=False)) == golden.gtrace_digest(b)


def test_cache_inside_the_input_is_not_used(kineto_dir, tmp_path, monkeypatch, snap):
    src = tmp_path / "job"
    shutil.copytree(kineto_dir, src)
    before = snap(src)
    monkeypatch.delenv("DPRO_NO_CACHE", raising=False)
    monkeypatch.setenv("DPRO_CACHE_DIR", str(src / "cache"))
    open_trace(src)
    open_trace(src)
    assert snap(src) == before


def test_damaged_entry_is_imported_again(kineto_dir, cache_dir, caplog):
    golden = _golden()
    want = golden.gtrace_digest(open_trace(kineto_dir))
    (entry,) = entries(cache_dir)
    (entry / "import.json").write_bytes(b'{"notes": "not a list", "source": null}')
    with caplog.at_level(logging.WARNING, logger="dpro.gtrace.cache"):
        assert golden.gtrace_digest(open_trace(kineto_dir)) == want
    assert "unusable" in caplog.text
    for f in entry.glob("*.dfg.json.gz"):
        f.write_bytes(b"garbage")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dpro.gtrace.cache"):
        assert golden.gtrace_digest(open_trace(kineto_dir)) == want
    assert "unusable" in caplog.text


def test_unwritable_cache_is_only_a_warning(kineto_dir, tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.delenv("DPRO_NO_CACHE", raising=False)
    monkeypatch.setenv("DPRO_CACHE_DIR", str(blocker / "cache"))  # under a file: cannot be made
    with caplog.at_level(logging.WARNING, logger="dpro.gtrace.cache"):
        assert open_trace(kineto_dir).nodes
    assert "cannot store" in caplog.text


def test_key_depends_on_options_and_files(kineto_dir, tmp_path):
    c = TraceCache(tmp_path)
    files = sorted(kineto_dir.iterdir())
    k = c.key(files, {"rank_pattern": "a"})
    assert k == c.key(list(reversed(files)), {"rank_pattern": "a"})
    assert k != c.key(files, {"rank_pattern": "b"})
    assert k != c.key(files[:1], {"rank_pattern": "a"})


def test_replay_no_cache_flag(run_cli, kineto_dir, cache_dir):
    code, out, _ = run_cli("replay", kineto_dir, "--no-cache", "--json")
    assert code == 0 and entries(cache_dir) == []
    code, out2, _ = run_cli("replay", kineto_dir, "--json")
    assert code == 0 and len(entries(cache_dir)) == 1
    code, out3, _ = run_cli("replay", kineto_dir, "--json")
    strip = lambda s: {k: v for k, v in orjson.loads(s).items() if k != "clock_alignment"}  # noqa: E731
    assert strip(out) == strip(out2) == strip(out3)


def _results(d: Path) -> list[Path]:
    return sorted((d / "results").glob("*.out")) if (d / "results").is_dir() else []


def test_replay_json_result_cached_identical_and_invalidated(run_cli, kineto_dir, cache_dir, tmp_path, monkeypatch):
    """A second `replay --json` prints the cached result, byte for byte the uncached one;
    another option, a changed file or --no-cache compute again."""
    src = tmp_path / "job"
    shutil.copytree(kineto_dir, src)
    code, first, _ = run_cli("replay", src, "--json")
    assert code == 0 and len(_results(cache_dir)) == 1
    import dpro.job

    open_job = dpro.job.open_job
    monkeypatch.setattr(dpro.job, "open_job", lambda *a, **k: pytest.fail("computed again"))
    code, second, _ = run_cli("replay", src, "--json")
    assert code == 0 and second == first  # from the cache, without opening the job
    with pytest.raises(pytest.fail.Exception, match="computed again"):
        run_cli("replay", src, "--json", "--no-cache")
    with pytest.raises(pytest.fail.Exception, match="computed again"):
        run_cli("replay", src, "--json", "--no-expand")
    with pytest.raises(pytest.fail.Exception, match="computed again"):
        run_cli("replay", src)  # the terminal summary is not cached
    monkeypatch.setattr(dpro.job, "open_job", open_job)
    code, uncached, _ = run_cli("replay", src, "--json", "--no-cache")
    strip = lambda s: {k: v for k, v in orjson.loads(s).items() if k != "clock_alignment"}  # noqa: E731
    assert strip(uncached) == strip(first)
    f = sorted(src.iterdir())[0]
    doc = orjson.loads(f.read_bytes())
    for e in doc["traceEvents"]:
        if e.get("name") == "aten::relu":
            e["dur"] = e["dur"] * 3
    f.write_bytes(orjson.dumps(doc))
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    code, changed, _ = run_cli("replay", src, "--json")
    assert code == 0 and len(_results(cache_dir)) == 2 and strip(changed) != strip(first)
    code, recomputed, _ = run_cli("replay", src, "--json", "--no-cache")
    assert strip(changed) == strip(recomputed)


def test_damaged_result_is_computed_again(run_cli, kineto_dir, cache_dir, caplog):
    code, first, _ = run_cli("replay", kineto_dir, "--json")
    (f,) = _results(cache_dir)
    f.write_bytes(f.read_bytes().replace(b"\"predicted", b"\"Predicted", 1))  # the digest no longer matches
    with caplog.at_level(logging.WARNING, logger="dpro.job"):
        code, again, _ = run_cli("replay", kineto_dir, "--json")
    assert code == 0 and "unusable" in caplog.text
    strip = lambda s: {k: v for k, v in orjson.loads(s).items() if k != "clock_alignment"}  # noqa: E731
    assert strip(again) == strip(first)
