"""examples/mxnet/train_ps.py ``--p3``: a real dist_sync job (scheduler, 1 server, 2 workers
on loopback, MXNet 1.9.1 in ``.venv-mx``) trains exactly as the plain job on the same seed.

P3's slices are their own kvstore keys, the server runs the same SGD with momentum on each
(elementwise), so every step's loss is the plain job's. No timing is checked here
(benchmarks/whatif/p3.py measures it)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MX = REPO / ".venv-mx" / "bin"
STEPS = 6


def _losses(tmp: Path, *extra: str, env: dict[str, str] | None = None) -> list[dict]:
    out = tmp / "timing"
    cmd = [str(MX / "python"), "examples/mxnet/launch_local.py", "-n", "2", "-s", "1", "--timeout", "120", "--",
           "examples/mxnet/train_ps.py", "--model", "mlp", "--steps", str(STEPS), "--losses",
           "--timing-out", str(out), *extra]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180,
                       env={**os.environ, "DPRO_DISABLE": "1", "PYTHONPATH": str(REPO), **(env or {})})
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return [json.loads(p.read_text()) for p in sorted(out.glob("timing_rank*.json"))]


@pytest.mark.slow
def test_p3_trains_like_the_plain_job(tmp_path):
    if not (MX / "python").is_file():
        pytest.skip("no .venv-mx (run scripts/setup_mxnet.sh, or `make mxnet`)")
    plain = _losses(tmp_path / "plain")
    p3 = _losses(tmp_path / "p3", "--p3", "--slice-bytes", "262144")
    assert len(plain) == len(p3) == 2
    # the MLP's parameters in 256 KiB slices: 784x1024 floats 13, 1024x1024 16, 1024x512 8,
    # 512x10 1, each bias 1 (4)
    assert [t["p3_slices"] for t in p3] == [42, 42]
    assert "p3_slices" not in plain[0]
    for a, b in zip(plain, p3):
        assert len(a["loss"]) == len(b["loss"]) == STEPS
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    # it learns: the same batch every step
    assert p3[0]["loss"][-1] < p3[0]["loss"][0]


def test_slice_bytes_needs_p3():
    if not (MX / "python").is_file():
        pytest.skip("no .venv-mx (run scripts/setup_mxnet.sh, or `make mxnet`)")
    r = subprocess.run([str(MX / "python"), "examples/mxnet/train_ps.py", "--slice-bytes", "1024"], cwd=REPO,
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and "--slice-bytes needs --p3" in r.stderr
    r = subprocess.run([str(MX / "python"), "examples/mxnet/train_ps.py", "--p3", "--slice-bytes", "2"], cwd=REPO,
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and "must be >= 4" in r.stderr


@pytest.mark.slow
def test_p3_stamps(tmp_path):
    """DPRO_P3_STAMPS=1 (benchmarks/whatif/p3_probe.py): per step, start < backward end <=
    slices issued; each pull lands after its step's backward end and before it is copied
    into the weight; the job still exits 0 (the watching thread is stopped first)."""
    if not (MX / "python").is_file():
        pytest.skip("no .venv-mx (run scripts/setup_mxnet.sh, or `make mxnet`)")
    for t in _losses(tmp_path, "--p3", "--slice-bytes", "262144", env={"DPRO_P3_STAMPS": "1"}):
        assert len(t["p3_stamps"]) == len(t["p3_landed"]) == len(t["p3_issue_cpu_us"]) == STEPS
        for (start, bw, issued), landed in zip(t["p3_stamps"], t["p3_landed"]):
            assert start < bw <= issued
            assert len(landed) == 6 and bw < landed[0]
            assert all(landed[i] <= landed[i + 1] for i in (0, 2, 4))  # landed, then copied
        assert all(c >= 0 for c in t["p3_issue_cpu_us"])
