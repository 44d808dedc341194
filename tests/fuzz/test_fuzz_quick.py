"""The fast, seeded subset of the fuzzing campaign (benchmarks/fuzz.py runs the long one):
48 mutated inputs, four per seed (every format dpro reads), two of them through a real
``python -m dpro.cli`` process. No case may end in a traceback, a hang, an escape, a
multi-line message, a silent skip or a wrong success (tests/fuzz/fuzzlib.py)."""

from __future__ import annotations

import collections
from pathlib import Path

import fuzzlib

CASES = 48
SEED = 20261126


def test_seeded_fuzz_subset(tmp_path: Path) -> None:
    results = fuzzlib.campaign(CASES, SEED, tmp_path, subprocess_every=24)
    counts = collections.Counter(r.outcome for r in results)
    bad = [f"{r.outcome}: {r.seed} {r.command} {r.mutations}: {r.detail}" for r in results
           if r.outcome in fuzzlib.BAD_OUTCOMES]
    assert not bad, "\n".join(bad)
    assert len(results) == CASES
    # the campaign exercises both ends: inputs refused cleanly and inputs still accepted
    assert counts["clean-error"] >= 10 and counts["success"] >= 10, counts
    assert {r.mode for r in results} == {"in-process", "subprocess"}
