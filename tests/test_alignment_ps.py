"""Clock alignment on a real parameter-server job (MXNet dist_sync over ps-lite).

A real 2-worker x 2-server job recorded on this machine has one clock (the ground truth).
We put worker0 + server0 on "hostA" and worker1 + server1 on "hostB", shift hostB's
timestamps by known amounts and check that the offsets come back: to 50 µs relative to the
alignment of the unskewed trace, and absolutely to the per-message pairing's resolution
(PUSH_REQ -> PUSH_RES, PULL_REQ -> PULL_RES are fine-grained, unlike gloo's collectives),
and that the replay comes back within 1 point. On this path the replay itself never
compares two nodes' clocks (each message keeps its duration as measured on its own node,
docs/mxnet.md), so it is also unmoved without alignment: the aligned clocks matter for the
timeline and for `dpro align -o`, not for the predicted time.
Runs in .venv-mx (scripts/setup_mxnet.sh, `make mxnet`).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from test_alignment import expected, inject, set_hosts

from dpro.alignment import AlignOptions, align
from dpro.gtrace.io import load_gtrace
from dpro.gtrace.schema import GTrace
from dpro.replayer.replay import replay

REPO = Path(__file__).resolve().parents[1]
MX = REPO / ".venv-mx" / "bin"

#: how far offsets found on the real PS trace may be from the true (single) clock, µs: the
#: bound set by the recorded message pairs (45 and 130 µs on two recordings, docs/alignment.md)
PS_IDENTIFIABLE_US = 1000.0


@pytest.fixture(scope="module")
def ps2(tmp_path_factory) -> GTrace:
    if not (MX / "python").is_file():
        pytest.skip("no .venv-mx (run scripts/setup_mxnet.sh, or `make mxnet`)")
    out = tmp_path_factory.mktemp("alignps") / "traces"
    cmd = [str(MX / "dpro"), "profile", "-o", str(out), "--warmup", "4", "--steps", "8", "--",
           str(MX / "python"), "examples/mxnet/launch_local.py", "-n", "2", "-s", "2", "--timeout", "150", "--",
           "examples/mxnet/train_ps.py", "--model", "mlp", "--steps", "16"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    gt = load_gtrace(out)
    roles = {n: (nt.info.role, nt.info.rank) for n, nt in gt.nodes.items()}
    assert sorted(roles.values()) == [("server", 0), ("server", 1), ("worker", 0), ("worker", 1)]
    return set_hosts(gt, {n: "hostA" if rk == 0 else "hostB" for n, (_, rk) in roles.items()})


@pytest.mark.slow
def test_ps_recovers_injected_skew(ps2):
    base = align(ps2)
    ref = base.reference
    for n, v in base.offsets_us.items():
        assert abs(v) <= PS_IDENTIFIABLE_US, (n, v, base.notes)
    for per_host in ({"hostB": 900.0}, {"hostB": -25_000.0}, {"hostA": 4_000.0, "hostB": -7_500.0}):
        res = align(ps2 if not per_host else inject(ps2, per_host))
        assert res.reference == ref and res.status.startswith("optimal"), res.notes
        want = expected(ps2, per_host, ref)
        for n in ps2.nodes:
            assert abs(res.offsets_us[n] - base.offsets_us[n] - want[n]) <= 50.0, (per_host, n)
            assert abs(res.offsets_us[n] - want[n]) <= PS_IDENTIFIABLE_US
        assert res.terms["max_violation_ms"] * 1e3 <= AlignOptions().tolerance_us + 1e-3


@pytest.mark.slow
def test_ps_replay_with_and_without_alignment(ps2):
    base = replay(ps2)  # one host's clock per host: nothing to undo but the identifiability error
    for d in (-30_000.0, -5_000.0, 5_000.0, 30_000.0):
        skewed = inject(ps2, {"hostB": d})
        fixed = replay(skewed)
        raw = replay(skewed, align_clocks=False)
        assert abs(fixed.error_pct - base.error_pct) <= 1.0, (d, base.error_pct, fixed.error_pct, raw.error_pct)
        assert abs(raw.error_pct - base.error_pct) <= 1.0, (d, base.error_pct, raw.error_pct)  # durations only
