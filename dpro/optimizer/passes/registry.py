"""Which passes an optimizer run uses: the built-ins, entry points, user modules.

No process-wide registry: every run builds its own :class:`PassRegistry`.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from importlib.metadata import entry_points

from dpro.errors import DproInputError
from dpro.optimizer.passes.base import MARK, GraphPass

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "dpro.passes"


class PassRegistry:
    """An ordered set of passes by name."""

    def __init__(self, passes: list[GraphPass] | None = None) -> None:
        self._passes: dict[str, GraphPass] = {}
        for p in passes or []:
            self.add(p)

    def add(self, p: GraphPass) -> None:
        if not isinstance(p, GraphPass):
            raise TypeError(f"not a dpro GraphPass: {p!r}")
        if p.name in self._passes:
            raise ValueError(f"two passes named {p.name!r}")
        self._passes[p.name] = p

    def names(self) -> list[str]:
        return list(self._passes)

    def get(self, name: str) -> GraphPass:
        return self._passes[name]

    def select(self, names: list[str]) -> list[GraphPass]:
        unknown = [n for n in names if n not in self._passes]
        if unknown:
            raise DproInputError(None, f"unknown pass(es) {', '.join(unknown)}; known: {', '.join(self._passes)}")
        return [self._passes[n] for n in names]

    def __iter__(self):
        return iter(self._passes.values())


def builtin_passes() -> list[GraphPass]:
    from dpro.optimizer.passes.grad_accumulation import GradientAccumulation
    from dpro.optimizer.passes.op_fusion import OpFusion
    from dpro.optimizer.passes.recomputation import Recomputation
    from dpro.optimizer.passes.tensor_fusion import TensorFusion
    from dpro.optimizer.passes.tensor_partition import TensorPartition

    return [TensorFusion(), OpFusion(), TensorPartition(), Recomputation(), GradientAccumulation()]


def passes_in_module(module: str) -> list[GraphPass]:
    """Instances of every class marked with ``@dpro.passes.register`` in ``module``."""
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any failure of a user's module is reported in one line
        raise DproInputError(module, f"cannot import the pass module: {type(e).__name__}: {e}") from None
    found = [cls() for _, cls in inspect.getmembers(mod, inspect.isclass)
             if getattr(cls, MARK, False) and cls.__module__ == mod.__name__]
    if not found:
        raise DproInputError(module, "defines no pass marked with @dpro.passes.register")
    return found


def default_registry(modules: list[str] | None = None, *, use_entry_points: bool = True) -> PassRegistry:
    """Built-ins, then passes published under the ``dpro.passes`` entry points, then ``modules``."""
    reg = PassRegistry(builtin_passes())
    if use_entry_points:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                obj = ep.load()
                reg.add(obj() if inspect.isclass(obj) else obj)
            except Exception as e:  # noqa: BLE001 - a broken plug-in must not stop the optimizer
                log.warning("dpro: pass entry point %s not loaded: %s", ep.name, e)
    for m in modules or []:
        for p in passes_in_module(m):
            reg.add(p)
    return reg
