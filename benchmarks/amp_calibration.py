"""Calibrate the mixed-precision pass: own time of op classes under bf16 autocast / fp32.

    python benchmarks/amp_calibration.py                   # prints the factors
    python benchmarks/amp_calibration.py --json amp.json   # for DPRO_AMP_FACTORS=amp.json
    python benchmarks/amp_calibration.py --model mlp       # at an example model's own layers

One process, one thread (as the examples' ranks). Forward alone and forward + backward are
timed, fp32 and under ``torch.autocast(device, dtype)`` interleaved, ``--repeats`` medians;
the backward is (forward + backward) - forward. The backward gets a dense random upstream
gradient, as in training: ``y.sum().backward()`` would hand it an expanded (stride 0)
tensor, which takes another, faster kernel for the low-precision matmuls (on a CPU without
native bf16, x43 instead of x750 for a 2048x2048 linear). Each parameter's gradient is reset
to None first (``zero_grad(set_to_none=True)``, no accumulation).

Without ``--model`` the cases are sizes of the example models and a class's factor is the
median over its sizes of (autocast time / fp32 time). With ``--model NAME`` the cases are
that model's own ``nn.Linear`` / ``nn.Conv2d`` layers at their input shapes (recorded by a
forward hook on one batch; the input of a layer that gets the data needs no gradient, so its
backward has no input-gradient matmul) and a class's factor is the ratio of the summed
times (autocast / fp32): the factor the pass applies to the class's summed own time. The
factors depend on the shapes (which gemm kernel runs) much more under an emulated bf16
than with native support. ``--model`` also writes the summed times per class (``times_us``:
autocast and fp32, µs per step), which ``dpro whatif --apply mixed_precision:absolute=1`` (or ``auto=1``)
uses instead of the factors, and each layer's four times (``layers``: fp32 forward, autocast forward,
fp32 backward, autocast backward, µs). On a GPU pass ``--device cuda --dtype float16``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

#: a case: a forward function returning the output, and the parameters to reset
Case = tuple[Callable, list]


def _generic_cases(torch, device: str) -> dict[str, list[Case]]:
    nn = torch.nn
    f = torch.nn.functional

    def lin(b, i, o):
        m = nn.Linear(i, o).to(device)
        x = torch.randn(b, i, device=device, requires_grad=True)
        return (lambda: m(x)), list(m.parameters())

    def conv(b, c, o, hw):
        m = nn.Conv2d(c, o, 3, padding=1).to(device)
        x = torch.randn(b, c, hw, hw, device=device, requires_grad=True)
        return (lambda: m(x)), list(m.parameters())

    def sdpa(b, h, t, d):
        q, k, v = (torch.randn(b, h, t, d, device=device, requires_grad=True) for _ in range(3))
        return (lambda: f.scaled_dot_product_attention(q, k, v)), []

    return {
        "matmul": [lin(32, 1024, 2048), lin(32, 2048, 2048), lin(1024, 128, 512), lin(1024, 512, 128),
                   lin(1024, 128, 2000)],
        "conv": [conv(32, 3, 32, 32), conv(32, 64, 128, 16), conv(32, 128, 128, 8)],
        "attention": [sdpa(16, 4, 64, 32)],
    }


def _model_cases(torch, device: str, name: str) -> dict[str, list[Case]]:
    """The model's Linear and Conv2d layers, each on an input of the shape it gets in one
    forward pass of a default batch (examples/pytorch/models.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "pytorch"))
    from models import DEFAULT_BATCH_SIZE, build

    model, make_batch, _ = build(name)
    model.to(device)
    seen: list[tuple[str, object, tuple, bool]] = []
    kinds = {torch.nn.Linear: "matmul", torch.nn.Conv2d: "conv"}
    hooks = [m.register_forward_hook(lambda mod, inp, out, c=c: seen.append((c, mod, tuple(inp[0].shape),
                                                                             inp[0].requires_grad)))
             for m in model.modules() for k, c in kinds.items() if type(m) is k]
    x, _ = make_batch(DEFAULT_BATCH_SIZE[name])
    model(x.to(device))
    for h in hooks:
        h.remove()
    out: dict[str, list[Case]] = {}
    for cls, mod, shape, needs_grad in seen:
        inp = torch.randn(*shape, device=device, requires_grad=needs_grad)
        out.setdefault(cls, []).append(((lambda m=mod, i=inp: m(i)), list(mod.parameters())))
    return out


def _time(torch, case: Case, backward: bool, amp: bool, device: str, dtype, n: int) -> float:
    fn, params = case
    grad = {}

    def once():
        for p in params:
            p.grad = None
        with torch.autocast(device, dtype=dtype, enabled=amp):
            y = fn()
        if backward:
            y = y.float()
            if y.shape not in grad:
                grad[y.shape] = torch.randn(y.shape, device=device)
            y.backward(grad[y.shape])

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


def calibrate(device: str = "cpu", dtype_name: str = "bfloat16", repeats: int = 15,
              model: str | None = None, times: dict | None = None) -> dict[str, dict[str, float]]:
    """The factors per class and direction; with ``model`` and a ``times`` dict, also the
    summed times (µs) per class of the model's layers, autocast and fp32, into ``times``."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    cases = _model_cases(torch, device, model) if model else _generic_cases(torch, device)
    out = {}
    for cls, fns in cases.items():
        rows = []  # per case: fp32 forward, autocast forward, fp32 backward, autocast backward
        for fn in fns:
            t = {(b, a): _time(torch, fn, b, a, device, dtype, repeats) for b in (False, True) for a in (False, True)}
            rows.append((t[(False, False)], t[(False, True)], max(1e-3, t[(True, False)] - t[(False, False)]),
                         max(1e-3, t[(True, True)] - t[(False, True)])))
        if model:  # the factor of the class's summed time
            fw = sum(r[1] for r in rows) / sum(r[0] for r in rows)
            bw = sum(r[3] for r in rows) / sum(r[2] for r in rows)
            if times is not None:
                times[cls] = {"FW": round(sum(r[1] for r in rows), 1), "BW": round(sum(r[3] for r in rows), 1),
                              "FW_fp32": round(sum(r[0] for r in rows), 1), "BW_fp32": round(sum(r[2] for r in rows), 1),
                              "layers": [[round(x, 1) for x in r] for r in rows]}
        else:
            fw = statistics.median(r[1] / r[0] for r in rows)
            bw = statistics.median(r[3] / r[2] for r in rows)
        out[cls] = {"FW": round(fw, 3), "BW": round(bw, 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--model", default=None, help="measure at this example model's layers (mlp, convnet, ...)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    times: dict = {}
    f = calibrate(args.device, args.dtype, args.repeats, args.model, times)
    for cls, v in f.items():
        t = times.get(cls)
        print(f"{cls:<10} forward x{v['FW']:.3f}  backward x{v['BW']:.3f}" + (
            f"  (autocast {t['FW'] / 1e3:.2f} / {t['BW'] / 1e3:.2f} ms, fp32 {t['FW_fp32'] / 1e3:.2f} / "
            f"{t['BW_fp32'] / 1e3:.2f} ms)" if t else ""))
    if args.json:
        d = {"device": args.device, "dtype": args.dtype, "model": args.model, "factors": f}
        if times:  # for dpro whatif --apply mixed_precision:absolute=1 / auto=1
            d["times_us"] = times
        args.json.write_text(json.dumps(d, indent=1))


if __name__ == "__main__":
    main()
