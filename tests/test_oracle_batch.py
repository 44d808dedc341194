"""dpro oracle's batch rule (issue #29): a layer's time per call affine in the per-device
batch, a + b·batch, fitted on profiles at two batches; hand-computed on a two-layer
network, the clamps, the bad input, and the command line on two real traces of
examples/parallel/train.py (data parallelism, 2 ranks, global batch 32 and 16)."""

from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from dpro.errors import DproInputError
from dpro.oracle.formulas import Options, predict
from dpro.oracle.layers import AFFINE, PROPORTIONAL, WEIGHTED, Layer, ModelProfile, _fit, affine_profile, guard
from dpro.oracle.platform import Platform

DATA = Path(__file__).parent / "data" / "oracle_cnn"          # batch 32 on 2 ranks: 16 per device
DATA8 = Path(__file__).parent / "data" / "oracle_cnn_b16"     # batch 16 on 2 ranks: 8 per device
PLAT = Platform(alpha_us=10.0, beta_us_per_byte=0.01)


def conv(**kw) -> Layer:
    return Layer("conv", WEIGHTED, **({"fw_us": 10, "bw_us": 20, "wu_us": 3, "x_bytes": 128, "y_bytes": 256,
                                        "w_bytes": 300, "channels": 2, "filters": 4, "height": 4, "width": 4,
                                        "kernel": 3} | kw))


def fc(**kw) -> Layer:
    return Layer("fc", WEIGHTED, **({"fw_us": 1, "bw_us": 2, "wu_us": 5, "x_bytes": 256, "y_bytes": 8,
                                      "w_bytes": 2000, "channels": 64, "filters": 2} | kw))


def at4() -> ModelProfile:
    """tests/test_oracle.py's two-layer network profiled at 4 samples per device: per call
    conv fw 40, bw 80 µs; fc fw 4, bw 8 µs."""
    return ModelProfile([conv(), fc()], batch=4, source="a", batches=[4])


def at8() -> ModelProfile:
    """The same at 8 samples: conv fw 7.5 x 8 = 60, bw 15 x 8 = 120; fc fw 8, bw 1.5 x 8 + 2 = 14;
    WU 5 and 7 µs."""
    return ModelProfile([conv(fw_us=7.5, bw_us=15, wu_us=5), fc(bw_us=1.5, bw_call_us=2, wu_us=7)], batch=8,
                        overhead_us=2.0, source="b", batches=[8])


def test_affine_fit_two_layers() -> None:
    m = affine_profile([at4(), at8()])
    assert (m.rule, m.batches, m.batch, m.source) == (AFFINE, [4, 8], 4, "a")
    c, f = m.layers
    # conv fw: (60 - 40) / 4 = 5 per sample, 40 - 4 x 5 = 20 per call; bw: 10 and 40
    assert (c.fw_us, c.fw_call_us, c.bw_us, c.bw_call_us) == pytest.approx((5, 20, 10, 40))
    # fc fw: 1 per sample, 0 per call; bw: (14 - 8) / 4 = 1.5, 8 - 6 = 2
    assert (f.fw_us, f.fw_call_us, f.bw_us, f.bw_call_us) == pytest.approx((1, 0, 1.5, 2))
    assert (c.wu_us, f.wu_us, m.overhead_us) == pytest.approx((4, 6, 1))  # batch-independent: averaged
    assert (c.x_bytes, c.filters, f.w_bytes) == (128, 4, 2000)
    assert any("affine rule" in n and "4, 8" in n for n in m.notes)


def predict_(m: ModelProfile, strategy: str, p: int):
    return predict(m, strategy, p, PLAT, Options(batch=8))


def test_affine_compute_by_strategy() -> None:
    """Compute with the fitted model: the fixed part is paid whole by every rank and call
    (+ the averaged per-iteration overhead, 1 µs)."""
    m = affine_profile([at4(), at8()])
    # data, 4 samples per device: conv 15 x 4 + 60, fc 2.5 x 4 + 2, WU 4 + 6 (proportional at 4: 140)
    assert predict_(m, "data", 2).compute_us == pytest.approx(120 + 12 + 10 + 1)
    # data, 2 samples per device: 90 + 7 + 10 + 1 (proportional: 33 x 2 + 8 = 74)
    assert predict_(m, "data", 4).compute_us == pytest.approx(108)
    assert predict_(at4(), "data", 4).compute_us == pytest.approx(74)
    # filter on 2: both layers split, B/p = 4 samples, WU / p
    assert predict_(m, "filter", 2).compute_us == pytest.approx(132 + 5 + 1)
    # pipeline on 2: 8 micro-batches of 1 sample; stage conv fw 5 + 20, bw 10 + 40; (2 + 8 - 1) x 75 + WU max 6 + 1
    assert predict_(m, "pipeline", 2).compute_us == pytest.approx(9 * 75 + 6 + 1)


