"""Shared fixtures: trace directories to import, replay and break.

* ``probe_dir``: a copy of a real 2-rank CPU DDP job (gloo), traced with torch.profiler.
  Looked up in ``$DPRO_PROBE_DIR``, ``tests/data/probe`` and ``/tmp/probe`` (files
  ``rank0.json``, ``rank1.json``, optionally gzipped); tests that need it are skipped
  when it is nowhere to be found.
* ``kineto_dir``: a small synthetic Kineto job of the same shape (2 ranks, 3 profiled
  steps, forward / backward / two gloo all-reduces / optimizer), always available.
* ``gtrace_dir``: ``kineto_dir`` converted to a gTrace directory.
* ``run_cli``: runs the real ``dpro`` command line in-process (click's CliRunner, no
  exception catching) and returns (exit code, stdout, stderr).
* ``snapshot``: name -> (mode, bytes) of everything under a directory, to check that a
  failed command left its input alone.

Where the compiled replay core is built, every replay in the tests (golden cases, CLI runs,
subprocesses) runs both engines and checks they agree bit for bit (``DPRO_ENGINE=both``,
unless the caller set ``DPRO_ENGINE``). The trace cache is off (``DPRO_NO_CACHE=1``)
except in tests/test_trace_cache.py.
"""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
_PROBE_CANDIDATES = [
    Path(p) for p in (os.environ.get("DPRO_PROBE_DIR"), REPO / "tests" / "data" / "probe", "/tmp/probe") if p
]


def find_probe() -> Path | None:
    """The directory holding the real 2-rank probe traces, or None."""
    for d in _PROBE_CANDIDATES:
        if all(any((d / f"rank{r}{s}").is_file() for s in (".json", ".json.gz")) for r in (0, 1)):
            return d
    return None


def pytest_configure(config: pytest.Config) -> None:
    from dpro.replayer.engine import compiled_available

    if compiled_available():
        os.environ.setdefault("DPRO_ENGINE", "both")
    # the trace cache stays off (nothing written to ~/.cache); tests/test_trace_cache.py turns it on
    os.environ.setdefault("DPRO_NO_CACHE", "1")


PROBE = find_probe()
needs_probe = pytest.mark.skipif(PROBE is None, reason=f"probe traces not found in {[str(p) for p in _PROBE_CANDIDATES]}")


# --------------------------------------------------------------------------- synthetic job

STEP_US = 10_000.0
T0 = 1_000_000.0


def _x(name: str, cat: str, ts: float, dur: float, tid: int, args: dict | None = None) -> dict:
    e = {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur}
    if args is not None:
        e["args"] = args
    return e


def synthetic_rank(rank: int, world_size: int = 2, steps: tuple[int, ...] = (1, 2, 3)) -> dict:
    """A torch.profiler-like CPU trace of one DDP rank using gloo (times in µs)."""
    main, comm = 1, 2
    jitter = 7.0 * rank
    evs: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "args": {"name": f"rank{rank}"}},
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": main, "args": {"name": "main"}},
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": comm, "args": {"name": "gloo"}},
    ]
    grad = {"Input Dims": [[1024, 256]], "Input type": ["float"]}
    for s in steps:
        t = T0 + (s - steps[0]) * STEP_US
        evs.append(_x(f"ProfilerStep#{s}", "user_annotation", t, STEP_US - 100, main))
        evs.append(_x("aten::linear", "cpu_op", t + 100, 1500 + jitter, main, {"Input Dims": [[64, 1024]]}))
        evs.append(_x("aten::relu", "cpu_op", t + 1700, 200, main))
        evs.append(_x("aten::cross_entropy_loss", "cpu_op", t + 2000, 300, main))
        evs.append(_x("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", t + 2400, 2000, main))
        evs.append(_x("c10d::allreduce_", "cpu_op", t + 4450, 30, main, grad))
        evs.append(_x("gloo:all_reduce", "user_annotation", t + 4500, 1500, comm, grad))
        evs.append(_x("autograd::engine::evaluate_function: ReluBackward0", "cpu_op", t + 4500, 800, main))
        evs.append(_x("c10d::allreduce_", "cpu_op", t + 5350, 30, main, grad))
        evs.append(_x("gloo:all_reduce", "user_annotation", t + 6050, 1400, comm, grad))
        evs.append(_x("Optimizer.step#SGD.step", "user_annotation", t + 7600, 1000, main))
        evs.append(_x("aten::add_", "cpu_op", t + 7650, 900, main))
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world_size},
        "traceEvents": evs,
        "displayTimeUnit": "ms",
        "host_name": "synthetic",
    }


def write_synthetic_job(d: Path, *, world_size: int = 2, gz: bool = False) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for r in range(world_size):
        data = orjson.dumps(synthetic_rank(r, world_size))
        if gz:
            (d / f"rank{r}.json.gz").write_bytes(gzip.compress(data, mtime=0))
        else:
            (d / f"rank{r}.json").write_bytes(data)
    return d


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def probe_dir(tmp_path: Path) -> Path:
    """A private copy of the real 2-rank probe job (skips when it is not available)."""
    if PROBE is None:
        pytest.skip("probe traces not available")
    d = tmp_path / "probe"
    d.mkdir()
    for r in (0, 1):
        for s in (".json", ".json.gz"):
            if (PROBE / f"rank{r}{s}").is_file():
                shutil.copyfile(PROBE / f"rank{r}{s}", d / f"rank{r}{s}")
                break
    return d


@pytest.fixture
def kineto_dir(tmp_path: Path) -> Path:
    """A synthetic 2-rank Kineto job (plain JSON files rank0.json, rank1.json)."""
    return write_synthetic_job(tmp_path / "kineto")


@pytest.fixture
def gtrace_dir(tmp_path: Path, kineto_dir: Path) -> Path:
    """The synthetic job as a gTrace directory."""
    from dpro.gtrace.io import write_gtrace
    from dpro.importers.kineto import import_kineto

    return write_gtrace(import_kineto(kineto_dir), tmp_path / "gtrace")


class CliResult:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def __iter__(self):
        return iter((self.code, self.out, self.err))


@pytest.fixture
def run_cli():
    """Run ``dpro ARGS...`` in-process; unexpected exceptions propagate (no catching)."""
    from dpro.cli import cli

    def run(*args: object) -> CliResult:
        res = CliRunner().invoke(cli, [str(a) for a in args], prog_name="dpro", catch_exceptions=False)
        return CliResult(res.exit_code, res.stdout, res.stderr)

    return run


def snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every path under ``root`` -> (mode, contents; b'' for directories)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (st.st_mode, b"" if p.is_dir() else p.read_bytes())
    return out


@pytest.fixture
def snap():
    return snapshot


@pytest.fixture
def allow_missing_ranks():
    """Read the way ``dpro --allow-missing-ranks`` does: the shared traces are often some
    ranks of a bigger job (issue #32 made a missing rank an error by default)."""
    from dpro.jsonio import read_options

    with read_options(allow_missing_ranks=True):
        yield
