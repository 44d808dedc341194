"""The recorder's own inputs (issue #32): bad ``DPRO_*`` values, an unwritable trace
directory, a full disk. A real PyTorch training loop runs under dpro.Recorder each time: it
must finish every step, and the recorder must say why it stopped, once.

The full disk is a 4 KiB tmpfs (one page: this job's gzipped trace is ~8 KiB, so it never fits;
at 16 KiB it fitted when it came out under 8 KiB) when this process may mount one (root); otherwise a
4 KiB file-size rlimit (RLIMIT_FSIZE) on this process while the recorder writes, which fails the
write the same way (EFBIG instead of ENOSPC), and the test says which one it used.
"""

from __future__ import annotations

import logging
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
STEPS = 12


def train(out_dir: Path | None, steps: int = STEPS) -> int:
    """Train ``steps`` steps of a small MLP under a Recorder (warm-up 2, window 3,
    2 calls timed after it); returns the steps done."""
    import dpro

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    rec = dpro.Recorder(model, out_dir=str(out_dir) if out_dir is not None else None)

    @dpro.profile(rec)
    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    done = 0
    for _ in range(steps):
        step()
        done += 1
    rec._at_exit()  # what atexit does at the end of a job
    return done


def dpro_errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("dpro") and r.levelno >= logging.ERROR]


@pytest.fixture
def window(monkeypatch):
    for k, v in {"DPRO_WARMUP": "2", "DPRO_STEPS": "3", "DPRO_AFTER_STEPS": "2"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("DPRO_TRACE_DIR", raising=False)


@pytest.mark.parametrize("name,value,why", [
    ("DPRO_WARMUP", "abc", "DPRO_WARMUP='abc' is not an integer"),
    ("DPRO_WARMUP", "-1", "DPRO_WARMUP=-1 is outside 0..1000000"),
    ("DPRO_STEPS", "0", "DPRO_STEPS=0 is outside 1..1000000"),
    ("DPRO_STEPS", "1e9", "DPRO_STEPS='1e9' is not an integer"),
    ("DPRO_STEPS", "99999999999999999999", "outside 1..1000000"),
    ("DPRO_AFTER_STEPS", "-5", "DPRO_AFTER_STEPS=-5 is outside 0..1000000"),
    ("DPRO_HOST", "evil\nhost", "DPRO_HOST='evil\\nhost' is not a host name"),
])
def test_bad_environment_values(name: str, value: str, why: str, window, monkeypatch, tmp_path: Path, caplog) -> None:
    monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    assert train(tmp_path / "traces") == STEPS
    errors = dpro_errors(caplog)
    assert len(errors) == 1, errors
    assert "recording disabled" in errors[0] and why in errors[0] and "training goes on" in errors[0]
    assert not (tmp_path / "traces").exists()


@pytest.mark.parametrize("where", ["file-parent", "proc"])
def test_unwritable_trace_directory(where: str, window, tmp_path: Path, caplog) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    out = blocker / "traces" if where == "file-parent" else Path("/proc/dpro-no-such-dir")
    assert train(out) == STEPS
    errors = dpro_errors(caplog)
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"dpro: recording stopped: could not write the trace to {out}: ")


@contextmanager
def full_disk(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode == 0:
        try:
            yield mnt, "tmpfs"
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4 * 1024, hard))
    try:
        yield mnt, "RLIMIT_FSIZE"
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_full_disk(window, tmp_path: Path, caplog) -> None:
    with full_disk(tmp_path) as (out, how):
        done = train(out / "traces")
        left = sorted(p.name for p in (out / "traces").iterdir()) if (out / "traces").is_dir() else []
    assert done == STEPS
    # The trace is written after the window (#31): the disk fills either while the trace
    # is exported (recording stopped: an error) or, when the trace fits, while the calls
    # timed after the window are added to meta.json (the trace is kept: a warning). Either
    # way the recorder says why, once.
    said = [r for r in caplog.records if r.name.startswith("dpro") and r.levelno >= logging.WARNING]
    assert len(said) == 1, (how, [r.getMessage() for r in said])
    msg, level = said[0].getMessage(), said[0].levelno
    assert ("No space left on device" in msg) if how == "tmpfs" else ("File too large" in msg), (how, msg)
    if level >= logging.ERROR:
        assert "recording stopped: could not write the trace" in msg, (how, msg)
    else:
        assert "could not add the steps after the window" in msg, (how, msg)
    assert not [n for n in left if n.endswith(".part")], left  # no half-written file left behind


def test_bad_value_in_a_real_job_says_it_once(tmp_path: Path) -> None:
    """The same through a real process: its stderr has the reason exactly once."""
    env = dict(os.environ, PYTHONPATH=str(REPO), DPRO_WARMUP="two", DPRO_TRACE_DIR=str(tmp_path / "t"))
    r = subprocess.run([sys.executable, str(HERE / "recorder_job.py"), "8"], capture_output=True, text=True,
                       env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "trained 8 steps" in r.stdout
    assert r.stderr.count("dpro: recording disabled: DPRO_WARMUP='two' is not an integer") == 1, r.stderr[-2000:]
