"""What the MXNet recorder keeps for memory estimation (dpro/replayer/memory.py).

The instrument is MXNet's own storage counter: with ``mx.profiler.set_config(profile_memory=True)``
every ``Storage::Alloc`` / ``Storage::Free`` on the CPU (NDArray chunks: activations,
gradients, workspaces, the batch) moves a counter ``Memory: cpu/0`` (domain ``Device
Storage``) by the handle's size and the profiler writes its new value as a Chrome counter
event (``"ph": "C"``) at that instant. The counter counts only while the profiler runs, and a
free of a block allocated before it started is subtracted (clamped at 0), so the counter is
the live bytes *minus the lowest live level seen since the profiler started*: exact deltas,
unknown offset.

Two halves, as for PyTorch (:mod:`dpro.profiler.torch_memory`):

* in the rank process, :class:`TrainerWatch` (started and stopped with the profiling
  window by ``mxnet_backend.py``) notes the ``gluon.Trainer`` objects that step during
  the window; :func:`static_facts` then reads the arrays that live across iterations —
  parameters, gradients, parameters without gradient (BatchNorm's running statistics:
  ``buffers``), and the optimizer state held on the worker (none with the update on the
  kvstore, the parameter-server default: the servers keep it) — into
  ``rank<r>.meta.json["memory"]``;
* at collect time, :func:`attach_counter` turns the counter events of the rank's trace
  into each DFG op's ``peak`` / ``alloc`` / ``free`` (same schema as PyTorch's) and the
  ``carry_in`` (the counter's level at the step's start above the lowest level of the
  analysed steps, i.e. assuming that at the iteration's emptiest instant only the static
  arrays are live).

An allocation or free belongs to the op on the compute thread running at its time (MXNet
allocates an op's outputs and workspace on the engine thread when it executes; a freed
array's ``DeleteVariable`` engine op, not a DFG op, runs between ops), or else to the next
op to start on that thread (its host gap), or to the step's end marker. The counter has no
addresses: within one op a free equal in size to an earlier allocation of the same op is
taken as that op's temporary; ``lifetimes`` are not recorded.
"""

from __future__ import annotations

import bisect
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dpro.gtrace.schema import NodeTrace

from dpro.contracts.recording import MEMORY_VERSION, MetaKey

log = logging.getLogger(__name__)

#: the profiler's counter domain and the prefix of its CPU counters
COUNTER_CAT = "Device Storage"
CPU_COUNTER = "Memory: cpu"
KINDS = ("params", "grads", "optimizer_state", "buffers")

#: parameter-sized state arrays kept per parameter, by optimizer class (lower-case name)
_STATE_RULE: dict[str, Any] = {
    "sgd": lambda o: 1.0 if getattr(o, "momentum", 0) else 0.0,
    "nag": lambda o: 1.0 if getattr(o, "momentum", 0) else 0.0,
    "signum": lambda o: 1.0 if getattr(o, "momentum", 0) else 0.0,
    "adam": lambda o: 2.0,
    "adamw": lambda o: 2.0,
    "lamb": lambda o: 2.0,
    "nadam": lambda o: 2.0,
    "adamax": lambda o: 2.0,
    "adagrad": lambda o: 1.0,
    "adadelta": lambda o: 2.0,
    "rmsprop": lambda o: 3.0 if getattr(o, "centered", False) else 1.0,
    "ftml": lambda o: 3.0,
}


def _nbytes(a: Any) -> int:
    import numpy as np

    return int(a.size) * int(np.dtype(a.dtype).itemsize)


def _arrays(x: Any) -> list[Any]:
    """The NDArrays in an optimizer state (an NDArray, a tuple/list of them, or None)."""
    import mxnet as mx

    if isinstance(x, mx.nd.NDArray):
        return [x]
    if isinstance(x, (list, tuple)):
        return [a for y in x for a in _arrays(y)]
    return []


