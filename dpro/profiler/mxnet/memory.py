"""What the MXNet recorder keeps, in the rank process, for memory estimation (dpro/replayer/memory.py).

:class:`TrainerWatch` (started and stopped with the profiling window by
:mod:`dpro.profiler.mxnet.backend`) notes the ``gluon.Trainer`` objects that step during
the window; :func:`static_facts` then reads the arrays that live across iterations —
parameters, gradients, parameters without gradient (BatchNorm's running statistics:
``buffers``), and the optimizer state held on the worker (none with the update on the
kvstore, the parameter-server default: the servers keep it) — into
``rank<r>.meta.json["memory"]``. The backend also runs ``mx.profiler`` with
``profile_memory=True``, whose storage counter is attributed to ops offline
(:mod:`dpro.importers.mxnet.memory`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dpro.contracts.recording import MEMORY_STATIC_KINDS, MEMORY_VERSION

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
        """Patch gluon.Trainer's step, update and allreduce_grads to note the memory around each call."""
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
    static = dict.fromkeys(MEMORY_STATIC_KINDS, 0)
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
