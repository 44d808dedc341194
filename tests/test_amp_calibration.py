"""benchmarks/amp_calibration.py: paired fp32 / autocast repeats, the median over tries, and
the calibration file the mixed-precision what-if reads (hand-computed where it is arithmetic)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpro.whatif.builtin import mixed_precision
from dpro.whatif.graph import Op, WhatIfGraph
from scriptmod import load_script

REPO = Path(__file__).resolve().parents[1]


def _cal():
    return load_script("amp_calibration", "benchmarks/amp_calibration.py")


def test_paired_ratio_is_the_median_of_per_repeat_ratios_of_sums():
    cal = _cal()
    # rows[repeat][case] = (fp32 FW, autocast FW, fp32 BW, autocast BW)
    rows = [[(10, 6, 20, 10), (30, 18, 40, 30)],  # FW (6+18)/(10+30) = 0.6, BW 40/60
            [(20, 16, 40, 40), (60, 48, 80, 40)],  # a slow phase, both precisions: FW 64/80 = 0.8, BW 80/120
            [(10, 7, 20, 12), (30, 21, 40, 18)]]   # FW 28/40 = 0.7, BW 30/60 = 0.5
    assert cal.paired_ratio(rows, 1, 0) == pytest.approx(0.7)
    assert cal.paired_ratio(rows, 3, 2) == pytest.approx(40 / 60)
    # a repeat whose fp32 step alone was slowed (the phase changed inside the pair): one outlier
    # of three, the median moves by one rank (0.6, 0.32, 0.7 -> 0.6)
    rows[1] = [(50, 16, 40, 40), (150, 48, 80, 40)]  # FW 64/200 = 0.32
    assert cal.paired_ratio(rows, 1, 0) == pytest.approx(0.6)


def test_summarize_summed_median_over_tries_and_times():
    cal = _cal()
    one = [(10, 6, 20, 10), (30, 18, 40, 30)]  # FW 0.6, BW 40/60
    two = [(10, 8, 20, 15), (30, 24, 40, 30)]  # FW 0.8, BW 45/60 = 0.75
    three = [(20, 14, 40, 30), (60, 42, 80, 60)]  # FW 0.7, BW 90/120 = 0.75
    tries = [[one, one, two], [two, two, one], [three, three, three]]
    f, t = cal.summarize(tries, summed=True)
    # per try (median of 3 repeats): FW 0.6 / 0.8 / 0.7 -> 0.7; BW 2/3 / 0.75 / 0.75 -> 0.75
    assert t["tries"] == {"FW": [0.6, 0.8, 0.7], "BW": [0.6667, 0.75, 0.75]}
    assert f == {"FW": 0.7, "BW": 0.75}
    # fp32 sums over the 9 repeats: FW 40 x6, 80 x3 -> 40; BW 60 x6, 120 x3 -> 60
    assert (t["FW_fp32"], t["BW_fp32"]) == (40, 60)
    assert (t["FW"], t["BW"]) == (pytest.approx(28), pytest.approx(45))  # the fp32 sum times the factor
    # layer 0's fp32 FW: 10 x6, 20 x3 -> 10; autocast FW: 6 x3, 8 x3, 14 x3 -> 8
    assert t["layers"][0][:2] == [10, 8]
    assert t["sums"][0][2] == [40, 32, 60, 45]


def test_summarize_unsummed_median_over_cases():
    cal = _cal()
    # three cases, two tries of one repeat: per case the median of its tries' ratios
    tries = [[[(10, 5, 10, 20), (10, 7, 10, 10), (10, 30, 10, 5)]],
             [[(10, 7, 10, 20), (10, 9, 10, 10), (10, 10, 10, 5)]]]
    f, t = cal.summarize(tries, summed=False)
    # FW per case: (0.5, 0.7) -> 0.6, (0.7, 0.9) -> 0.8, (3, 1) -> 2; median 0.8. BW: 2, 1, 0.5 -> 1
    assert f == {"FW": 0.8, "BW": 1.0}
    assert t is None


def test_measure_try_pairs_and_alternates_the_order(monkeypatch):
    cal = _cal()
    calls = []

    def fake_step(torch, case, amp, device, dtype, grad):
        calls.append((case, amp))
        return (2.0, 4.0) if amp else (4.0, 8.0)

    monkeypatch.setattr(cal, "_step", fake_step)
    rows = cal.measure_try(None, ["a", "b"], "cpu", None, repeats=2)
    assert rows == [[(4.0, 2.0, 8.0, 4.0)] * 2] * 2
    timed = calls[8:]  # after 4 warm-up steps per case
    # repeat 0: a fp32 first, b autocast first; repeat 1 the other way round
    assert timed == [("a", False), ("a", True), ("b", True), ("b", False),
                     ("a", True), ("a", False), ("b", False), ("b", True)]


def test_real_try_on_a_small_linear():
    cal = _cal()
    import torch

    torch.manual_seed(0)
    m = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64, requires_grad=True)
    rows = cal.measure_try(torch, [((lambda: m(x)), list(m.parameters()))], "cpu", torch.bfloat16, repeats=3)
    assert len(rows) == 3 and all(len(r) == 1 and all(v > 0 for v in r[0]) for r in rows)
    assert m.weight.grad is not None and m.weight.grad.dtype == torch.float32


def test_calibration_file_feeds_auto_with_the_paired_ratio(tmp_path, monkeypatch):
    """The file's autocast time / fp32 time is the factor, which auto=1 applies to a native class."""
    cal = _cal()
    tries = [[[(10, 7, 20, 12)]]] * 3
    f, t = cal.summarize(tries, summed=True)
    path = tmp_path / "amp.json"
    path.write_text(json.dumps({"factors": {"matmul": f}, "times_us": {"matmul": t}}))
    monkeypatch.setenv("DPRO_AMP_FACTORS", str(path))
    g = WhatIfGraph()
    ops = [g.add(Op(name=n, cat=c, device="d0", dur=d, node="w0")) for n, c, d in (
        ("w0/aten::linear#0", "FW", 10), ("w0/aten::linear#1", "FW", 30), ("w0/aten::relu#2", "FW", 5),
        ("w0/autograd::engine::evaluate_function: AddmmBackward0#3", "BW", 20))]
    for a, b in zip(ops, ops[1:]):
        g.connect(a, b)
    mixed_precision(g, auto=1)
    # FW 7 / 10 = x0.7 on 10 + 30, relu unchanged, BW 12 / 20 = x0.6 on 20
    assert [round(op.dur, 6) for op in sorted(g.select(lambda o: True), key=lambda o: o.id)] == [7, 21, 5, 12]
    assert g.simulate().iteration_us == pytest.approx(45)


def test_cli_rejects_zero_tries():
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "amp_calibration.py"), "--tries", "0"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "--tries" in r.stderr