def test_fit_clamps() -> None:
    assert _fit([(4, 40.0), (8, 60.0)]) == (pytest.approx(20), pytest.approx(5), False)
    # a slower smaller batch (noise on a batch-independent time): no slope, the mean per call
    assert _fit([(4, 12.0), (8, 10.0)]) == (pytest.approx(11), 0.0, True)
    # a negative intercept: proportional through 0, least squares (4 x 4 + 8 x 20) / (16 + 64)
    assert _fit([(4, 4.0), (8, 20.0)]) == (0.0, pytest.approx(176 / 80), True)
    # three profiles, two at one batch: least squares through the means (4: 40, 8: 55 and 65)
    assert _fit([(4, 40.0), (8, 55.0), (8, 65.0)]) == (pytest.approx(20), pytest.approx(5), False)
    m = affine_profile([at4(), replace(at8(), layers=[conv(fw_us=4), fc()])])
    assert m.layers[0].fw_us == 0 and m.layers[0].fw_call_us == pytest.approx(36)
    assert any("clamped" in n and "conv" in n for n in m.notes)


def test_one_profile_keeps_proportional() -> None:
    m = affine_profile([at4()])
    assert m.rule == PROPORTIONAL and m.layers[0].fw_call_us == 0


@pytest.mark.parametrize("other,msg", [
    (lambda: replace(at8(), batch=4, batches=[4]), "same per-device batch (4)"),
    (lambda: replace(at8(), layers=[conv()]), "its layers differ (fc)"),
    (lambda: replace(at8(), layers=[conv(filters=8), fc()]), "layer conv has filters 8, not 4"),
])
def test_bad_profiles(other, msg) -> None:
    with pytest.raises(DproInputError) as e:
        affine_profile([at4(), other()])
    assert msg in str(e.value) and str(e.value).startswith("b: ") and "\n" not in str(e.value)


