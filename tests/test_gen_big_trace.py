"""benchmarks/gen_big_trace.py: the repeated trace imports and replays like its source."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpro.job import open_job
from scriptmod import load_script

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "examples" / "traces" / "ddp_gloo_2rank_mlp"


def _gen():
    return load_script("gen_big_trace", "benchmarks/gen_big_trace.py")


def test_repeated_steps_replay_like_the_source(tmp_path):
    rep = _gen().generate(SRC, tmp_path / "big", mb=1.6)
    copies = rep[0]["copies"]
    assert copies >= 3 and all(r["copies"] == copies and r["bytes"] >= 1.6e6 for r in rep)
    src, big = open_job(SRC), open_job(tmp_path / "big")
    assert len(big.trace.manifest.steps) == copies * len(src.trace.manifest.steps)
    assert {n: len(t.ops) for n, t in big.trace.nodes.items()} == {n: len(t.ops) for n, t in src.trace.nodes.items()}
    a, b = src.replay(), big.replay()
    # the same steps again: the same job (the typical steps picked differ a little)
    assert b.predicted_iteration_us == pytest.approx(a.predicted_iteration_us, rel=0.05)
    assert b.measured_iteration_us == pytest.approx(a.measured_iteration_us, rel=0.05)
    assert not big.trace.notes