@dataclass
class TrainerWatch:
    """Notes the ``gluon.Trainer`` objects whose ``step``/``update``/``allreduce_grads`` run
    while it is started (class-level wrappers that only record, removed by :meth:`stop`)."""

    trainers: list[Any] = field(default_factory=list)
    _orig: dict[str, Any] = field(default_factory=dict)

    def start(self) -> None:
        from mxnet import gluon

        watch = self
        for meth in ("step", "update", "allreduce_grads"):
            orig = getattr(gluon.Trainer, meth)
            self._orig[meth] = orig

            def wrapped(tr: Any, *args: Any, _orig: Any = orig, **kwargs: Any) -> Any:
                if not any(t is tr for t in watch.trainers):
                    watch.trainers.append(tr)
                return _orig(tr, *args, **kwargs)

            setattr(gluon.Trainer, meth, wrapped)

    def stop(self) -> None:
        from mxnet import gluon

        for meth, orig in self._orig.items():
            setattr(gluon.Trainer, meth, orig)
        self._orig.clear()


def optimizer_facts(trainer: Any) -> dict:
    """Type, hyper-parameters, where the state lives and its bytes on this worker."""
    opt = trainer._optimizer
    name = type(opt).__name__
    params = [p for p in trainer._params if p.grad_req != "null"]
    pbytes = sum(_nbytes(d) for p in params for d in p.list_data()[:1])
    on_kv = bool(trainer._update_on_kvstore)
    state_bytes = n_state = 0
    if not on_kv:
        seen: set[int] = set()
        for upd in trainer._updaters:
            for st in upd.states.values():
                for a in _arrays(st):
                    h = a.handle.value
                    if h not in seen:
                        seen.add(h)
                        state_bytes += _nbytes(a)
                        n_state += 1
    rule_fn = _STATE_RULE.get(name.lower())
    rule = rule_fn(opt) if rule_fn else None
    hyper = {k: v for k, v in vars(opt).items() if not k.startswith("_")
             and (v is None or isinstance(v, (int, float, bool, str)))}
    return {
        "type": name,
        "module": type(opt).__module__,
        "params": len(params),
        "param_bytes": pbytes,
        "hyper": hyper,
        "update_on_kvstore": on_kv,
        "state_location": "servers" if on_kv else "worker",
        "state_tensors": n_state,
        "state_bytes": state_bytes,
        "state_per_param_rule": rule,
        "expected_state_bytes": None if rule is None else int(rule * pbytes),
    }


def static_facts(model: Any, trainers: list[Any]) -> dict:
    """The arrays that live across iterations (bytes by kind) and the optimizers' facts.

    Parameters with a gradient count as ``params`` (and their gradient arrays as
    ``grads``), parameters without one (``grad_req='null'``: BatchNorm's running
    statistics) as ``buffers``; each array once (by handle).
    """
    static = dict.fromkeys(KINDS, 0)
    seen: set[int] = set()

    def add(kind: str, arrs: list[Any]) -> None:
        for a in arrs:
            h = a.handle.value
            if h not in seen:
                seen.add(h)
                static[kind] += _nbytes(a)

    for p in model.collect_params().values():
        try:
            data = p.list_data()
        except Exception:  # noqa: BLE001 - deferred init never completed
            continue
        if p.grad_req == "null":
            add("buffers", data)
        else:
            add("params", data)
            add("grads", p.list_grad())
    opts = [optimizer_facts(t) for t in trainers]
    static["optimizer_state"] = sum(o["state_bytes"] for o in opts)
    return {"version": MEMORY_VERSION, "static": static, "static_bytes": sum(static.values()), "optimizers": opts,
            "instrument": "mx.profiler storage counter (profile_memory=True)"}


# ------------------------------------------------------------------------ collect time
def counter_deltas(events: list[dict]) -> list[tuple[float, int]]:
    """(ts, change in bytes) of every CPU storage counter event, in time order."""
    per: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "C" or e.get("cat") != COUNTER_CAT:
            continue
        name = str(e.get("name", ""))
        if not name.startswith(CPU_COUNTER):
            continue
        v = (e.get("args") or {}).get(name)
        ts = e.get("ts")
        if isinstance(v, (int, float)) and isinstance(ts, (int, float)):
            per[name].append((float(ts), int(v)))
    out: list[tuple[float, int]] = []
    for series in per.values():
        prev = 0  # the counter starts at 0 when the profiler starts
        # the file is not in time order (each thread's events are written in blocks); each
        # event holds the counter's value after its change
        for ts, v in sorted(series, key=lambda x: x[0]):
            out.append((ts, v - prev))
            prev = v
    out.sort(key=lambda x: x[0])
    return out


