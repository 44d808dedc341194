"""Progress bars: on a terminal, `dpro replay` shows one for each long stage (import per
rank, clock alignment, op statistics); `--json` shows none. Run in a real pseudo-terminal."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _stderr_on_a_tty(args: list[str], tmp_path: Path) -> str:
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="120", TERM="xterm", DPRO_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("DPRO_NO_CACHE", None)
    env["DPRO_NO_CACHE"] = "1"  # the import runs every time
    p = subprocess.Popen([sys.executable, "-m", "dpro.cli", *args], stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    p.communicate(timeout=120)
    os.close(master)
    assert p.returncode == 0
    return b"".join(chunks).decode(errors="replace")


def test_bars_on_a_terminal_and_none_with_json(kineto_dir, tmp_path):
    err = _stderr_on_a_tty(["replay", str(kineto_dir)], tmp_path)
    for stage in ("importing traces", "op statistics"):
        assert stage in err, err[-2000:]
    err = _stderr_on_a_tty(["replay", str(kineto_dir), "--json"], tmp_path)
    assert "importing" not in err and "statistics" not in err and "aligning" not in err, err[-2000:]
