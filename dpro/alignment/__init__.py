"""Clock alignment across machines (dPRO, MLSys'22, §4.2; docs/alignment.md).

    res = align(gt)                           # θ per node, µs
    aligned = apply_offsets(gt, res.offsets_us)
    aligned, res = on_one_clock(gt)          # both, leaving a one-host trace as it is
"""

from dpro.alignment.align import align
from dpro.alignment.options import AlignOptions
from dpro.alignment.result import AlignResult
from dpro.alignment.shift import apply_offsets, on_one_clock, shift_nodes

__all__ = ["AlignOptions", "AlignResult", "align", "apply_offsets", "on_one_clock", "shift_nodes"]
