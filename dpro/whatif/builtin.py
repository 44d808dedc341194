"""The built-in what-ifs, each written with the primitives of :mod:`dpro.whatif.graph`.

Each is a function ``(graph, **params) -> None`` that changes the graph in place; a user
module adds its own with :func:`dpro.whatif.register` (``dpro whatif --load-whatif MODULE``).
"""

from __future__ import annotations

from collections import defaultdict

from dpro.whatif.graph import Op, WhatIfGraph
from dpro.whatif.registry import whatif

#: communication ops whose time depends on the network (coarse collectives, ring steps, PS messages)
NET_SUB_OPS = {"ALLREDUCE", "RING_STEP", "PUSH_REQ", "PULL_REQ", "PUSH_RES", "PULL_RES", "SEND", "RECV",
               "BROADCAST", "ALLGATHER", "REDUCE_SCATTER", "ALLTOALL"}


def _is_net(op: Op) -> bool:
    return op.cat == "COMM" and op.dur > 0 and (op.attrs.get("sub_op") in NET_SUB_OPS or op.comm_device)


@whatif("compute_speed")
def compute_speed(g: WhatIfGraph, factor: float = 2.0) -> None:
    """A device ``factor`` times faster: every computation op's own time / factor."""
    g.select(lambda op: op.cat != "COMM" and not op.comm_device).scale(1.0 / factor)


@whatif("network")
def network(g: WhatIfGraph, bandwidth: float = 1.0, latency: float = 1.0) -> None:
    """A network ``bandwidth`` times faster and with ``latency`` times the per-message cost:
    ring steps become ``alpha*latency + (dur-alpha)/bandwidth`` with the fitted alpha; other
    communication ops (measured) are divided by ``bandwidth``."""
    lc = g.link_cost
    for op in g.select(_is_net):
        if op.attrs.get("sub_op") == "RING_STEP" and lc is not None:
            op.dur = lc.alpha * latency + max(0.0, op.dur - lc.alpha) / bandwidth
        else:
            op.dur /= bandwidth


@whatif("mixed_precision")
def mixed_precision(g: WhatIfGraph, factors: dict | None = None, absolute: float = 0, auto: float = 0) -> None:
    """torch.autocast: the matmul/conv/attention ops scaled by the factors of the
    ``mixed_precision`` pass (:mod:`dpro.passes.mixed_precision`, measured per op class).

    ``absolute=1``: the calibration was taken at the job's own layers
    (``benchmarks/amp_calibration.py --model``, its ``times_us``): each class's ops get, in
    all, the calibrated autocast time of the class (each op its share of the class's
    profiled time) instead of their profiled time times the factor. For low-precision
    kernels whose time does not depend on what slowed the profile down (an emulated bf16
    gemm is compute-bound, the fp32 one it replaces memory-bound), a factor would carry the
    profile's slow-down into the prediction.

    ``auto=1``: the same calibration, per class and direction: where autocast was slower
    than fp32 in it (an emulated low-precision kernel, compute-bound: ``absolute``), the
    calibrated autocast time in all; where it was faster (a native kernel of the same
    shape, which the profile's memory and cache state slow down alike), the profile's time
    times the calibrated ratio, autocast / fp32. The microbenchmark's layers alone run in
    another context than the job's (here fp32 1.3-1.6x slower than the same layers in the
    job's profile), which an absolute time would carry into the prediction."""
    from dpro.passes.mixed_precision import load_factors, load_times, op_class

    if absolute or auto:
        times = load_times()
        for cls, by_dir in times.items():
            for d in ("FW", "BW"):
                sel = g.select(lambda op, c=cls, d=d: op.cat == d and op_class(op.name) == c)
                total = sum(op.dur for op in sel)
                if total <= 0 or d not in by_dir:
                    continue
                low, fp32 = float(by_dir[d]), float(by_dir.get(f"{d}_fp32", 0.0))
                if auto and 0 < low <= fp32:  # native: the calibrated ratio on the profile's time
                    sel.scale(low / fp32)
                else:
                    sel.scale(low / total)
        return
    f = factors or load_factors()
    for cls, by_dir in f.items():
        for d, x in by_dir.items():
            g.select(lambda op, c=cls, d=d: op.cat == d and op_class(op.name) == c).scale(float(x))


@whatif("fused_optimizer")
def fused_optimizer(g: WhatIfGraph, speedup: float = 1.0) -> None:
    """A fused (or ``foreach``) optimizer: per worker device, the UPDATE ops become one op
    of their summed own time / ``speedup``, launched once (one host gap, the first's)."""
    groups: dict[str, list[Op]] = defaultdict(list)
    for op in g.select(lambda o: o.cat == "UPDATE" and not o.comm_device):
        groups[op.device].append(op)
    for dev, ops in groups.items():
        if len(ops) < 2:
            continue
        ids = {o.id for o in ops}
        ops.sort(key=lambda o: o.prio)
        before = {p for o in ops for p in g.pred[o.id]} - ids
        after = {s for o in ops for s in g.succ[o.id]} - ids
        fused = Op(name=f"{ops[0].node}/fused_optimizer", cat="UPDATE", device=dev, node=ops[0].node,
                   dur=sum(o.dur for o in ops) / speedup, gap=ops[0].gap, prio=ops[0].prio)
        for o in ops:
            g.remove(o)
        g.insert(before, fused, after)


@whatif("p3")
def p3(g: WhatIfGraph, slice_bytes: int = 4 << 20) -> None:
    """P3: every network op is cut into slices of at most ``slice_bytes`` (each slice pays
    the per-message cost again when the link cost is known), run one after the other, and
    each link sends first the slices of the layers the next forward needs first: priority
    by layer order, i.e. the tensors produced last by the backward pass first."""
    lc = g.link_cost
    alpha = lc.alpha if lc is not None else 0.0
    for op in list(g.select(lambda o: _is_net(o) and o.bytes > slice_bytes)):
        k = -(-op.bytes // slice_bytes)
        before, after = [p.id for p in g.preds(op)], [s.id for s in g.succs(op)]
        body = max(0.0, op.dur - alpha)
        g.remove(op)
        prev = before
        for j in range(k):
            piece = Op(name=f"{op.name}/slice{j}", cat=op.cat, device=op.device, node=op.node,
                       dur=alpha + body / k, gap=op.gap if j == 0 else 0.0, bytes=op.bytes // k,
                       prio=op.prio, comm_device=op.comm_device, attrs=dict(op.attrs))
            g.insert(prev, piece, after if j == k - 1 else ())
            prev = [piece.id]
    # layer order: the later a tensor was produced in the step, the earlier its layer
    g.schedule(lambda op: -op.prio if op.cat == "COMM" else op.prio)
