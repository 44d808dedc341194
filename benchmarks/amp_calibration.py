"""Calibrate the mixed-precision pass: own time of op classes under bf16 autocast / fp32.

    python benchmarks/amp_calibration.py                   # prints the factors
    python benchmarks/amp_calibration.py --json amp.json   # for DPRO_AMP_FACTORS=amp.json

One process, one thread (as the examples' ranks), each op class at sizes taken from the
example models; forward alone and forward + backward are timed, fp32 and under
``torch.autocast(device, dtype)`` interleaved, ``--repeats`` medians. The factor of a
class is the median over its sizes of (autocast time / fp32 time), separately for the
forward and the backward (forward + backward minus forward). On a GPU pass
``--device cuda --dtype float16``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def _cases(torch, device: str):
    nn = torch.nn
    f = torch.nn.functional

    def lin(b, i, o):
        m = nn.Linear(i, o).to(device)
        x = torch.randn(b, i, device=device, requires_grad=True)
        return lambda: m(x)

    def conv(b, c, o, hw):
        m = nn.Conv2d(c, o, 3, padding=1).to(device)
        x = torch.randn(b, c, hw, hw, device=device, requires_grad=True)
        return lambda: m(x)

    def sdpa(b, h, t, d):
        q, k, v = (torch.randn(b, h, t, d, device=device, requires_grad=True) for _ in range(3))
        return lambda: f.scaled_dot_product_attention(q, k, v)

    return {
        "matmul": [lin(32, 1024, 2048), lin(32, 2048, 2048), lin(1024, 128, 512), lin(1024, 512, 128),
                   lin(1024, 128, 2000)],
        "conv": [conv(32, 3, 32, 32), conv(32, 64, 128, 16), conv(32, 128, 128, 8)],
        "attention": [sdpa(16, 4, 64, 32)],
    }


def _time(torch, fn, backward: bool, amp: bool, device: str, dtype, n: int) -> float:
    def once():
        with torch.autocast(device, dtype=dtype, enabled=amp):
            y = fn()
        if backward:
            y.float().sum().backward()

    for _ in range(2):
        once()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        once()
        if device == "cuda":
            torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(ts)


def calibrate(device: str = "cpu", dtype_name: str = "bfloat16", repeats: int = 15) -> dict[str, dict[str, float]]:
    import torch

    torch.set_num_threads(1)
    dtype = getattr(torch, dtype_name)
    out = {}
    for cls, fns in _cases(torch, device).items():
        fw, bw = [], []
        for fn in fns:
            t = {(b, a): _time(torch, fn, b, a, device, dtype, repeats) for b in (False, True) for a in (False, True)}
            fw.append(t[(False, True)] / t[(False, False)])
            bw.append(max(1e-3, t[(True, True)] - t[(False, True)]) / max(1e-3, t[(True, False)] - t[(False, False)]))
        out[cls] = {"FW": round(statistics.median(fw), 3), "BW": round(statistics.median(bw), 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    f = calibrate(args.device, args.dtype, args.repeats)
    for cls, v in f.items():
        print(f"{cls:<10} forward x{v['FW']:.3f}  backward x{v['BW']:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "dtype": args.dtype, "factors": f}, indent=1))


if __name__ == "__main__":
    main()
