"""benchmarks/machine_drift.py: the job's steps lined up with the probe by wall clock
(hand-computed; the probes themselves are benchmarks and are not timed here)."""

from __future__ import annotations

import json

import pytest

from scriptmod import load_script


@pytest.fixture(scope="module")
def md():
    return load_script("machine_drift", "benchmarks/machine_drift.py")


def test_job_steps_are_the_mean_over_ranks_ending_at_wall_clock(md, tmp_path):
    for r, steps in enumerate(([1e6, 2e6, 1e6], [3e6, 2e6, 1e6])):
        (tmp_path / f"t{r}.json").write_text(json.dumps({"step_us": steps, "first_step_unix_s": 100.0}))
    # means 2, 2, 1 s: the steps end at 102, 104, 105
    assert md.job_steps(str(tmp_path / "t{rank}.json"), 2) == [(102.0, 2e6), (104.0, 2e6), (105.0, 1e6)]


def test_bins_hold_both_the_steps_and_the_probe(md):
    steps = [(102.0, 2e6), (104.0, 4e6), (105.0, 1e6), (109.5, 6e6)]
    probe = [(102.5, 10.0), (103.0, 20.0), (104.5, 30.0)]
    # bins of 3 s from 102: [102, 105) steps 2e6, 4e6 / probe 10, 20, 30; [105, 108) no probe; [108, 111) no probe
    assert md.binned(steps, probe, 3.0) == [(0.0, 3e6, 20.0)]
