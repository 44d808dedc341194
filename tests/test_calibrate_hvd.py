"""dpro calibrate --backend horovod: two real Horovod ranks (gloo, horovodrun) on this machine."""

from __future__ import annotations

import json

import pytest

from dpro.whatif.platform import load_platform

pytest.importorskip("horovod.torch")


def test_calibrate_horovod_two_ranks_pinned(tmp_path):
    """Every size timed alone (wall and CPU) and while the ranks compute; the fits read back,
    the CPU cost left out."""
    from dpro.whatif.calibrate_hvd import calibrate_horovod, horovodrun

    if horovodrun() is None:
        pytest.skip("horovodrun not installed")
    d = calibrate_horovod(2, sizes=[65536, 1 << 20], repeats=2, tries=1, pin=True)
    assert d["backend"] == "horovod" and d["pinned"] is True
    assert [r["bytes"] for r in d["samples"]] == [65536, 1 << 20]
    assert all(r["us"] > 0 and r["cpu_us"] > 0 and r["overlapped_us"] > 0 for r in d["samples"])
    (tmp_path / "p.json").write_text(json.dumps(d))
    p = load_platform(tmp_path / "p.json")
    # no CPU cost: Horovod's calls poll, their CPU is their wall time (kept in the samples)
    assert p.backend == "horovod" and p.allreduce_cpu is None and p.allreduce_overlap is not None
    assert "cpu_alpha_us" not in d["allreduce"]


def test_cli_pin_needs_horovod(tmp_path):
    from click.testing import CliRunner

    from dpro.cli import cli

    r = CliRunner().invoke(cli, ["calibrate", "--pin", "-o", str(tmp_path / "p.json")])
    assert r.exit_code == 2 and "--pin: only with --backend horovod" in r.output and "Traceback" not in r.output


def test_calibrate_horovod_timeout_is_one_line(monkeypatch):
    """A launcher that hangs: one clear error, not a traceback or a hang."""
    import subprocess

    from dpro.errors import DproInputError
    from dpro.whatif import calibrate_hvd

    def hang(*a, **k):
        raise subprocess.TimeoutExpired(a[0], k.get("timeout"))

    monkeypatch.setattr(calibrate_hvd, "horovodrun", lambda: "horovodrun")
    monkeypatch.setattr(calibrate_hvd.subprocess, "run", hang)
    with pytest.raises(DproInputError, match="did not finish in 5 s"):
        calibrate_hvd.calibrate_horovod(2, sizes=[4096], repeats=1, tries=1, timeout_s=5)