def test_cli_profile_at(run_cli) -> None:
    code, out, err = run_cli("oracle", DATA, "--profile-at", DATA8, "--devices", "2,4", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["model"]["batch_rule"] == "affine" and d["model"]["profiled_batches_per_device"] == [16, 8]
    assert d["model"]["profiled_batch_per_device"] == 16 and d["batch"] == 32
    assert any("affine rule" in n for n in d["notes"]) and any(n.startswith("guarded: ") for n in d["notes"])
    lay = d["model"]["layers"]
    assert all(x["batch_rule"] in (AFFINE, PROPORTIONAL) and x["affine_guard"]["supported"] == (x["batch_rule"] == AFFINE)
               for x in lay)
    assert all(x["fw_us_per_sample"] >= 0 and x["fw_call_us"] >= 0 and x["bw_call_us"] >= 0 for x in lay)
    assert len(d["strategies"]) == 14
    code, out, err = run_cli("oracle", DATA, "--devices", "2", "--json")
    d = json.loads(out)
    assert d["model"]["batch_rule"] == "proportional" and d["model"]["profiled_batches_per_device"] == [16]
    assert any("one profile (16 samples per device)" in n and "--profile-at" in n for n in d["notes"])


def test_cli_profile_at_bad(run_cli, tmp_path: Path) -> None:
    """The same batch twice, and a profile of another model (conv2's weight shape edited): one line, exit 2."""
    code, _, err = run_cli("oracle", DATA, "--profile-at", DATA, "--devices", "2")
    assert code == 2 and "same per-device batch (16)" in err and len(err.strip().splitlines()) == 1
    d = tmp_path / "other"
    shutil.copytree(DATA8, d)
    for f in d.glob("*.dfg.json.gz"):
        dfg = json.loads(gzip.decompress(f.read_bytes()))
        dims = dfg["meta"]["layer_shapes"]["conv2"]["dims"]
        dims[1] = [48, *dims[1][1:]]
        f.write_bytes(gzip.compress(json.dumps(dfg).encode()))
    code, _, err = run_cli("oracle", DATA, "--profile-at", d, "--devices", "2")
    assert code == 2 and "not the model of" in err and "conv2" in err and len(err.strip().splitlines()) == 1


def test_guard_by_hand() -> None:
    """The fit through each batch's median, and the repeats' spread (max - min) propagated
    through its weights: at 4 and 8 samples, a = 2 t4 - t8, b = (t8 - t4) / 4."""
    g = guard([(4, 100.0), (4, 110.0), (4, 120.0), (8, 150.0), (8, 160.0)])
    # medians 110 and 155: b = 45 / 4 = 11.25, a = 110 - 45 = 65; spreads 20 and 10:
    # u_a = sqrt((2 x 20)^2 + (1 x 10)^2) = sqrt(1700), u_b = sqrt((20 / 4)^2 + (10 / 4)^2) = sqrt(31.25)
    assert (g.a_us, g.b_us) == pytest.approx((65, 11.25))
    assert (g.u_a_us, g.u_b_us) == pytest.approx((1700 ** 0.5, 31.25 ** 0.5))
    assert g.supported
    # one launch at 4 samples 60 µs slower: medians 130, 155, a = 105 under u_a = sqrt(120^2 + 10^2)
    g = guard([(4, 100.0), (4, 160.0), (8, 150.0), (8, 160.0)])
    assert (g.a_us, g.u_a_us) == pytest.approx((105, (120 ** 2 + 10 ** 2) ** 0.5)) and not g.supported
    # no repeats: no spread, only a negative part refuses the fit
    assert guard([(4, 40.0), (8, 60.0)]).supported and not guard([(4, 12.0), (8, 10.0)]).supported


def test_guarded_rule_per_layer() -> None:
    """Two profiles at 4 samples and one at 8: conv's repeats agree (spread 0: affine, as in
    test_affine_fit_two_layers); fc's differ by 20 µs per call at 4 samples and its time does
    not grow with the batch (medians 22 and 22: b = 0, not above u_b = 20 / 4): the first
    profile's proportional times."""
    again = ModelProfile([conv(), fc(bw_call_us=20)], batch=4, source="a2", batches=[4])
    m = affine_profile([at4(), again, at8()])
    assert m.rule == AFFINE and m.batches == [4, 4, 8]
    assert m.layer_rules == {"conv": AFFINE, "fc": PROPORTIONAL}
    c, f = m.layers
    assert (c.fw_us, c.fw_call_us, c.bw_us, c.bw_call_us) == pytest.approx((5, 20, 10, 40))
    assert (f.fw_us, f.fw_call_us, f.bw_us, f.bw_call_us) == pytest.approx((1, 0, 2, 0))  # at4()'s
    assert (c.wu_us, f.wu_us, m.overhead_us) == pytest.approx((11 / 3, 17 / 3, 2 / 3))
    g = m.guards["fc"]
    assert (g.a_us, g.b_us, g.u_b_us) == pytest.approx((22, 0, 5)) and not g.supported
    assert any(n.startswith("guarded: affine for conv; proportional") and "fc" in n and "spread" in n for n in m.notes)
    # data on 2 devices, 4 samples each: conv 15 x 4 + 60, fc 3 x 4, WU 28 / 3, overhead 2 / 3
    assert predict_(m, "data", 2).compute_us == pytest.approx(120 + 12 + 28 / 3 + 2 / 3)


def test_guard_without_repeats_refuses_a_negative_part() -> None:
    """One profile per batch: fc slower at 4 than at 8 samples (12 vs 6 µs per call): the
    proportional rule for fc, where the unguarded fit clamped it to a fixed 9 µs."""
    m = affine_profile([at4(), replace(at8(), layers=[conv(fw_us=7.5, bw_us=15), fc(fw_us=0.25, bw_us=0.5)])])
    assert m.layer_rules == {"conv": AFFINE, "fc": PROPORTIONAL}
    assert (m.layers[1].fw_us, m.layers[1].fw_call_us) == (1, 0)
    assert any("no repeated profiles" in n for n in m.notes)
