"""Profile real single-GPU jobs with dpro's two-line recorder; the harness times them unprofiled.

The GPU check of ``dpro.Recorder`` (CUDA activity, one rank): for each job of
``record_kineto.py`` it first times ``--reps`` windows of ``--steps`` steps without dpro
(``torch.cuda.synchronize()`` at both ends of each window; median of the windows), then runs
``warmup + steps + after`` calls of the same step function decorated with ``@dpro.profile``,
which writes the raw recording to ``OUT/<job>/``. Import it elsewhere with ``dpro collect``
and compare ``dpro replay``'s prediction (and its unprofiled prediction) to
``OUT/<job>.measured.json``.

``--light`` records with ``DPRO_CUDA_LIGHT=1`` (the window's first call with CPU operators,
the others CUDA-only; ``rank0.light.gz`` next to ``rank0.json.gz``).

Needs torch with CUDA, torchvision and dpro's recorder (pure Python; orjson). Usage::

    PYTHONPATH=. python3 benchmarks/gpu/record_recorder.py --out /tmp/rec
    PYTHONPATH=. python3 benchmarks/gpu/record_recorder.py --out /tmp/rec --light
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_kineto import _step, unprofiled_windows  # noqa: E402

import dpro  # noqa: E402

JOBS = ["resnet50_sync", "gpt_sync", "mlp_launch_bound"]


def run(name: str, out: Path, steps: int, reps: int) -> None:
    (model, batch, loss_fn, opt, sync), windows = unprofiled_windows(name, steps, reps)

    recorder = dpro.Recorder(model, out_dir=out / name, warmup=5, steps=5)  # dpro line 1

    @dpro.profile(recorder)  # dpro line 2
    def train_step() -> None:
        _step(model, batch(), loss_fn, opt, sync)

    for _ in range(5 + 5 + 20):
        train_step()
    torch.cuda.synchronize()
    meta = {"job": name, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "windows_us": windows, "measured_step_us": statistics.median(windows)}
    (out / f"{name}.measured.json").write_text(json.dumps(meta, indent=1))
    print(f"{name}: unprofiled {meta['measured_step_us']:.0f} us/step", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--jobs", default=",".join(JOBS))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--light", action="store_true", help="record with DPRO_CUDA_LIGHT=1")
    a = p.parse_args()
    if a.light:
        os.environ["DPRO_CUDA_LIGHT"] = "1"
    a.out.mkdir(parents=True, exist_ok=True)
    for name in a.jobs.split(","):
        try:
            run(name, a.out, a.steps, a.reps)
        except Exception as e:  # keep the other jobs' recordings
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
