"""benchmarks/overhead.py's figures: rounds in alternating order, and the pooled phases."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import overhead  # noqa: E402

JOB = overhead.Job("hvd", "mlp", 2, "lo")  # window: 5 warm-up + 5 profiled, then the calls after it


def run(variant: str, base: float, window: float = 1.0, after: float = 1.0) -> overhead.Run:
    """20 steps of ``base`` µs; the window's steps times ``window``, the later ones times ``after``."""
    steps = [base] * 5 + [base * window] * 5 + [base * after] * 10
    return overhead.Run(variant, True, steps)


def test_alternating_rounds_pair_each_on_run_with_its_own_rounds_off_run():
    # round 0: on, off; round 1: off, on (--order alternate); the machine is 2x slower in round 1
    runs = [run("default", 100, 1.1), run("off", 100), run("off", 200), run("default", 200, 1.1),
            run("default", 100, 1.1), run("off", 100)]
    f = overhead.figures(JOB, runs)
    v = f["variants"]["default"]
    assert v["k"] == 3
    assert v["window_pct"] == pytest.approx(10.0)
    assert v["window_min_pct"] == pytest.approx(10.0) and v["window_max_pct"] == pytest.approx(10.0)
    assert f["noise_window_pct"] == pytest.approx(75.0)  # off vs next off: +100 %, -50 %


def test_pooled_phases_tell_a_launch_difference_from_the_window():
    runs = [run("default", 100, 1.0, 0.9), run("off", 100), run("off", 100), run("default", 100, 1.0, 0.9)]
    pooled = overhead.figures(JOB, runs)["variants"]["default"]["pooled_pct"]
    assert pooled["warmup"] == pytest.approx(0.0)
    assert pooled["window"] == pytest.approx(0.0)
    assert pooled["after"] == pytest.approx(-10.0)


def test_own_pace_cancels_a_run_slow_from_start_to_end():
    # round 0: the on-run is 30 % slower all through (its pace) and its window costs 2 % more
    # than its own calls after it; round 1: both at the same pace, the window 2 % again
    steps_slow = [130.0] * 5 + [130.0 * 1.02] * 5 + [130.0] * 10
    runs = [overhead.Run("default", True, steps_slow), run("off", 100), run("off", 100), run("default", 100, 1.02)]
    v = overhead.figures(JOB, runs)["variants"]["default"]
    assert v["window_pct"] == pytest.approx((32.6 + 2.0) / 2)  # in-window: +32.6 % and +2 %
    assert v["pace_pct"] == pytest.approx(2.0)
    assert v["pace_min_pct"] == pytest.approx(2.0) and v["pace_max_pct"] == pytest.approx(2.0)
