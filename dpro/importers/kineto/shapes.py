"""The input shapes of each annotated layer's first operator (``record_shapes=True``).

dpro's recorder wraps each module's forward in ``dpro.layer::<path>``; with shapes
recorded, the first CPU operator inside a layer (``aten::conv2d``, ``aten::linear``,
``aten::relu``...) carries the ``Input Dims``, ``Input type`` and ``Concrete Inputs``
(stride, padding) of the layer's call. The analytical oracle (docs/oracle.md) reads
them from ``NodeTrace.meta[LAYER_SHAPES]``: ``{layer: {"op", "dims", "types", "concrete"}}``.
"""

from __future__ import annotations

from dpro.contracts.recording import LAYER_PREFIX
from dpro.importers.kineto.read import KEvent, RankFile

#: key of the per-layer shapes in ``NodeTrace.meta``
LAYER_SHAPES = "layer_shapes"


def layer_shapes(rf: RankFile) -> dict[str, dict]:
    """``{layer: {"op", "dims", "types", "concrete"}}`` of the first operator with recorded
    shapes in each layer's first call (empty without layer annotations or shapes)."""
    if not any(e.cat == "user_annotation" and e.name.startswith(LAYER_PREFIX) for e in rf.events):
        return {}  # no layer annotation: no layer (the walk below would find none)
    by_tid: dict[object, list[KEvent]] = {}
    for e in rf.events:
        if e.cat in ("cpu_op", "user_annotation"):
            by_tid.setdefault(e.tid, []).append(e)
    out: dict[str, dict] = {}
    for evs in by_tid.values():
        evs.sort(key=lambda e: (e.ts, -e.dur))
        stack: list[tuple[float, str]] = []  # (end, layer) of the open layer annotations
        for e in evs:
            ts, end = e.ts, e.ts + e.dur
            while stack and stack[-1][0] <= ts:
                stack.pop()
            name = e.name
            if e.cat == "user_annotation":
                if name.startswith(LAYER_PREFIX):
                    stack.append((end, name[len(LAYER_PREFIX):]))
                continue
            if not stack or stack[-1][1] in out:
                continue
            a = e.args or {}
            dims = a.get("Input Dims")
            if isinstance(dims, list) and dims and isinstance(dims[0], list) and dims[0]:
                out[stack[-1][1]] = {"op": name, "dims": dims, "types": a.get("Input type") or [],
                                     "concrete": a.get("Concrete Inputs") or []}
    return out
