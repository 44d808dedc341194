"""Model blocks: the modules a recomputation pass can checkpoint, and their ops.

The profilers label each computation op with the innermost model module that ran it
(``Op.layer``, e.g. ``encoder.layers.0.linear1``; backward ops get their forward op's
module). A **block** is a module (not the whole model) with at least two forward ops under it
and a backward. Its forward ops are the forward ops from its
first to its last labelled one (in the step's order on that queue: unlabelled ops in
between, such as functional calls inside the module, belong to it); its backward ops
likewise. Checkpointing a block (``torch.utils.checkpoint`` on its forward) drops the
activations its forward keeps for its backward and recomputes them just before its
backward runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpro.optimizer.job_model import JobModel


@dataclass(frozen=True, slots=True)
class Block:
    """A module's forward and backward ops (see the module docstring)."""

    name: str
    #: nesting depth of the module (``a.b.c`` -> 3)
    depth: int
    fw: tuple[str, ...]
    bw: tuple[str, ...]


def _under(layer: str | None, name: str) -> bool:
    return layer is not None and (layer == name or layer.startswith(name + "."))


def _span(model: JobModel, cat: str, name: str) -> tuple[str, ...]:
    """Ops of ``cat`` from the first to the last one labelled under ``name``, on that queue."""
    labelled = [o for o in model.ops.values() if o.cat == cat and _under(o.layer, name)]
    if not labelled:
        return ()
    dev = labelled[0].device
    lo = min(o.prio for o in labelled if o.device == dev)
    hi = max(o.prio for o in labelled if o.device == dev)
    span = [o for o in model.ops.values() if o.cat == cat and o.device == dev and lo <= o.prio <= hi]
    return tuple(o.id for o in sorted(span, key=lambda o: o.prio))


def block(model: JobModel, name: str) -> Block:
    """The block of module ``name`` (empty op lists if nothing ran under it)."""
    return Block(name, name.count(".") + 1, _span(model, "FW", name), _span(model, "BW", name))


def blocks(model: JobModel) -> list[Block]:
    """Every block of the model (see the module docstring), in forward order."""
    names: set[str] = set()
    for o in model.ops.values():
        if o.cat == "FW" and o.layer:
            parts = o.layer.split(".")
            names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    out = []
    for n in names:
        b = block(model, n)
        if len(b.fw) >= 2 and b.bw:
            out.append(b)
    first = {b.name: model.ops[b.fw[0]].prio for b in out}
    return sorted(out, key=lambda b: (first[b.name], b.depth, b.name))