def _split_temporaries(deltas: list[int]) -> tuple[int, int, int]:
    """(peak, alloc, free) of one op's changes in order; a free equal to an earlier
    unmatched allocation of the same op is that allocation's end (a temporary)."""
    level = peak = 0
    open_: dict[int, int] = defaultdict(int)
    alloc = free = 0
    for d in deltas:
        level += d
        peak = max(peak, level)
        if d > 0:
            open_[d] += 1
            alloc += d
        elif d < 0:
            if open_[-d]:
                open_[-d] -= 1
                alloc += d
            else:
                free -= d
    return peak, alloc, free


def attach_counter(nt: "NodeTrace", events: list[dict], facts: dict | None, main_device: str = "cpu:main") -> None:
    """Fill ``nt.meta["memory"]`` from the rank's storage-counter events and its recorded facts.

    Steps analysed: every profiled step of ``nt`` but the first (the counter's clamped
    start). Each step owns the changes after the previous step's end up to its own end.
    """
    mem = dict(facts or {})
    deltas = counter_deltas(events)
    steps = sorted(nt.steps)
    if not deltas or len(steps) < 2:
        if facts:
            nt.meta[MetaKey.MEMORY] = mem
        if not deltas:
            log.info("%s: no storage counter events (profile_memory off?): static arrays only", nt.info.name)
        return
    by_step: dict[int, list] = defaultdict(list)
    for e in nt.events:
        if e.step in nt.steps:
            op = nt.ops.get(e.op)
            if op is not None and op.device.startswith("cpu:") and op.cat != "COMM":
                by_step[e.step].append((e.ts, e.ts + e.dur, e.op, op.device == main_device))
    ts_all = [d[0] for d in deltas]
    analysed = steps[1:]
    per_op: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    starts: list[int] = []
    level = sum(d for t, d in deltas if t <= sum(nt.steps[steps[0]]))
    lowest = level
    end_op = next((o for o in nt.ops if o.startswith("STEP_END")), None)
    for prev, s in zip(steps, analysed):
        lo, hi = sum(nt.steps[prev]), sum(nt.steps[s])
        i0, i1 = bisect.bisect_right(ts_all, lo), bisect.bisect_right(ts_all, hi)
        starts.append(level)
        evs = sorted(by_step[s])
        main = [x for x in evs if x[3] and not x[2].startswith("STEP_END")]
        main_starts = [x[0] for x in main]
        changes: dict[str, list[int]] = defaultdict(list)
        for t, d in deltas[i0:i1]:
            level += d
            lowest = min(lowest, level)
            owner = next((x[2] for x in main if x[0] <= t <= x[1]), None)
            if owner is None:
                owner = next((x[2] for x in evs if not x[3] and x[0] <= t <= x[1]), None)
            if owner is None:
                j = bisect.bisect_left(main_starts, t)
                owner = main[j][2] if j < len(main) else end_op
            if owner is not None:
                changes[owner].append(d)
        for op, ds in changes.items():
            pk, al, fr = _split_temporaries(ds)
            acc = per_op[op]
            acc[0] += pk
            acc[1] += al
            acc[2] += fr
    n = len(analysed)
    if mem.get("counter_started") == "recorder" and isinstance(mem.get("static"), dict):
        # the counter holds everything allocated since the recorder was made: at the
        # emptiest instant, the static arrays allocated since then plus what else lasts
        other = lowest - (int(mem.get("static_bytes", 0)) - int(mem.get("static_before_counter", 0)))
        if other < 0:
            log.warning("%s: the storage counter's floor is %d bytes below the static arrays made since it "
                        "started (a free of an older array?): no 'other' static bytes", nt.info.name, -other)
        mem["static"] = {**mem["static"], "other": max(0, other)}
        mem["static_bytes"] = sum(int(v) for v in mem["static"].values())
    ops = {op: {"peak": round(a[0] / n), "alloc": round(a[1] / n), "free": round(a[2] / n)} for op, a in per_op.items()}
    mem.update({
        "steps": analysed,
        "carry_in": round(sum(starts) / n - lowest),
        "ops": ops,
        "unattributed_bytes": 0,
        "counter_lowest": lowest,
    })
    nt.meta[MetaKey.MEMORY] = mem
