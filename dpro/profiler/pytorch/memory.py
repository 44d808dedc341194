"""What the PyTorch recorder keeps, in the rank process, for memory estimation (dpro/replayer/memory.py).

:class:`MemoryWatch` (started and stopped with the profiling window by
:mod:`dpro.profiler.pytorch.backend`) finds the job's optimizers and the tensors that live
across iterations — parameters, gradients, optimizer state, module buffers — and writes
them to ``rank<r>.meta.json`` under ``"memory"`` (:meth:`MemoryWatch.facts`). The
allocations of the window are attributed to ops offline
(:mod:`dpro.importers.recording.allocations`).

**How the optimizer is found.** During the window a global
``torch.optim.Optimizer`` step pre-hook (``register_optimizer_step_pre_hook``) notes every
optimizer that steps and holds one of the model's parameters; it is removed at the end of
the window. This keeps the two-line API (no optimizer argument), costs one Python call per
``optimizer.step()`` inside the window and nothing outside it, sees exactly the optimizers
that run (wrappers such as Horovod's DistributedOptimizer are ``Optimizer`` subclasses, so
their ``step`` is hooked too), and reads their state after warm-up, when lazily created
state (Adam's moments) exists. A heap scan (``gc.get_objects``) is the fallback when no
hooked step ran in the window.

**Which tensors are static.** A storage counts as static when a parameter, gradient,
optimizer-state entry or buffer holds it both when the window starts and when it ends,
and the tensor seen at the start is still alive (a weak reference: the allocator may give
a freed gradient's address to the next one); storages shared by several (DDP's
``gradient_as_bucket_view``) count once.
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass, field
from typing import Any

from dpro.contracts.recording import MEMORY_STATIC_KINDS, MEMORY_VERSION


def _storage(t: Any) -> tuple[int, int] | None:
    """(data pointer, bytes) of a tensor's storage; None for meta/empty/sparse tensors."""
    try:
        s = t.untyped_storage()
        n = int(s.nbytes())
        p = int(s.data_ptr())
    except Exception:  # noqa: BLE001 - sparse, meta, functorch wrappers...
        return None
    return (p, n) if p and n else None


def _expected_state_per_param(opt: Any) -> float | None:
    """State tensors (each the parameter's size) the optimizer keeps per parameter, by rule."""
    name = type(opt).__name__
    g = opt.param_groups[0] if opt.param_groups else {}
    if name == "SGD":
        return 1.0 if g.get("momentum", 0) else 0.0
    if name in ("Adam", "AdamW", "NAdam", "RAdam", "Adamax"):
        return 2.0 + (1.0 if g.get("amsgrad") else 0.0)
    if name == "Adagrad":
        return 1.0
    if name == "RMSprop":
        return 1.0 + (1.0 if g.get("momentum", 0) else 0.0) + (1.0 if g.get("centered") else 0.0)
    if name == "Adadelta":
        return 2.0
    return None


def optimizer_facts(opt: Any) -> dict:
    """Type, hyper-parameters and state bytes of one torch optimizer (measured and by rule)."""
    import torch

    params = [p for g in opt.param_groups for p in g["params"]]
    trainable = [p for p in params if p.requires_grad]
    pbytes = sum(p.numel() * p.element_size() for p in trainable)
    state_bytes = 0
    n_state = 0
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                state_bytes += v.numel() * v.element_size()
                n_state += 1
    group = opt.param_groups[0] if opt.param_groups else {}
    hyper = {k: v for k, v in group.items() if k != "params" and (v is None or isinstance(v, (int, float, bool, str)))}
    rule = _expected_state_per_param(opt)
    return {
        "type": type(opt).__name__,
        "module": type(opt).__module__,
        "params": len(trainable),
        "param_bytes": pbytes,
        "hyper": hyper,
        "state_tensors": n_state,
        "state_bytes": state_bytes,
        "state_per_param_rule": rule,
        "expected_state_bytes": None if rule is None else int(rule * pbytes),
    }


