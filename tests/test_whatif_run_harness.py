"""benchmarks/whatif/run.py: a target's row from several profiles is the median profile's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from scriptmod import load_script

REPO = Path(__file__).resolve().parents[1]


def _run_module():
    return load_script("whatif_run", "benchmarks/whatif/run.py")


def test_median_row_takes_the_median_profile() -> None:
    run = _run_module()
    o = SimpleNamespace(framework="ddp", model="mlp")
    truth = {2: [{"steps_us": [100.0, 110.0, 90.0], "foreign_cpu_pct": 0.0, "load_avg_1m": 1.0}]}

    def prof(pred_us: float, measured_us: float) -> tuple[dict, dict]:
        return ({"workers": 2, "iteration_us": pred_us},
                {"measured_iteration_us": measured_us, "transfer": {"alpha_us": 1.0}})

    r = run.median_row(o, "loopback", 2, [prof(80.0, 70.0), prof(120.0, 110.0), prof(95.0, 85.0)], truth)
    assert r["predicted_us"] == 95.0 and r["profile_measured_us"] == 85.0
    assert r["measured_us"] == 100.0 and r["error_pct"] == -5.0
    assert r["profile_predictions_us"] == [80.0, 120.0, 95.0]
    # an even count takes the lower middle one; one profile is itself
    assert run.median_row(o, "loopback", 2, [prof(80.0, 70.0), prof(120.0, 110.0)], truth)["predicted_us"] == 80.0
    assert run.median_row(o, "loopback", 2, [prof(120.0, 110.0)], truth)["predicted_us"] == 120.0
