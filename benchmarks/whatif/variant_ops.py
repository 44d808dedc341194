"""Where a graph what-if's error comes from: per op class, the plain job's profile, what the
what-if predicts, and the variant job's OWN profile (torch.profiler on the variant run).

    .venv/bin/python benchmarks/whatif/variant_ops.py [--variants amp-bf16,sgd-fused] [--out DIR]

For each variant, ``examples/whatif/train_variant.py`` profiles the plain job and the
variant (``--active`` steps each, one thread), ``dpro whatif --apply`` is applied to the
plain graph (``DPRO_AMP_FACTORS`` as given, or none: the pass's defaults), and the top-level
ops of both graphs are summed per class and step: matmul forward / backward (the mixed
precision pass's classes), casts (``aten::to``, ``ToCopyBackward0``, new under autocast), the
optimizer (UPDATE), every other op, and the host gaps. The variant's side is its own
measured profile, not a prediction: a class whose prediction is far from it names the
mechanism the what-if misses.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from variants import SCRIPT, VARIANTS  # noqa: E402

CAST = re.compile(r"aten::to\b|aten::_to_copy|ToCopyBackward|aten::copy_")


def op_class(name: str, cat: str) -> str:
    from dpro.passes.mixed_precision import op_class as mp_class

    if cat == "UPDATE":
        return "optimizer"
    if CAST.search(name):
        return "cast"
    c = mp_class(name) if cat in ("FW", "BW") else None
    return f"{c} {cat}" if c else f"other {cat}"


def by_class(graph) -> Counter:
    """Own time per class (µs per step) and the host gaps, of a WhatIfGraph."""
    out: Counter = Counter()
    for op in graph.select(lambda o: True):
        out[op_class(op.name.split("/", 1)[-1], op.cat)] += op.dur
        out["host gaps"] += op.gap
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--active", type=int, default=5)
    ap.add_argument("--amp-factors", type=Path, default=None, help="DPRO_AMP_FACTORS for the prediction")
    ap.add_argument("--optimizer-speedups", type=Path, default=None,
                    help="optimizer_calibration.py --json file for the optimizer variants (default: speed-up 1)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/dpro-whatif-variant-ops"))
    o = ap.parse_args()
    import dpro
    import dpro.whatif
    from dpro.whatif.registry import available, parse_apply

    if o.amp_factors:
        os.environ["DPRO_AMP_FACTORS"] = str(o.amp_factors)
    speedup = json.loads(o.optimizer_speedups.read_text())["speedup"] if o.optimizer_speedups else {}
    o.out.mkdir(parents=True, exist_ok=True)
    base = ["--model", o.model, "--steps", str(o.steps), "--warmup", str(o.warmup), "--active", str(o.active)]

    def profile(tag: str, opts: list[str]) -> Path:
        d = o.out / tag
        subprocess.run([sys.executable, str(SCRIPT), *base, *opts, "--profile-dir", str(d)], check=True,
                       timeout=1800, capture_output=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        return d

    plain_dir = profile("plain", [])
    plain = dpro.whatif.of(dpro.open(plain_dir))
    rows = {}
    for name in o.variants.split(","):
        opts, spec = VARIANTS[name]
        spec = spec.format(speedup=speedup.get(name, 1.0))
        fn, params = parse_apply(spec, available())
        pred = plain.copy()
        fn(pred, **params)
        meas = dpro.whatif.of(dpro.open(profile(name, opts)))
        p, v, b = by_class(pred), by_class(meas), by_class(plain)
        rows[name] = {"whatif": spec, "plain_us": dict(b), "predicted_us": dict(p), "variant_us": dict(v),
                      "plain_step_us": plain.simulate().iteration_us, "predicted_step_us": pred.simulate().iteration_us,
                      "variant_step_us": meas.simulate().iteration_us}
        print(f"\n{name} ({spec}): per step, ms (variant = its own profile)")
        print(f"{'class':16} {'plain':>9} {'predicted':>10} {'variant':>9} {'pred/var':>9}")
        for c in sorted(set(p) | set(v), key=lambda c: -max(p.get(c, 0), v.get(c, 0))):
            r = p.get(c, 0) / v[c] if v.get(c) else float("nan")
            print(f"{c:16} {b.get(c, 0) / 1e3:9.2f} {p.get(c, 0) / 1e3:10.2f} {v.get(c, 0) / 1e3:9.2f} {r:9.2f}")
        r = rows[name]
        print(f"{'step (replayed)':16} {r['plain_step_us'] / 1e3:9.2f} {r['predicted_step_us'] / 1e3:10.2f} "
              f"{r['variant_step_us'] / 1e3:9.2f} {r['predicted_step_us'] / r['variant_step_us']:9.2f}")
    (o.out / "variant_ops.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    from boost import boosted

    with boosted() as on:
        print(f"# measured jobs boosted: {'yes' if on else 'no'}", file=sys.stderr, flush=True)
        main()
