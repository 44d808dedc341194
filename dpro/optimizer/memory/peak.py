"""Peak memory of a strategy: the worker's memory record rewritten for per-op byte scales,
recomputation and gradient accumulation, placed on the strategy's replayed schedule.

The record (``meta["memory"]``, docs/memory.md) gives per op its ``alloc``/``free``/``peak``
and the blocks that outlive their op as ``lifetimes`` ``[producer, releaser, bytes]``.

* **Op scales** (:class:`~dpro.optimizer.strategy.OpScale`, e.g. mixed precision): a block
  an op keeps for a later op of the step, and its temporaries, are ``bytes`` times as large.
* **Recomputing block B** (:mod:`dpro.optimizer.blocks`): a block produced by one of B's
  forward ops and released by one of B's backward ops is no longer kept: its producer
  frees it at once (its ``peak`` is unchanged: it still allocates it), and B's
  recompute node allocates it again before B's backward, which releases it as before.
  The recompute node's ``peak`` adds the largest temporary of B's forward ops.
* **k micro-batches**: the forward/backward ops (:func:`~dpro.optimizer.worker_graph.micro_ops`) run k times on 1/k of the batch. A block
  both produced and released by such ops (activations, activation gradients) is 1/k as
  large and exists in every micro-batch; so are the ops' temporaries (``peak - alloc``).
  A block they produce that outlives the backward (a parameter's gradient) is allocated
  by the first micro-batch only; later micro-batches compute it as a temporary and add
  it in place. Frees of blocks from outside the micro-batch (the previous step's
  gradients, freed after ``zero_grad``) happen once, in the first micro-batch.
"""

from __future__ import annotations

from collections import defaultdict

from dpro.optimizer.blocks import block
from dpro.optimizer.job_model import JobModel
from dpro.optimizer.strategy import Strategy
from dpro.optimizer.worker_graph import MB_SEP, RECOMPUTE_PREFIX, BuiltGraph, micro_ops
from dpro.replayer.engine import Schedule
from dpro.replayer.memory import MemoryEstimate, estimate_record


def _ops_table(mem: dict) -> dict[str, dict[str, int]]:
    return {str(o): {k: int(v) for k, v in m.items() if k in ("peak", "alloc", "free")}
            for o, m in (mem.get("ops") or {}).items()}


def _recompute_record(model: JobModel, mem: dict, name: str) -> dict:
    b = block(model, name)
    fw, bw = set(b.fw), set(b.bw)
    ops = _ops_table(mem)
    temp = max((max(0, ops[o]["peak"] - ops[o]["alloc"]) for o in fw if o in ops), default=0)
    r = RECOMPUTE_PREFIX + name
    moved = 0
    lifetimes = []
    for p, rel, nbytes in mem.get("lifetimes") or []:
        if p in fw and rel in bw:
            ops.setdefault(p, {"peak": 0, "alloc": 0, "free": 0})["alloc"] -= int(nbytes)
            moved += int(nbytes)
            lifetimes.append([r, rel, nbytes])
        else:
            lifetimes.append([p, rel, nbytes])
    ops[r] = {"peak": moved + temp, "alloc": moved, "free": 0}
    return {**mem, "ops": ops, "lifetimes": lifetimes}


