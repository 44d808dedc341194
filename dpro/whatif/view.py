"""The what-if graph of a prepared job: its global DFG with each op's trace attributes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpro.whatif.graph import WhatIfGraph

if TYPE_CHECKING:
    from dpro.job import Job


def of(job: Job, *, expand_collectives: bool = True) -> WhatIfGraph:
    """A fresh :class:`WhatIfGraph` of ``job``'s replayed global DFG (the replay is computed
    once per setting and kept on the job; the graph returned is a copy to change).

    Each op keeps the trace's ``bytes`` and, in ``attrs``, ``sub_op`` and ``txn``; ring steps
    of expanded collectives get ``bytes`` per step and ``attrs["txn"]``."""
    r = job.replay(expand_collectives=expand_collectives)
    ops = {f"{name}/{op.id}": op for name, nt in job.trace.nodes.items() for op in nt.ops.values()}
    lc = r.build.link_cost

    def base(name: str):
        op = ops.get(name)
        if op is None and name.endswith((":IN", ":OUT")):
            op = ops.get(name.rsplit(":", 1)[0])
        return op

    def bytes_of(name: str) -> int:
        op = base(name)
        return int(op.bytes or 0) if op is not None else 0

    def attrs_of(name: str) -> dict:
        op = base(name)
        if op is not None:
            return {"sub_op": op.sub_op, "txn": op.txn, "tensor": op.tensor}
        if "/ring" in name:
            return {"sub_op": "RING_STEP", "txn": name.split("/ring", 1)[0]}
        return {}

    w = WhatIfGraph.from_compiled(r.graph, bytes_of=bytes_of, attrs_of=attrs_of)
    if lc is not None and lc.beta > 0:
        for op in w.select(lambda o: o.attrs.get("sub_op") == "RING_STEP"):
            op.bytes = int(round(max(0.0, op.dur - lc.alpha) / lc.beta))
    return w
