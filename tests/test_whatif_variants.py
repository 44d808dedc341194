"""benchmarks/whatif/variants.py's paired rounds, and examples/whatif/train_variant.py end to end
(a real one-process torch job, profiled, then `dpro whatif --apply fused_optimizer`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scriptmod import load_script

REPO = Path(__file__).resolve().parents[1]


def _variants():
    return load_script("whatif_variants", "benchmarks/whatif/variants.py")


def test_round_order_alternates():
    v = _variants()
    assert v.round_order(["a", "b"], 0) == ["plain", "a", "b"]
    assert v.round_order(["a", "b"], 1) == ["b", "a", "plain"]
    assert v.round_order(["a", "b"], 2) == ["plain", "a", "b"]


def test_summarize_medians_over_rounds():
    v = _variants()

    def rd(p, m, b, plain):
        return {"variants": {"x": {"whatif": "w", "predicted_us": p, "measured_us": m, "error_pct": 100 * (p - m) / m,
                                   "predicted_ratio": p / b, "measured_ratio": m / plain}}}

    # round errors: +10 %, -20 %, 0 % -> median 0 %; predicted 110, 80, 100 -> 100; measured 100, 100, 100
    rounds = [rd(110, 100, 100, 100), rd(80, 100, 100, 125), rd(100, 100, 200, 50)]
    (row,) = v.summarize(rounds, ["x"])
    assert row["predicted_us"] == 100 and row["measured_us"] == 100
    assert row["error_pct"] == pytest.approx(0.0)
    assert row["error_pct_rounds"] == pytest.approx([10.0, -20.0, 0.0])
    assert row["error_pct_interval"] == (pytest.approx(-20.0), pytest.approx(10.0), pytest.approx(0.75))
    # ratios: predicted 1.1, 0.8, 0.5 -> 0.8; measured 1.0, 0.8, 2.0 -> 1.0; ratio errors +10, 0, -75 % -> 0
    assert row["predicted_ratio"] == pytest.approx(0.8)
    assert row["measured_ratio"] == pytest.approx(1.0)
    assert row["ratio_error_pct"] == pytest.approx(0.0)


def test_median_interval_order_statistics():
    v = _variants()
    # n = 9: [x(2), x(8)] covers 1 - 2 (C(9,0) + C(9,1)) / 512 = 1 - 20/512 = 0.9609 >= 0.9;
    # [x(3), x(7)] only 1 - 2 * 46/512 = 0.8203
    assert v.median_interval([9, 1, 8, 2, 7, 3, 6, 4, 5]) == (2, 8, pytest.approx(492 / 512))
    assert v.median_interval([9, 1, 8, 2, 7, 3, 6, 4, 5], conf=0.8) == (3, 7, pytest.approx(420 / 512))
    # n = 5: [x(2), x(4)] covers 1 - 2 * 6/32 = 0.625 < 0.9, so the whole range, 1 - 2/32 = 0.9375
    assert v.median_interval([5, -1, 4, 2, 3]) == (-1, 5, pytest.approx(30 / 32))
    # n = 2: the range, coverage 1/2 (below conf: no narrower interval exists)
    assert v.median_interval([3.0, -2.0]) == (-2.0, 3.0, pytest.approx(0.5))


def test_train_variant_profile_then_whatif(tmp_path):
    trace, timing = tmp_path / "plain", tmp_path / "t.json"
    subprocess.run([sys.executable, str(REPO / "examples" / "whatif" / "train_variant.py"), "--model", "mlp",
                    "--steps", "5", "--warmup", "2", "--active", "2", "--profile-dir", str(trace),
                    "--timing-out", str(timing)], check=True, capture_output=True, timeout=300)
    assert (trace / "rank0.json.gz").exists()
    assert len(json.loads(timing.read_text())["step_us"]) == 3
    out = subprocess.run([sys.executable, "-m", "dpro.cli", "whatif", str(trace), "--apply",
                          "fused_optimizer:speedup=2", "--json"], check=True, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    r = json.loads(out.stdout)
    # a 2x faster optimizer shortens the step, by less than the whole step
    assert 0 < r["predicted_iteration_us"] < r["baseline_iteration_us"]
