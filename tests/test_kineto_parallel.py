"""The per-rank import: each rank file read and converted on its own (``import_rank``),
run by a ``mapper`` (serial, a local process pool of real spawned processes, or any
``mapper(fn, items)``), with identical results."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest
from golden import gtrace_digest

from dpro.errors import DproInputError
from dpro.importers.kineto import import_kineto
from dpro.importers.kineto.pool import process_pool_mapper, serial_mapper
from dpro.jsonio import read_options

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "examples" / "traces" / "ddp_gloo_2rank_mlp"


def test_process_pool_gives_the_serial_result():
    calls = []

    def recording(fn, items):
        calls.append([it.path.name for it in items])
        return serial_mapper(fn, items)

    serial = import_kineto(SRC, mapper=recording)
    assert calls == [["rank0.json.gz", "rank1.json.gz"]]
    pooled = import_kineto(SRC, mapper=process_pool_mapper)
    assert gtrace_digest(pooled) == gtrace_digest(serial)
    assert pooled.manifest == serial.manifest


def test_worker_error_names_the_file(tmp_path):
    d = tmp_path / "job"
    shutil.copytree(SRC, d)
    (d / "rank1.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": "x"}]}'))
    with pytest.raises(DproInputError, match=r"rank1\.json\.gz: traceEvents\[0\]: 'ts' is missing or not a number"):
        import_kineto(d, mapper=process_pool_mapper)


def test_workers_get_the_read_options(tmp_path):
    """--max-input-bytes reaches the worker processes (they do not inherit the context)."""
    with read_options(max_input_bytes=1000), pytest.raises(DproInputError, match=r"rank0\.json\.gz: .*input limit of 1000"):
        import_kineto(SRC, mapper=process_pool_mapper)


def test_duplicate_ranks_found_after_the_per_rank_import(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    for name in ("a_rank0.json.gz", "b_rank0.json.gz"):
        shutil.copy(SRC / "rank0.json.gz", d / name)
    with pytest.raises(DproInputError, match=r"b_rank0\.json\.gz: rank 0 also in a_rank0\.json\.gz"):
        import_kineto(d)


def test_default_mapper(monkeypatch):
    from dpro.importers.kineto import pool

    monkeypatch.setattr(pool, "usable_cores", lambda: 4)
    monkeypatch.delenv(pool.WORKERS_ENV, raising=False)
    assert pool.default_mapper(1, 10**10) is serial_mapper
    assert pool.default_mapper(8, 1000) is serial_mapper  # small: a worker costs more than it saves
    assert pool.default_mapper(8, 10**10).keywords == {"max_workers": 4}
    assert pool.default_mapper(3, 10**10).keywords == {"max_workers": 3}
    monkeypatch.setenv(pool.WORKERS_ENV, "2")
    assert pool.default_mapper(8, 10**10).keywords == {"max_workers": 2}
    monkeypatch.setenv(pool.WORKERS_ENV, "1")
    assert pool.default_mapper(8, 10**10) is serial_mapper
