"""benchmarks/window_parts.py: the recorder's window against the same processes' calls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import window_parts  # noqa: E402


def test_rounds_summary_by_hand():
    """Two rounds: off 100, 100, 100 / 110, 110, 110; window 105, 105, 105 / 121, 121, 121.
    Pooled: median 105 of (100, 100, 100, 110, 110, 110) ... the off median 105, the window's
    113, +7.6 %; paired: +5 % and +10 %, median +7.5 %."""
    result = {"steps_us": {"off": [[100.0] * 3, [110.0] * 3], "window": [[105.0] * 3, [121.0] * 3]},
              "events_per_step": {"off": 0, "window": 2000}}
    s = window_parts.summarize(result, ["off", "window"])
    assert s["off"]["pooled_pct"] == 0.0 and s["off"]["paired_pct"] == 0.0
    assert s["window"]["median_us"] == pytest.approx(113.0)
    assert s["window"]["pooled_pct"] == pytest.approx(100 * (113 / 105 - 1))
    assert s["window"]["paired_pct"] == pytest.approx(7.5)
    assert s["window"]["events_per_step"] == 2000


def test_sequence_summary_against_the_later_off_blocks():
    """off (the first calls, 150) / window 110 / off 100 / window 104 / off 100: the later off
    blocks' median is 100, so the windows read +10 % and +4 %, the first block +50 %."""
    order = ["off", "window", "off", "window", "off"]
    launch = {"steps_us": {f"{i}:{v}": [[t] * 3] for i, (v, t) in enumerate(zip(order, [150, 110, 100, 104, 100]))}}
    rows = window_parts.sequence_summary([launch, launch], order)
    assert [r["median_pct"] for r in rows] == pytest.approx([50.0, 10.0, 0.0, 4.0, 0.0])


def test_a_real_two_rank_run(tmp_path):
    """Two real gloo ranks (mlp, one round of one call a variant): every variant timed, the
    window records the operators, the coarse session only the user ranges and autograd nodes."""
    from dpro.ports import free_port

    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "window_parts.py"), "--model", "mlp", "--rounds", "1",
                        "--steps", "1", "--port", str(free_port()), "--json-out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert set(d["summary"]) == set(window_parts.VARIANTS)
    assert all(len(d["steps_us"][v]) == 1 and d["steps_us"][v][0][0] > 0 for v in window_parts.VARIANTS)
    ev = d["events_per_step"]
    assert ev["off"] == 0 and 0 < ev["coarse"] < ev["window"] and ev["bare"] > ev["coarse"]


def test_bad_variants_are_one_line():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "window_parts.py"), "--variants", "window,off"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "must start with off" in r.stderr and "Traceback" not in r.stderr
