"""How each layer's forward and backward time scales with the per-device batch, on the
reference CNN of examples/parallel/ (issue #29: is a layer's op time proportional to the
batch, as the oracle's one-profile rule takes it, or affine, a + b·batch?).

One process, one compute thread, no collectives, no recorder: each layer alone, on its own
input at each ``--batches`` (rounds interleave the batches so that the VM's drift hits all
alike), forward timed around ``layer(x)``, backward around ``torch.autograd.grad`` of its
output (input and weight gradients, as in training); the median over ``--calls`` calls per
round, then the median over ``--rounds``. Per layer it fits t = a + b·batch by least squares
and prints a, b, the fit's largest relative residual, the fixed share a / t at each batch and
the ratio t(small) / t(large) against the proportional rule's small / large. The whole
model's forward + backward (one step without the optimizer) is timed the same way.

    benchmarks/measure.sh .venv/bin/python benchmarks/oracle/batch_scaling.py [--batches 4,8,16,32] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "parallel"))
from strategies import build_serial, make_batch  # noqa: E402


def _timed(f, calls: int) -> float:
    """Median µs of ``calls`` calls of ``f`` (after one warm-up call)."""
    f()
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        f()
        out.append((time.perf_counter() - t) * 1e6)
    return statistics.median(out)


def layer_times(model: torch.nn.Sequential, batch: int, calls: int) -> dict[str, tuple[float, float]]:
    """(forward µs, backward µs) of each layer at ``batch`` samples, and of the whole model ("(model)")."""
    x, y = make_batch(0, 0, batch)
    out: dict[str, tuple[float, float]] = {}
    cur = x
    for i, (name, m) in enumerate(model.named_children()):
        inp = cur.detach().requires_grad_(i > 0)  # the first layer's input needs no gradient
        params = [q for q in m.parameters()]
        wrt = ([inp] if i > 0 else []) + params
        fw = _timed(lambda: m(inp), calls)
        o = m(inp)
        g = torch.randn_like(o)

        def back() -> None:
            o2 = m(inp)
            t = time.perf_counter()
            torch.autograd.grad(o2, wrt, g)
            back.us.append((time.perf_counter() - t) * 1e6)

        back.us = []
        for _ in range(calls + 1):
            back()
        out[name] = (fw, statistics.median(back.us[1:])) if wrt else (fw, 0.0)
        cur = o.detach()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()

    out["(model)"] = (_timed(step, calls), 0.0)
    return out


def fit(batches: list[int], ts: list[float]) -> tuple[float, float, float]:
    """(a, b, largest |residual| / t) of the least-squares t = a + b·batch."""
    b, a = np.polyfit(np.array(batches, float), np.array(ts, float), 1)
    res = max(abs(a + b * n - t) / t for n, t in zip(batches, ts)) if min(ts) > 0 else 0.0
    return float(a), float(b), float(res)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="4,8,16,32", help="per-device batches (comma-separated)")
    p.add_argument("--calls", type=int, default=30, help="timed calls per layer, batch and round")
    p.add_argument("--rounds", type=int, default=5, help="rounds over the batches (interleaved)")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args()
    torch.set_num_threads(1)
    batches = [int(b) for b in args.batches.split(",")]
    model = build_serial(0, args.width)
    got: dict[int, list[dict[str, tuple[float, float]]]] = {b: [] for b in batches}
    for r in range(args.rounds):
        for b in (batches if r % 2 == 0 else batches[::-1]):
            got[b].append(layer_times(model, b, args.calls))
    names = list(got[batches[0]][0])
    med = {b: {n: tuple(statistics.median(rd[n][k] for rd in got[b]) for k in (0, 1)) for n in names} for b in batches}
    lo, hi = batches[0], batches[-1]
    if len(batches) > 2:
        lo, hi = batches[1], batches[2]  # the validation's per-device batches (8 at 4 processes, 16 at 2)
    rows = []
    print(f"# one process, one thread, {args.rounds} rounds x {args.calls} calls, medians; µs; "
          f"fixed share = a / t; ratio = t({lo}) / t({hi}) (proportional: {lo / hi:.2f})")
    print(f"{'layer':<9} {'pass':<3} " + " ".join(f"{'t@' + str(b):>8}" for b in batches)
          + f" {'a':>8} {'b/sample':>8} {'resid%':>6} " + " ".join(f"{'fix@' + str(b):>7}" for b in batches)
          + f" {'ratio':>6}")
    for n in names:
        for k, pas in ((0, "fw"), (1, "bw")):
            ts = [med[b][n][k] for b in batches]
            if not all(ts):
                continue
            a, sl, res = fit(batches, ts)
            pas = "all" if n == "(model)" else pas
            rows.append({"layer": n, "pass": pas, "us": dict(zip(batches, ts)), "a_us": a, "b_us_per_sample": sl,
                         "max_residual": res})
            ratio = med[lo][n][k] / med[hi][n][k]
            print(f"{n:<9} {pas:<3} " + " ".join(f"{t:8.1f}" for t in ts) + f" {a:8.1f} {sl:8.2f} {100 * res:6.1f} "
                  + " ".join(f"{a / t:7.2f}" for t in ts) + f" {ratio:6.2f}")
    lay = [r for r in rows if r["layer"] != "(model)"]
    tot = {b: sum(r["us"][b] for r in lay) for b in batches}
    a, sl, res = fit(batches, [tot[b] for b in batches])
    print(f"{'sum':<13} " + " ".join(f"{tot[b]:8.1f}" for b in batches) + f" {a:8.1f} {sl:8.2f} {100 * res:6.1f} "
          + " ".join(f"{a / tot[b]:7.2f}" for b in batches) + f" {tot[lo] / tot[hi]:6.2f}")
    if args.json:
        args.json.write_text(json.dumps({"batches": batches, "rounds": args.rounds, "calls": args.calls, "rows": rows,
                                         "sum": {"us": tot, "a_us": a, "b_us_per_sample": sl, "max_residual": res}},
                                        indent=1))


if __name__ == "__main__":
    main()
