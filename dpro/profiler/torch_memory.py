"""What the PyTorch recorder keeps for memory estimation (dpro/replayer/memory.py).

Two halves:

* in the rank process, :class:`MemoryWatch` (started and stopped with the profiling
  window by ``torch_backend.py``) finds the job's optimizers and the tensors that live
  across iterations — parameters, gradients, optimizer state, module buffers — and
  writes them to ``rank<r>.meta.json`` under ``"memory"`` (:meth:`MemoryWatch.facts`);
* at collect time, :func:`attach_allocations` reads torch.profiler's allocation events
  (``profile_memory=True``) of the rank's trace and attributes each block to the DFG op
  that allocated it and the op that freed it (``nt.meta["memory"]``).

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

import bisect
import gc
import gzip
import logging
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from dpro.contracts.recording import MEMORY_VERSION, TORCH_STEP_PREFIX, MetaKey
from dpro.errors import DproInputError

if TYPE_CHECKING:
    from dpro.gtrace.schema import NodeTrace

log = logging.getLogger(__name__)

#: kinds of static storage
KINDS = ("params", "grads", "optimizer_state", "buffers")


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
        static = {k: 0 for k in KINDS}
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


# ==================================================================== collect time
@dataclass
class _Block:
    bytes: int
    op: str
    step: int
    freed_by: str | None = None
    freed_step: int | None = None


def _memory_events(raw: dict, path: Path) -> tuple[object, list[tuple[float, object, int, int]]]:
    """(main thread id, [(ts, tid, bytes ±, addr)]) of a Kineto trace, in time order."""
    evs = raw.get("traceEvents") if isinstance(raw, dict) else None
    if not isinstance(evs, list):
        raise DproInputError(path, "not a Chrome trace (no traceEvents list)")
    main = None
    out = []
    for e in evs:
        if not isinstance(e, dict):
            continue
        if main is None and e.get("ph") == "X" and str(e.get("name", "")).startswith(TORCH_STEP_PREFIX):
            main = e.get("tid")
        if e.get("name") == "[memory]":
            a = e.get("args") or {}
            try:
                if int(a.get("Device Type", 0)) != 0:  # CPU only here; CUDA memory is another device
                    continue
                out.append((float(e["ts"]), e.get("tid"), int(a["Bytes"]), int(a["Addr"])))
            except (KeyError, TypeError, ValueError, AttributeError):
                raise DproInputError(path, f"a [memory] event (ts {e.get('ts')!r}) lacks a numeric ts, Bytes or Addr") from None
    out.sort(key=lambda x: x[0])
    return main, out


def attach_allocations(nt: "NodeTrace", rank_file: Path, facts: dict | None = None) -> dict | None:
    """Attribute the rank's recorded allocations to its DFG ops; store in ``nt.meta["memory"]``.

    Each allocation belongs to the op on the main thread that runs when it happens, or to
    the next op when it happens in the host gap before that op (the replayer charges the
    gap to the op). Per op, over the analysed steps (every step of the window but the
    first, whose frees of blocks allocated before the window are invisible):

    * ``peak``: the highest the live bytes rise above their level at the op's start while
      it runs (its own temporaries included), mean over steps;
    * ``alloc`` / ``free``: bytes it allocates that outlive it / it frees, mean over steps;
    * ``lifetimes``: ``[producer op, releaser op or null, bytes]`` for blocks that outlive
      their op (``null``: not freed before the window ended);
    * ``carry_in``: bytes allocated in an earlier step still live when a step starts.

    Returns the memory dict, or None when the trace holds no allocation events.
    """
    try:
        with gzip.open(rank_file, "rb") as f:
            data = f.read()
    except OSError:
        data = Path(rank_file).read_bytes()
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise DproInputError(rank_file, f"not valid JSON ({e})") from None
    main, mem = _memory_events(raw, Path(rank_file))
    del raw, data
    out = dict(facts or nt.meta.get(MetaKey.MEMORY) or {})
    if not mem:
        return None
    main_dev = "cpu:main"
    ops = sorted((e for e in nt.events if nt.ops.get(e.op) is not None and nt.ops[e.op].device == main_dev),
                 key=lambda e: e.ts)
    ends = [e.ts + e.dur for e in ops]
    steps = sorted(nt.steps)
    analysed = steps[1:] if len(steps) > 1 else steps
    live: dict[int, _Block] = {}
    per_op_events: dict[tuple[str, int], list[int]] = defaultdict(list)  # (op, step) -> [± bytes]
    lifetimes: dict[tuple[str, str | None], int] = defaultdict(int)
    alloc: dict[str, int] = defaultdict(int)
    free: dict[str, int] = defaultdict(int)
    unattributed = 0
    blocks: list[_Block] = []
    for ts, tid, nbytes, addr in mem:
        i = bisect.bisect_left(ends, ts)
        if tid != main or i >= len(ops):
            unattributed += abs(nbytes) if nbytes > 0 else 0
            if nbytes < 0:
                live.pop(addr, None)
            continue
        ev = ops[i]
        if nbytes > 0:
            b = _Block(nbytes, ev.op, ev.step)
            live[addr] = b
            blocks.append(b)
            per_op_events[(ev.op, ev.step)].append(nbytes)
        else:
            b = live.pop(addr, None)
            if b is None:
                continue
            b.freed_by, b.freed_step = ev.op, ev.step
            per_op_events[(ev.op, ev.step)].append(-b.bytes)
    sel = set(analysed)
    n = max(1, len(sel))
    for b in blocks:
        if b.step in sel and not (b.freed_by == b.op and b.freed_step == b.step):
            alloc[b.op] += b.bytes
            lifetimes[(b.op, b.freed_by)] += b.bytes
        if b.freed_step in sel and not (b.freed_by == b.op and b.freed_step == b.step):
            free[b.freed_by] += b.bytes  # type: ignore[index]
    carry = 0
    for s in analysed:
        carry += sum(b.bytes for b in blocks if b.step < s and (b.freed_step is None or b.freed_step >= s))
    peak: dict[str, float] = defaultdict(float)
    for (op, s), deltas in per_op_events.items():
        if s in sel:
            run = top = 0
            for d in deltas:
                run += d
                top = max(top, run)
            peak[op] += top
    names = set(alloc) | set(free) | set(peak)
    out.update({
        "version": MEMORY_VERSION,
        "steps": analysed,
        "carry_in": int(round(carry / n)),
        "ops": {op: {"peak": int(round(peak[op] / n)), "alloc": int(round(alloc[op] / n)),
                     "free": int(round(free[op] / n))} for op in sorted(names)},
        "lifetimes": [[a, b, int(round(v / n))] for (a, b), v in sorted(lifetimes.items(), key=lambda x: (x[0][0], x[0][1] or ""))],
        "unattributed_bytes": int(round(unattributed / n)),
    })
    nt.meta[MetaKey.MEMORY] = out
    return out
