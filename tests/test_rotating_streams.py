"""GPU streams that rotate from step to step (dpro/importers/kineto/streams.py).

ProcessGroupGloo copies CUDA tensors on a stream of torch's pool, another one at each
collective; named by stream id, no two steps of a DDP-over-gloo GPU job shared a structure and
the replay of dpro's own recording of such a job was +144 % (the real recording below)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpro.importers.kineto.segments import Seg
from dpro.importers.kineto.streams import name_rotating_streams

DATA = Path(__file__).resolve().parent / "data" / "gpu_h200" / "recorder_mlp_gloo2"


def _seg(dev: str, step: int, ts: float) -> Seg:
    s = Seg(dev, "k", ts, ts + 1.0)
    s.step = step
    return s


def test_rotating_streams_named_by_order_in_their_step() -> None:
    gpu = [_seg("gpu0:s7", st, 100.0 * st) for st in range(4)]  # the compute stream: every step
    # two pool streams per step, a new pair each step; in step 2 the later one starts first
    gpu += [_seg("gpu0:s92", 0, 10.0), _seg("gpu0:s96", 0, 20.0), _seg("gpu0:s100", 1, 110.0),
            _seg("gpu0:s104", 1, 120.0), _seg("gpu0:s108", 2, 230.0), _seg("gpu0:s112", 2, 220.0),
            _seg("gpu0:s116", 3, 310.0), _seg("gpu0:s120", 3, 320.0), _seg("gpu1:s5", 3, 330.0)]
    pre = _seg("gpu0:s92", -2, -5.0)  # launched before the capture: no step, left alone
    assert name_rotating_streams(gpu + [pre]) == 9
    assert [s.dev for s in gpu[:4]] == ["gpu0:s7"] * 4
    assert [s.dev for s in gpu[4:]] == ["gpu0:r0", "gpu0:r1", "gpu0:r0", "gpu0:r1", "gpu0:r1", "gpu0:r0",
                                        "gpu0:r0", "gpu0:r1", "gpu1:r0"]
    assert pre.dev == "gpu0:s92"


@pytest.mark.parametrize("devs", [
    [("gpu0:s7", 0), ("gpu0:s92", 0)],  # one step: nothing to match across steps
    [("gpu0:s7", 0), ("gpu0:s7", 1), ("gpu0:s7", 2), ("gpu0:s9", 2)],  # only one step has a rare stream
    [("gpu0:s7", 0), ("gpu0:s7", 1), ("gpu0:s7", 2), ("gpu0:s9", 0), ("gpu0:s9", 1), ("gpu0:s9", 2)],
])
def test_streams_kept(devs) -> None:
    gpu = [_seg(d, st, float(i)) for i, (d, st) in enumerate(devs)]
    assert name_rotating_streams(gpu) == 0
    assert [s.dev for s in gpu] == [d for d, _ in devs]


def test_gloo_ddp_gpu_recording_replays_its_steps(tmp_path) -> None:
    """dpro's recorder on a real 2-rank DDP-over-gloo GPU job (H200): steps 1-4 share one
    structure and the replay is within 2 % of the measured step (+144 % before)."""
    from dpro.importers.recording.collect import collect
    from dpro.job import prepare

    gt = collect(DATA)
    assert gt.manifest.steps == [1, 2, 3, 4]
    assert sum("GPU streams each run work in few steps" in n for n in gt.notes) == 2
    res = prepare(gt).replay()
    assert res.predicted_iteration_us == pytest.approx(res.measured_iteration_us, rel=0.02)


def test_aligned_steps_do_not_close_a_cycle() -> None:
    """Rank 0 of a real DDP-over-gloo ResNet-18 GPU recording (8 calls): in a step aligned with
    the reference one, ``aten::item``'s launch and wait fall in other pieces, and the sync's
    wait edge (kept from the reference step only) closed a cycle with the launch edge."""
    from dpro.gtrace.validate import check_acyclic
    from dpro.importers.kineto import import_kineto

    gt = import_kineto(DATA.parent / "recorder_resnet18_gloo2_rank0")
    check_acyclic(gt)
    assert any("aligned with step 2" in n for n in gt.notes)
    assert len(gt.manifest.steps) >= 4