@dataclass(frozen=True, slots=True)
class _Held:
    """A storage the model or its optimizers hold, and a weak reference to a tensor on it."""

    bytes: int
    kind: str
    ref: Any

    def same_as(self, ptr: int, other: "_Held") -> bool:
        """Still the same storage: same size and the tensor seen first still alive on it.

        The allocator may give a freed gradient's address to the next step's gradient; the
        weak reference tells them apart (a gradient set to None dies with its tensor).
        """
        t = self.ref()
        return self.bytes == other.bytes and t is not None and _storage(t) == (ptr, self.bytes)


def _held(t: Any, kind: str) -> tuple[int, _Held] | None:
    s = _storage(t)
    return None if s is None else (s[0], _Held(s[1], kind, weakref.ref(t)))


@dataclass
class MemoryWatch:
    """Finds the optimizers and the static tensors of one rank over the profiling window."""

    model: Any
    optimizers: list[Any] = field(default_factory=list)
    _at_start: dict[int, _Held] = field(default_factory=dict)
    _at_stop: dict[int, _Held] = field(default_factory=dict)
    _hook: Any = None

    def __post_init__(self) -> None:
        self.inner = getattr(self.model, "module", self.model)
        self._param_ids = {id(p) for p in self.inner.parameters()}

    # ---------------------------------------------------------------- window
    def start(self) -> None:
        """Call at window start: snapshot the static tensors, hook optimizer steps."""
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._at_start = self._storages()
        self._hook = register_optimizer_step_pre_hook(self._on_step)

    def _on_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        if any(o is opt for o in self.optimizers):
            return
        if any(id(p) in self._param_ids for g in opt.param_groups for p in g["params"]):
            self.optimizers.append(opt)
            for k, v in self._state_storages(opt).items():  # its state as it was before the window
                self._at_start.setdefault(k, v)

    def stop(self) -> None:
        """Call at window end: unhook, snapshot the static tensors again."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if not self.optimizers:
            self.optimizers = self._scan_optimizers()
        self._at_stop = self._storages()

    def _scan_optimizers(self) -> list[Any]:
        import torch

        return [o for o in gc.get_objects() if isinstance(o, torch.optim.Optimizer)
                and any(id(p) in self._param_ids for g in o.param_groups for p in g["params"])]

    # ---------------------------------------------------------------- tensors
    @staticmethod
    def _state_storages(opt: Any) -> dict[int, _Held]:
        import torch

        out: dict[int, _Held] = {}
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor) and (h := _held(v, "optimizer_state")):
                    out.setdefault(*h)
        return out

    def _storages(self) -> dict[int, _Held]:
        """data pointer -> what holds it, for every storage the model and its optimizers hold."""
        out: dict[int, _Held] = {}
        params = list(self.inner.parameters())
        for p in params:
            if h := _held(p, "params"):
                out.setdefault(*h)
        for p in params:
            if p.grad is not None and (h := _held(p.grad, "grads")):
                out.setdefault(*h)
        for o in self.optimizers:
            for k, v in self._state_storages(o).items():
                out.setdefault(k, v)
        for b in self.inner.buffers():
            if h := _held(b, "buffers"):
                out.setdefault(*h)
        return out

    def facts(self, buckets: list[dict] | None = None) -> dict:
        """What goes into ``rank<r>.meta.json["memory"]`` (bytes)."""
        static = {k: 0 for k in MEMORY_STATIC_KINDS}
        for ptr, h in self._at_stop.items():
            first = self._at_start.get(ptr)
            if first is not None and first.same_as(ptr, h):
                static[h.kind] += h.bytes
        grads = [p.grad for p in self.inner.parameters() if p.grad is not None]
        grad_bytes = sum(g.numel() * g.element_size() for g in grads)
        # gradient_as_bucket_view: the gradients are views into DDP's buckets (already counted)
        views = any((s := _storage(g)) is not None and s[1] > g.numel() * g.element_size() for g in grads)
        bucket_bytes = sum(int(b.get("bytes", 0)) for b in buckets or [])
        static["ddp_buckets"] = 0 if views else bucket_bytes
        return {
            "version": MEMORY_VERSION,
            "static": static,
            "static_bytes": sum(static.values()),
            "param_bytes": sum(p.numel() * p.element_size() for p in self.inner.parameters()),
            "grad_bytes_at_stop": grad_bytes,
            "grads_are_bucket_views": views,
            "ddp_bucket_bytes": bucket_bytes,
            "optimizers": [optimizer_facts(o) for o in self.optimizers],
        }
