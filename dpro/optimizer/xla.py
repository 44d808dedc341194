"""Op fusion on TensorFlow: XLA of the whole gradient computation.

TensorFlow has no per-region helper here (dpro's op-fusion pass fuses chains and hands
them to ``torch.compile``): what a TF job can apply is compiling the function that computes
the gradients with ``tf.function(jit_compile=True)`` (``compile.json``:
``"xla_jit_compile": true``; examples/tensorflow/hvd_recorder.py applies it). That is one
fused op: every forward and backward op, and every op the recorded graph orders between
two of them (the loss; reads of variables that the optimizer's ops are chained to). Its
time (:func:`fused_us`) is the forward + backward under XLA as the recorder timed it
(``dpro profile --measure-compile``: :mod:`dpro.profiler.tensorflow.compile_probe`), plus the job's
time in the region's other ops. The gradients all become ready when it ends, so the
synchronisation no longer overlaps the backward pass, and Horovod fuses them in the
wake-ups after it.
"""

from __future__ import annotations

from collections import defaultdict

from dpro.optimizer import libraries as lib
from dpro.optimizer.job_model import JobModel
from dpro.optimizer.strategy import FusedOp, Strategy

REGION_CATS = ("FW", "BW")


def xla_ratio(model: JobModel) -> float | None:
    """XLA / graph time of the model's forward + backward as measured, or None."""
    if model.framework != "tensorflow" or not model.compile or "" not in model.compile:
        return None
    m = model.compile[""]
    return m["compiled_us"] / m["eager_us"]


def region(model: JobModel) -> tuple[str, ...]:
    """The ops XLA compiles: forward and backward ops and every op on a path between two
    of them, in a topological order; () when a synchronisation would wait inside it."""
    succ: dict[str, list[str]] = defaultdict(list)
    pred: dict[str, list[str]] = defaultdict(list)
    for a, b in model.edges:
        succ[a].append(b)
        pred[b].append(a)
    core = {o for o, op in model.ops.items() if op.cat in REGION_CATS}

    def reach(nexts: dict[str, list[str]]) -> set[str]:
        seen, todo = set(core), list(core)
        while todo:
            for y in nexts[todo.pop()]:
                if y not in seen:
                    seen.add(y)
                    todo.append(y)
        return seen

    ops = reach(succ) & reach(pred)
    if not core or any(c in ops for u in model.units for c in u.consumers):
        return ()
    return tuple(o for o in model.topo_order() if o in ops)


def fused_us(model: JobModel, ops: tuple[str, ...]) -> float:
    """The compiled cluster's time: the recorder's forward + backward under XLA (the median
    over ranks), plus the job's own time in the region's ops that are not forward or
    backward ops (what the probe did not time).

    Not the job's time in the region × the probe's XLA / graph ratio: inside the job the
    graph's ops ran 8-28 % longer than in the probe (per-op dispatch in a larger graph,
    and on 2 cores Horovod's thread reducing gradients during the backward pass), and the
    compiled cluster, with nothing running beside it, does not pay that. On the loopback
    TF transformer the ratio put the cluster at 11.8 ms; the XLA job's own profile showed
    8.1 ms (the probe: 8.6)."""
    m = model.compile[""]  # type: ignore[index]
    other = sum(model.ops[o].dur + model.ops[o].gap for o in ops if model.ops[o].cat not in REGION_CATS)
    return float(m["compiled_us"]) + other


def xla_strategy(model: JobModel) -> Strategy | None:
    """The job with its gradient computation compiled by XLA and Horovod's default fusion
    (every gradient ready at once: Horovod fuses them up to its threshold, a buffer's ring
    cost apart), or None when not measured or not a TF job."""
    ops = region(model) if xla_ratio(model) is not None else ()
    if not ops:
        return None
    groups = lib.horovod_cycle_groups([0.0] * len(model.units), [u.bytes for u in model.units], busy_us=model.ring_us)
    return Strategy.from_groups(groups).with_fusion(ops, fused_us(model, ops))


def xla_fusion(model: JobModel, st: Strategy) -> FusedOp | None:
    """The XLA fusion of ``st`` (a TF job's strategy), if it has one: the fused op that holds every
    forward and backward op (on TF the only op fusion searched is :func:`xla_strategy`'s; this
    test needs no walk of the graph, unlike :func:`region`)."""
    if model.framework != "tensorflow" or not st.fusions:
        return None
    core = {o for o, op in model.ops.items() if op.cat in REGION_CATS}
    return next((f for f in st.fusions if core and core <= set(f.ops)), None)
