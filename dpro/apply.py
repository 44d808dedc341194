"""Read the strategy files `dpro optimize -o DIR` wrote, for the training script.

Imports nothing of dpro but its errors, JSON reader and the strategy-file contract
(:mod:`dpro.contracts.strategy_files`), so a training script pays for no more.

.. code-block:: python

    from dpro.apply import ddp_kwargs, horovod_groups, horovod_env
    ddp = DDP(model, **ddp_kwargs("strategy/"))                     # bucket_cap_mb
    os.environ.update(horovod_env("strategy/")); hvd.init()        # fusion threshold, cycle
    os.environ.update(mxnet_env("strategy/")); kv = mx.kv.create("dist_sync")  # PS key split
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   groups=horovod_groups("strategy/", model.named_parameters()))
    mem = memory_settings("strategy/")                               # memory.json
    checkpoint_modules(model, mem.checkpoint_modules)                # recomputation
    for j, (x, y) in enumerate(split_batch((x, y), mem.accumulation_steps)):  # accumulation
        with ddp.no_sync() if j < mem.accumulation_steps - 1 else contextlib.nullcontext():
            (loss_fn(ddp(x), y) / mem.accumulation_steps).backward()
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpro.contracts import strategy_files as sf
from dpro.errors import DproInputError
from dpro.jsonio import read_json


def _load(path: str | Path, name: str) -> dict:
    p = Path(path)
    f = p / name if p.is_dir() else p
    d = read_json(f)
    if not isinstance(d, dict):
        raise DproInputError(f, "expected a JSON object")
    return d


def ddp_kwargs(path: str | Path) -> dict[str, float]:
    """``DistributedDataParallel`` keyword arguments from ``ddp.json`` (a file or its directory);
    empty where dpro keeps DDP's default (``keep_default``)."""
    d = _load(path, sf.DDP_JSON)
    if d.get(sf.KEEP_DEFAULT) is True:
        return {}
    cap = d.get(sf.BUCKET_CAP_MB)
    if not isinstance(cap, (int, float)) or isinstance(cap, bool) or cap <= 0:
        raise DproInputError(Path(path), f"{sf.DDP_JSON}: '{sf.BUCKET_CAP_MB}' must be a positive number")
    return {"bucket_cap_mb": float(cap)}


def horovod_env(path: str | Path) -> dict[str, str]:
    """``HOROVOD_FUSION_THRESHOLD`` / ``HOROVOD_CYCLE_TIME`` from ``horovod.json`` (set before ``hvd.init()``)."""
    d = _load(path, sf.HOROVOD_JSON)
    out = {}
    for k in sf.HOROVOD_ENV_VARS:
        v = d.get(k)
        if v is not None:
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise DproInputError(Path(path), f"{sf.HOROVOD_JSON}: '{k}' must be a non-negative number")
            out[k] = str(v)
    return out


def mxnet_env(path: str | Path) -> dict[str, str]:
    """``MXNET_KVSTORE_BIGARRAY_BOUND`` from ``mxnet.json`` (set before ``mx.kv.create``, on every worker)."""
    d = _load(path, sf.MXNET_JSON)
    v = d.get(sf.MXNET_KVSTORE_BIGARRAY_BOUND)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise DproInputError(Path(path), f"{sf.MXNET_JSON}: '{sf.MXNET_KVSTORE_BIGARRAY_BOUND}' must be a positive integer")
    return {sf.MXNET_KVSTORE_BIGARRAY_BOUND: str(v)}


def horovod_groups(path: str | Path, named_parameters: Iterable[tuple[str, Any]]) -> list[list[Any]] | None:
    """The parameter groups of ``horovod.json`` as lists of the model's parameters; None
    where dpro keeps Horovod's default fusion (``keep_default``).

    Parameters the file does not name (e.g. frozen ones) are left to Horovod's default.
    """
    d = _load(path, sf.HOROVOD_JSON)
    if d.get(sf.KEEP_DEFAULT) is True:
        return None
    groups = d.get(sf.GROUPS)
    if not isinstance(groups, list) or not all(isinstance(g, list) and all(isinstance(n, str) for n in g) for g in groups):
        raise DproInputError(Path(path), f"{sf.HOROVOD_JSON}: '{sf.GROUPS}' must be a list of lists of parameter names")
    params = dict(named_parameters)
    unknown = [n for g in groups for n in g if n not in params]
    if unknown:
        raise DproInputError(Path(path), f"{sf.HOROVOD_JSON} names parameters the model does not have: "
                                         f"{', '.join(unknown[:5])}")
    return [[params[n] for n in g] for g in groups if g]


