"""What-ifs by name: the built-ins and those of user modules (``--load-whatif MODULE``).

A what-if is a function ``(graph: WhatIfGraph, **params) -> None`` marked with
:func:`whatif`; every marked function of a loaded module is found. No process-wide
registry: :func:`available` builds the table each time.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import TypeVar

from dpro.errors import DproInputError

MARK = "__dpro_whatif__"
F = TypeVar("F", bound=Callable)


def whatif(name: str) -> Callable[[F], F]:
    """Decorator: mark a function ``(graph, **params) -> None`` as the what-if ``name``."""
    def mark(fn: F) -> F:
        setattr(fn, MARK, name)
        return fn
    return mark


def in_module(module: str) -> dict[str, Callable]:
    """The what-ifs a module defines (import errors: one line)."""
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - the user's module: any error is their input's
        raise DproInputError(module, f"cannot load what-if module: {type(e).__name__}: {e}") from None
    found = {getattr(f, MARK): f for _, f in inspect.getmembers(mod, callable) if hasattr(f, MARK)}
    if not found:
        raise DproInputError(module, "no what-if in the module (mark functions with @dpro.whatif.whatif('name'))")
    return found


def available(modules: list[str] | tuple[str, ...] = ()) -> dict[str, Callable]:
    """Built-in what-ifs, then those of ``modules`` (a later one of the same name wins)."""
    out = in_module("dpro.whatif.builtin")
    for m in modules:
        out.update(in_module(m))
    return out


def parse_apply(spec: str, table: dict[str, Callable]) -> tuple[Callable, dict]:
    """``name`` or ``name:key=value,key=value`` -> (function, params); values are numbers."""
    name, _, rest = spec.partition(":")
    if name not in table:
        raise DproInputError(None, f"unknown what-if {name!r}; known: {', '.join(sorted(table))}")
    params = {}
    for kv in filter(None, rest.split(",")):
        k, eq, v = kv.partition("=")
        try:
            params[k.strip()] = float(v) if "." in v or "e" in v.lower() else int(v)
        except ValueError:
            raise DproInputError(None, f"what-if {name}: parameter {kv!r} is not key=number") from None
        if not eq:
            raise DproInputError(None, f"what-if {name}: parameter {kv!r} is not key=number")
    try:
        inspect.signature(table[name]).bind(None, **params)
    except TypeError as e:
        raise DproInputError(None, f"what-if {name}: {e}") from None
    return table[name], params
