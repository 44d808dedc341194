"""The speed-up of a ``foreach`` or ``fused`` optimizer over the per-parameter loop on this
CPU, for ``dpro whatif --apply fused_optimizer:speedup=X``.

    python benchmarks/whatif/optimizer_calibration.py [--model mlp] [--json opt.json]

One thread; the example model's parameters (examples/pytorch/models.py) with random
gradients; ``torch.optim.SGD(lr=0.01, momentum=0.9)`` with ``foreach=False`` (the plain
job's optimizer: per parameter a ``mul_`` and two ``add_``), ``foreach=True`` and
``fused=True``, their ``step()`` timed interleaved, ``--repeats`` rounds, medians; the
speed-up of a variant is (loop time) / (variant time). These are memory-bound kernels: what
a fused kernel saves is passes over memory, which depends on the CPU's caches and memory
bandwidth, not on the job, hence a measurement on the machine, not a constant.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

VARIANTS = {"sgd": {"foreach": False}, "sgd-foreach": {"foreach": True}, "sgd-fused": {"fused": True}}


def calibrate(model: str = "mlp", repeats: int = 30) -> dict[str, float]:
    """Median ``step()`` µs per optimizer variant."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "pytorch"))
    from models import build

    torch.set_num_threads(1)
    torch.manual_seed(0)
    opts = {}
    for name, kw in VARIANTS.items():
        params = [p.detach().clone().requires_grad_(True) for p in build(model)[0].parameters()]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        opts[name] = torch.optim.SGD(params, lr=0.01, momentum=0.9, **kw)
    ts: dict[str, list[float]] = {n: [] for n in opts}
    for r in range(repeats + 2):
        for name, opt in opts.items():
            t0 = time.perf_counter()
            opt.step()
            if r >= 2:  # the first steps create the momentum buffers
                ts[name].append((time.perf_counter() - t0) * 1e6)
    return {n: statistics.median(v) for n, v in ts.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    us = calibrate(a.model, a.repeats)
    speedup = {n: round(us["sgd"] / t, 3) for n, t in us.items() if n != "sgd"}
    for n, t in us.items():
        print(f"{n:12} step {t / 1e3:7.2f} ms" + (f"  speed-up x{speedup[n]:.3f}" if n in speedup else ""))
    if a.json:
        a.json.write_text(json.dumps({"model": a.model, "step_us": us, "speedup": speedup}, indent=1))


if __name__ == "__main__":
    main()