@dataclass(frozen=True)
class MemorySettings:
    """``memory.json``: modules to checkpoint and micro-batches per step."""

    checkpoint_modules: tuple[str, ...] = ()
    accumulation_steps: int = 1


def memory_settings(path: str | Path) -> MemorySettings:
    """Modules to checkpoint and micro-batches per step from ``memory.json`` (none if absent)."""
    p = Path(path)
    if p.is_dir() and not (p / sf.MEMORY_JSON).exists():
        return MemorySettings()
    d = _load(path, sf.MEMORY_JSON)
    mods, k = d.get(sf.CHECKPOINT_MODULES, []), d.get(sf.ACCUMULATION_STEPS, 1)
    if not isinstance(mods, list) or not all(isinstance(m, str) for m in mods):
        raise DproInputError(Path(path), f"{sf.MEMORY_JSON}: '{sf.CHECKPOINT_MODULES}' must be a list of module names")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise DproInputError(Path(path), f"{sf.MEMORY_JSON}: '{sf.ACCUMULATION_STEPS}' must be a positive integer")
    return MemorySettings(tuple(mods), k)


def checkpoint_modules(model: Any, names: Sequence[str]) -> None:
    """Recompute each named submodule's forward in backward (``torch.utils.checkpoint``,
    non-reentrant, so it works under DDP). ``model``: the module the names are relative
    to (the inner model, not the DDP wrapper)."""
    import functools

    from torch.utils.checkpoint import checkpoint

    for name in names:
        try:
            mod = model.get_submodule(name)
        except AttributeError:
            raise DproInputError(None, f"{sf.MEMORY_JSON}: the model has no module {name!r}") from None
        mod.forward = functools.partial(checkpoint, mod.forward, use_reentrant=False)


def split_batch(batch: Sequence[Any], k: int) -> list[tuple[Any, ...]]:
    """``k`` micro-batches of a batch of tensors (split along the first dimension, which must divide by k)."""
    n = batch[0].shape[0]
    if k < 1 or n % k:
        raise ValueError(f"a batch of {n} cannot be split into {k} equal micro-batches")
    return list(zip(*(t.split(n // k) for t in batch)))


def _flag(path: str | Path, name: str, key: str) -> bool:
    """A true/false setting of strategy file ``name`` (False where the directory has none)."""
    p = Path(path)
    if p.is_dir() and not (p / name).exists():
        return False
    v = _load(path, name).get(key, False)
    if not isinstance(v, bool):
        raise DproInputError(Path(path), f"{name}: '{key}' must be true or false")
    return v


def autocast_enabled(path: str | Path) -> bool:
    """Whether the strategy runs forward and loss under ``torch.autocast`` (``amp.json``)."""
    return _flag(path, sf.AMP_JSON, sf.AUTOCAST)


def xla_jit_compile(path: str | Path) -> bool:
    """Whether the strategy compiles a TensorFlow job's gradient computation with XLA
    (``compile.json``: ``"xla_jit_compile": true``): compute the loss and the gradients in
    a ``tf.function(jit_compile=True)`` and reduce and apply them outside it (Horovod's
    ops are not compiled by XLA)."""
    return _flag(path, sf.COMPILE_JSON, sf.XLA_JIT_COMPILE)


def compile_modules(model: Any, path: str | Path) -> list[str]:
    """``torch.compile`` (in place) the modules ``compile.json`` lists (``""``: the whole
    model); no compile.json: nothing. Returns the names compiled."""
    p = Path(path)
    if p.is_dir() and not (p / sf.COMPILE_JSON).exists():
        return []
    names = _load(path, sf.COMPILE_JSON).get(sf.TORCH_COMPILE_MODULES, [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise DproInputError(Path(path), f"{sf.COMPILE_JSON}: '{sf.TORCH_COMPILE_MODULES}' must be a list of module names")
    for n in names:
        try:
            mod = model.get_submodule(n) if n else model
        except AttributeError:
            raise DproInputError(Path(path), f"{sf.COMPILE_JSON}: the model has no module {n!r}") from None
        compile_module(mod)
    return names


def compile_module(mod: Any) -> None:
    """``torch.compile`` a module's forward in place (its hooks stay eager).

    Not ``mod.compile()``: that compiles ``Module._call_impl``, and for torch's own modules
    (``Sequential``, ``Linear``...) both it and ``forward`` are on Dynamo's skip list, so
    nothing is compiled and the module silently runs eagerly (torch 2.13,
    pytorch/pytorch#150915). A function defined here gives Dynamo a frame it traces, and
    it inlines ``forward`` from there. Bound as a method, so that a deep copy of the model
    runs its own parameters."""
    import types

    import torch

    mod.forward = types.MethodType(torch.compile(_class_forward), mod)


def _class_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    return type(self).forward(self, *args, **kwargs)
