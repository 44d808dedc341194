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
from dpro.executor import ProcessPool, serial
from dpro.jsonio import read_options

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "examples" / "traces" / "ddp_gloo_2rank_mlp"


def test_process_pool_gives_the_serial_result():
    calls = []

    def recording(fn, items):
        calls.append([it.path.name for it in items])
        return serial(fn, items)

    alone = import_kineto(SRC, mapper=recording)
    assert calls == [["rank0.json.gz", "rank1.json.gz"]]
    pooled = import_kineto(SRC, mapper=ProcessPool(2))
    assert gtrace_digest(pooled) == gtrace_digest(alone)
    assert pooled.manifest == alone.manifest


def test_worker_error_names_the_file(tmp_path):
    d = tmp_path / "job"
    shutil.copytree(SRC, d)
    (d / "rank1.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "ts": "x"}]}'))
    with pytest.raises(DproInputError, match=r"rank1\.json\.gz: traceEvents\[0\]: 'ts' is missing or not a number"):
        import_kineto(d, mapper=ProcessPool(2))


def test_workers_get_the_read_options(tmp_path):
    """--max-input-bytes reaches the worker processes (they do not inherit the context)."""
    with read_options(max_input_bytes=1000), pytest.raises(DproInputError, match=r"rank0\.json\.gz: .*input limit of 1000"):
        import_kineto(SRC, mapper=ProcessPool(2))


def test_duplicate_ranks_found_after_the_per_rank_import(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    for name in ("a_rank0.json.gz", "b_rank0.json.gz"):
        shutil.copy(SRC / "rank0.json.gz", d / name)
    with pytest.raises(DproInputError, match=r"b_rank0\.json\.gz: rank 0 also in a_rank0\.json\.gz"):
        import_kineto(d)


def test_default_mapper(monkeypatch):
    """Workers: min(cores, files, $DPRO_IMPORT_WORKERS, total // (2 * largest)); serial
    below POOL_MIN_BYTES. The last bound keeps the files read at once within half of the
    input, so two big ranks are read one after the other (peak memory ~ the input)."""
    from dpro.importers.kineto import pool

    monkeypatch.setattr(pool, "usable_cores", lambda: 4)
    monkeypatch.delenv(pool.WORKERS_ENV, raising=False)
    big = 10**9
    assert pool.default_mapper([]) is serial
    assert pool.default_mapper([big]) is serial
    assert pool.default_mapper([100] * 8) is serial  # small: a worker costs more than it saves
    assert pool.default_mapper([big] * 8) == ProcessPool(4, meanwhile=pool._load_numpy)
    assert pool.default_mapper([big] * 2) is serial  # both at once would be the whole input
    assert pool.default_mapper([big] * 3) is serial
    assert pool.default_mapper([big] * 6) == ProcessPool(3, meanwhile=pool._load_numpy)
    assert pool.default_mapper([4 * big] + [big] * 8) is serial  # one rank is a third of the input
    monkeypatch.setenv(pool.WORKERS_ENV, "2")
    assert pool.default_mapper([big] * 8) == ProcessPool(2, meanwhile=pool._load_numpy)
    monkeypatch.setenv(pool.WORKERS_ENV, "1")
    assert pool.default_mapper([big] * 8) is serial


def test_rank_result_pickles_to_an_equal_result():
    """What a worker sends back (events as columns, ops as field tuples) is rebuilt equal:
    every op field (COMM ones included), the ops' order, the events."""
    import pickle

    from dpro.importers.kineto.convert import RankTask, import_rank
    from dpro.importers.kineto.read import DEFAULT_RANK_PATTERN

    r = import_rank(RankTask(SRC / "rank0.json.gz", DEFAULT_RANK_PATTERN, 0))
    assert any(op.cat == "COMM" and op.txn for op in r.node.ops.values())
    back = pickle.loads(pickle.dumps(r))
    assert back == r and list(back.node.ops) == list(r.node.ops)
    assert r.node.ops and r.node.events  # pickling left the original whole
