"""Mixed precision (autocast), written as a user pass: load it with
``dpro optimize --load-pass dpro.passes.mixed_precision`` (it changes the numerics, so it
is never searched unless asked for).

Model: under ``torch.autocast`` the matmul-like ops (linear/addmm/mm/bmm, convolution,
scaled-dot-product attention) and their backward ops run in the low precision: their own
time is multiplied by the class's factor (forward and backward apart), and the blocks
their forward keeps for the backward are half as large. Every other op (elementwise,
normalisation, the loss, the optimizer) is unchanged — autocast runs those in fp32 or
adds casts, so no speed-up is assumed — and so are the gradients and what the
synchronisation sends (parameters stay fp32; DDP and Horovod all-reduce fp32 gradients
unless a compression hook is set).

The factors are measured (``benchmarks/amp_calibration.py``). The defaults are this
project's measurement on its development machine (x86-64 with AVX-512 BF16, one thread,
``torch.autocast("cpu", dtype=torch.bfloat16)``, docs/memory.md); set
``DPRO_AMP_FACTORS=<the --json file>`` to use your hardware's.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dpro.errors import DproInputError
from dpro.jsonio import read_json
from dpro.optimizer.strategy import OpScale, Strategy
from dpro.passes import Candidate, GraphPass, PassContext, register

#: own-time factor under autocast per op class and direction (benchmarks/amp_calibration.py,
#: 2-core x86-64 VM with avx512_bf16, torch 2.13 CPU, bfloat16, 2026-11-22)
DEFAULT_FACTORS: dict[str, dict[str, float]] = {
    "matmul": {"FW": 0.508, "BW": 0.467},
    "conv": {"FW": 0.433, "BW": 0.598},
    "attention": {"FW": 1.809, "BW": 4.266},
}
#: size of a kept activation in the low precision relative to fp32
BYTES_FACTOR = 0.5

#: ops autocast runs in fp32 (their outputs stay fp32)
FP32_OPS = re.compile(r"norm|softmax|log_softmax|cross_entropy|nll_loss|mse_loss|l1_loss|exp|log\b|pow|sum|mean|"
                      r"cumsum|prod|dist|renorm|cosine|kl_div|binary_cross|smooth_l1|huber|margin", re.I)

_CLASSES = {
    "attention": re.compile(r"scaled_dot_product|_flash_attention|_efficient_attention|ScaledDotProduct|FlashAttention"),
    "conv": re.compile(r"conv|Convolution", re.I),
    "matmul": re.compile(r"aten::(linear|addmm|mm|bmm|matmul|baddbmm)\b|AddmmBackward|MmBackward|BmmBackward|"
                         r"LinearBackward|BaddbmmBackward"),
}


def op_class(name: str) -> str | None:
    """The autocast class of an op name (None: not sped up)."""
    for cls, rx in _CLASSES.items():
        if rx.search(name):
            return cls
    return None


def _per_class(path: str | Path, key: str, zero_ok: bool) -> dict[str, dict[str, float]] | None:
    """The table ``key`` of a calibration file, ``{class: {"FW": x, "BW": y}}`` with numbers
    > 0 (``zero_ok``: >= 0), or None where the file holds no such table."""
    d = read_json(Path(path))
    t = d.get(key) if isinstance(d, dict) else None
    ok = isinstance(t, dict) and all(
        isinstance(v, dict) and all(isinstance(v.get(k), (int, float)) and (v[k] >= 0 if zero_ok else v[k] > 0)
                                    for k in ("FW", "BW"))
        for v in t.values())
    return t if ok else None


def load_factors(path: str | Path | None = None) -> dict[str, dict[str, float]]:
    """Factors from a calibration file (``benchmarks/amp_calibration.py --json``) or the defaults."""
    path = path or os.environ.get("DPRO_AMP_FACTORS")
    if not path:
        return DEFAULT_FACTORS
    f = _per_class(path, "factors", zero_ok=False)
    if f is None:
        raise DproInputError(path, "not an AMP calibration: expected {'factors': {class: {'FW': x, 'BW': y}}}")
    return {**DEFAULT_FACTORS, **f}


def load_times() -> dict[str, dict[str, float]]:
    """The ``times_us`` of the calibration file ``DPRO_AMP_FACTORS`` (µs per step, class and
    direction: ``benchmarks/amp_calibration.py --model``)."""
    path = os.environ.get("DPRO_AMP_FACTORS")
    if not path:
        raise DproInputError(None, "mixed_precision:absolute=1 needs DPRO_AMP_FACTORS, a calibration taken with "
                                   "benchmarks/amp_calibration.py --model (its times_us)")
    t = _per_class(path, "times_us", zero_ok=True)
    if t is None:
        raise DproInputError(path, "no times_us (µs per class and direction): calibrate with "
                                   "benchmarks/amp_calibration.py --model NAME --json")
    return t


@register
class MixedPrecision(GraphPass):
    """Run matmul-like ops in low precision (torch.autocast); factors measured per op class."""

    name = "mixed_precision"

    def __init__(self, factors: dict[str, dict[str, float]] | None = None) -> None:
        self.factors = factors or load_factors()

    def scales(self, ctx: PassContext) -> tuple[OpScale, ...]:
        """Per op, its own-time factor and, from the first low-precision op on, its kept bytes halved."""
        m = ctx.model
        fw = sorted((o for o in m.ops.values() if o.cat == "FW"), key=lambda o: o.prio)
        first = next((o.prio for o in fw if op_class(o.name)), None)
        out = []
        for op in m.ops.values():
            cls = op_class(op.name) if op.cat in ("FW", "BW") else None
            t = float(self.factors[cls][op.cat]) if cls in self.factors else 1.0
            # dtype flow: from the first low-precision op on, forward outputs are low precision
            # unless autocast runs the op in fp32 (normalisation, softmax, losses)
            low = (first is not None and not FP32_OPS.search(op.name)
                   and (op.cat == "BW" or (op.cat == "FW" and op.prio >= first)))
            if t != 1.0 or low:
                out.append(OpScale(op.id, t, BYTES_FACTOR if low else 1.0))
        return tuple(out)

    def candidates(self, ctx: PassContext) -> list[Candidate]:
        if ctx.strategy.scales:
            return []
        sc = [s for s in self.scales(ctx) if s.time != 1.0]
        gain = sum(ctx.model.ops[s.op].dur * (1.0 - s.time) for s in sc)
        if not sc:
            return []
        by_class = ", ".join(f"{c} {v['FW']:.2f}/{v['BW']:.2f}" for c, v in self.factors.items())
        return [Candidate(self.name, ("autocast",),
                          f"autocast: {len(sc)} matmul/conv/attention ops, own time x {by_class} (forward/backward)", gain)]

    def apply(self, ctx: PassContext, cand: Candidate) -> Strategy:
        return ctx.strategy.with_scales(self.scales(ctx))