def _micro_batch_record(model: JobModel, mem: dict, k: int) -> dict:
    ops = _ops_table(mem)
    in_mb = micro_ops(model)

    def micro(o: str | None) -> bool:
        return o is not None and (o.startswith(RECOMPUTE_PREFIX) or o in in_mb)

    def copy_name(o: str, j: int) -> str:
        return o if j == k or not micro(o) else f"{o}{MB_SEP}{j}"

    def within(p: str, rel: str) -> bool:
        # released later in the same micro-batch (a gradient freed after the next step's
        # zero_grad is released by a forward op that runs *before* its producer)
        return p.startswith(RECOMPUTE_PREFIX) or (rel in model.ops and model.ops[rel].prio >= model.ops[p].prio)

    inner_alloc: dict[str, int] = defaultdict(int)
    inner_free: dict[str, int] = defaultdict(int)
    grads: dict[str, int] = defaultdict(int)
    lifetimes = []
    for p, rel, nbytes in mem.get("lifetimes") or []:
        nbytes = int(nbytes)
        if micro(p) and micro(rel) and within(p, rel):
            inner_alloc[p] += nbytes
            inner_free[rel] += nbytes
            lifetimes += [[copy_name(p, j), copy_name(rel, j), nbytes // k] for j in range(1, k + 1)]
        elif micro(p):
            grads[p] += nbytes
            lifetimes.append([copy_name(p, 1), copy_name(rel, 1) if rel is not None else None, nbytes])
        else:
            lifetimes.append([p, rel, nbytes])
    out: dict[str, dict[str, int]] = {}
    for o, m in ops.items():
        if not micro(o):
            out[o] = m
            continue
        temp = max(0, m["peak"] - m["alloc"])
        outer_free = m["free"] - inner_free[o]
        for j in range(1, k + 1):
            alloc = inner_alloc[o] // k + (grads[o] if j == 1 else 0)
            free = inner_free[o] // k + (outer_free if j == 1 else 0)
            peak = alloc + temp // k + (grads[o] if j > 1 else 0)
            out[copy_name(o, j)] = {"peak": peak, "alloc": alloc, "free": free}
    return {**mem, "ops": out, "lifetimes": lifetimes}


def _byte_scaled_record(model: JobModel, mem: dict, factor: dict[str, float]) -> dict:
    ops = _ops_table(mem)
    for o, f in factor.items():  # temporaries
        if o in ops:
            temp = max(0, ops[o]["peak"] - ops[o]["alloc"])
            ops[o]["peak"] -= temp - int(temp * f)
    lifetimes = []
    for p, rel, nbytes in mem.get("lifetimes") or []:
        f = factor.get(p, 1.0)
        later = rel in model.ops and p in model.ops and model.ops[rel].prio >= model.ops[p].prio
        if f != 1.0 and later and p in ops:
            cut = int(nbytes) - int(int(nbytes) * f)
            ops[p]["alloc"] -= cut
            ops[p]["peak"] -= cut
            if rel in ops:
                ops[rel]["free"] -= cut
            nbytes = int(nbytes) - cut
        lifetimes.append([p, rel, nbytes])
    return {**mem, "ops": ops, "lifetimes": lifetimes}


def memory_record(model: JobModel, strategy: Strategy) -> dict | None:
    """The representative worker's memory record under ``strategy`` (None: none recorded)."""
    mem = model.memory
    if mem is None or not isinstance(mem.get("ops"), dict):
        return mem
    factor = {sc.op: sc.bytes for sc in strategy.scales if sc.bytes != 1.0}
    if factor:
        mem = _byte_scaled_record(model, mem, factor)
    for name in strategy.recompute:
        mem = _recompute_record(model, mem, name)
    if strategy.accum > 1:
        mem = _micro_batch_record(model, mem, strategy.accum)
    return mem


def op_times(built: BuiltGraph, schedule: Schedule) -> dict[str, tuple[float, float]]:
    """op (or copy, or recompute node) -> (start, end) µs from the first replayed node."""
    t0 = float(schedule.start.min()) if len(schedule.start) else 0.0
    return {o: (float(schedule.start[i]) - t0, float(schedule.end[i]) - t0)
            for i, ops in enumerate(built.ops) for o in ops}


def strategy_memory(model: JobModel, strategy: Strategy, built: BuiltGraph, schedule: Schedule) -> MemoryEstimate:
    """Predicted memory of the representative worker running ``strategy`` (its replayed schedule)."""
    cats = {o: c.cat for o, c in model.ops.items()}
    static = {"params": sum(u.bytes for u in model.units), "grads": sum(u.bytes for u in model.units)}
    return estimate_record("worker", memory_record(model, strategy), op_times(built, schedule), cats,
                           fallback_static=static)
