"""Calibrate the mixed-precision pass: own time of op classes under bf16 autocast / fp32.

    python benchmarks/amp_calibration.py                   # prints the factors
    python benchmarks/amp_calibration.py --json amp.json   # for DPRO_AMP_FACTORS=amp.json
    python benchmarks/amp_calibration.py --model mlp       # at an example model's own layers

One process, one thread (as the examples' ranks). A step of a case is one forward and one
backward, each timed apart. Every repeat runs each case's fp32 step and its step under
``torch.autocast(device, dtype)`` back to back, the order alternating, so a ratio autocast /
fp32 is taken within one phase of this shared machine (the other core's work moves the times
by tens of % over seconds: the summed fp32 forward of the MLP's layers moved 8.0-11.3 ms across
six calibrations of sessions 26-27, each a median of 5 unpaired repeats); a factor is the median over
``--tries`` tries of the median over ``--repeats`` repeats of the paired ratio. The backward gets a dense random upstream
gradient, as in training: ``y.sum().backward()`` would hand it an expanded (stride 0)
tensor, which takes another, faster kernel for the low-precision matmuls (on a CPU without
native bf16, x43 instead of x750 for a 2048x2048 linear). Each parameter's gradient is reset
to None first (``zero_grad(set_to_none=True)``, no accumulation).

Without ``--model`` the cases are sizes of the example models and a class's factor is the
median over its sizes of (autocast time / fp32 time). With ``--model NAME`` the cases are
that model's own ``nn.Linear`` / ``nn.Conv2d`` layers at their input shapes (recorded by a
forward hook on one batch; the input of a layer that gets the data needs no gradient, so its
backward has no input-gradient matmul) and a class's factor is the paired ratio of the summed
times (autocast / fp32 within a repeat): the factor the pass applies to the class's summed own time. The
factors depend on the shapes (which gemm kernel runs) much more under an emulated bf16
than with native support. ``--model`` also writes the summed times per class (``times_us``:
fp32: the median sum; autocast: the fp32 sum times the factor; µs per step), which ``dpro whatif --apply mixed_precision:absolute=1`` (or ``auto=1``)
uses instead of the factors, and each layer's four times (``layers``: fp32 forward, autocast forward,
fp32 backward, autocast backward, µs, medians), each try's ratios (``tries``) and each repeat's four sums (``sums``, per try). On a GPU pass ``--device cuda --dtype float16``.
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


#: one repeat of one case: fp32 forward, autocast forward, fp32 backward, autocast backward (µs)
Row = tuple[float, float, float, float]


def _step(torch, case: Case, amp: bool, device: str, dtype, grad: dict) -> tuple[float, float]:
    """One forward + backward of ``case``: (forward µs, backward µs), timed apart within the
    same step (the backward: the output's cast to fp32 and ``backward`` on a dense random
    upstream gradient, one per output shape, kept in ``grad``)."""
    fn, params = case
    for p in params:
        p.grad = None
    t0 = time.perf_counter()
    with torch.autocast(device, dtype=dtype, enabled=amp):
        y = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    y = y.float()
    if y.shape not in grad:
        grad[y.shape] = torch.randn(y.shape, device=device)
    y.backward(grad[y.shape])
    if device == "cuda":
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) * 1e6, (t2 - t1) * 1e6


def measure_try(torch, cases: list[Case], device: str, dtype, repeats: int) -> list[list[Row]]:
    """One try: ``repeats`` repeats of every case, each case's fp32 and autocast steps back to
    back (paired), the order alternating (fp32 first where repeat + case index is even), so
    that each pair, and each repeat's sum over the cases, is taken within one phase of the
    machine. Returns rows[repeat][case]."""
    grads = [{} for _ in cases]
    for case, g in zip(cases, grads):  # warm-up: allocator, kernels, the weights' casts
        for amp in (False, True, False, True):
            _step(torch, case, amp, device, dtype, g)
    rows = []
    for k in range(repeats):
        row = []
        for i, (case, g) in enumerate(zip(cases, grads)):
            t = {}
            for amp in ((False, True) if (k + i) % 2 == 0 else (True, False)):
                t[amp] = _step(torch, case, amp, device, dtype, g)
            row.append((t[False][0], t[True][0], t[False][1], t[True][1]))
        rows.append(row)
    return rows


def paired_ratio(rows: list[list[Row]], low: int, fp32: int) -> float:
    """The median over repeats of (sum over cases of column ``low``) / (sum of column ``fp32``):
    each ratio within one repeat (one phase of the machine)."""
    return statistics.median(sum(r[low] for r in row) / sum(r[fp32] for r in row) for row in rows)


def summarize(tries: list[list[list[Row]]], summed: bool) -> tuple[dict[str, float], dict | None]:
    """A class's factors from its tries (rows[repeat][case] each) and, with ``summed``, its times.

    ``summed`` (a model's own layers): per try, the paired ratio of the summed times
    (:func:`paired_ratio` over all the cases); the factor is the median over the tries. Else
    (sizes of several models) per case the median over the tries of its paired ratio, and the
    factor is the median over the cases. The times (µs, ``summed`` only): the fp32 sums the
    median over all repeats of all tries, the autocast sums the fp32 sum times the factor (so
    that autocast / fp32 is the factor, whichever a reader takes), ``layers`` each case's four
    medians, ``tries`` each try's ratios."""
    factors, tr = {}, {}
    for d, (low, fp32) in (("FW", (1, 0)), ("BW", (3, 2))):
        if summed:
            tr[d] = [paired_ratio(rows, low, fp32) for rows in tries]
            factors[d] = statistics.median(tr[d])
        else:
            n = len(tries[0][0])
            factors[d] = statistics.median(
                statistics.median(paired_ratio([[row[i]] for row in rows], low, fp32) for rows in tries)
                for i in range(n))
    if not summed:
        return {d: round(v, 3) for d, v in factors.items()}, None
    allrows = [row for rows in tries for row in rows]
    fw32 = statistics.median(sum(r[0] for r in row) for row in allrows)
    bw32 = statistics.median(sum(r[2] for r in row) for row in allrows)
    times = {"FW": round(fw32 * factors["FW"], 1), "BW": round(bw32 * factors["BW"], 1),
             "FW_fp32": round(fw32, 1), "BW_fp32": round(bw32, 1),
             "layers": [[round(statistics.median(row[i][j] for row in allrows), 1) for j in range(4)]
                        for i in range(len(allrows[0]))],
             "tries": {d: [round(x, 4) for x in v] for d, v in tr.items()},
             "sums": [[[round(sum(r[j] for r in row), 1) for j in range(4)] for row in rows] for rows in tries]}
    return {d: round(v, 3) for d, v in factors.items()}, times


def calibrate(device: str = "cpu", dtype_name: str = "bfloat16", repeats: int = 15,
              model: str | None = None, times: dict | None = None, tries: int = 5) -> dict[str, dict[str, float]]:
    """The factors per class and direction; with ``model`` and a ``times`` dict, also the
    summed times (µs) per class of the model's layers, autocast and fp32, into ``times``.
    ``tries`` tries of ``repeats`` paired repeats each (:func:`measure_try`), the classes'
    tries interleaved."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    cases = _model_cases(torch, device, model) if model else _generic_cases(torch, device)
    got: dict[str, list[list[list[Row]]]] = {cls: [] for cls in cases}
    for _ in range(tries):
        for cls, fns in cases.items():
            got[cls].append(measure_try(torch, fns, device, dtype, repeats))
    out = {}
    for cls, t in got.items():
        out[cls], tm = summarize(t, summed=bool(model))
        if tm is not None and times is not None:
            times[cls] = tm
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=15, help="paired repeats per try")
    ap.add_argument("--tries", type=int, default=5, help="tries; a factor is the median over them")
    ap.add_argument("--model", default=None, help="measure at this example model's layers (mlp, convnet, ...)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.repeats < 1 or args.tries < 1:
        ap.error("--repeats and --tries must be >= 1")
    times: dict = {}
    f = calibrate(args.device, args.dtype, args.repeats, args.model, times, args.tries)
    for cls, v in f.items():
        t = times.get(cls)
        print(f"{cls:<10} forward x{v['FW']:.3f}  backward x{v['BW']:.3f}" + (
            f"  (autocast {t['FW'] / 1e3:.2f} / {t['BW'] / 1e3:.2f} ms, fp32 {t['FW_fp32'] / 1e3:.2f} / "
            f"{t['BW_fp32'] / 1e3:.2f} ms; tries forward {' '.join(f'{x:.3f}' for x in t['tries']['FW'])}, backward "
            f"{' '.join(f'{x:.3f}' for x in t['tries']['BW'])})" if t else ""))
    if args.json:
        d = {"device": args.device, "dtype": args.dtype, "model": args.model, "repeats": args.repeats,
             "tries": args.tries, "factors": f}
        if times:  # for dpro whatif --apply mixed_precision:absolute=1 / auto=1
            d["times_us"] = times
        args.json.write_text(json.dumps(d, indent=1))


if __name__ == "__main__":
    main()
