"""Measure what op fusion buys: each model block run eagerly and under ``torch.compile``.

Opt-in (``dpro profile --measure-compile``, or ``DPRO_MEASURE_COMPILE=1``): compiling takes
tens of seconds per module on a CPU. From the recorder's creation a forward pre-hook
keeps the first inputs of every module that has children (the blocks op fusion fuses
inside) and of the model itself (copies made in the first, warm-up, step: not in the
profiled window); after the window each distinct (module class, input shapes) is timed
forward + backward, eagerly and compiled (``torch.compile``, default inductor), interleaved,
medians. Gradients go through ``torch.autograd.grad`` (the parameters' ``.grad`` are not
touched) and the RNG state is restored, so training continues unchanged.

Written to ``rank<r>.meta.json["compile"]``: ``{module name: {"class", "eager_us",
"compiled_us"}}`` (modules sharing class and input shapes share one measurement);
the model itself is ``""``. The op-fusion pass uses the ratio compiled / eager of the
smallest measured module around a fused chain (:func:`dpro.optimizer.passes.op_fusion.fused_duration`).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from typing import Any

from dpro.contracts.recording import ENV_COMPILE_BUDGET_S

log = logging.getLogger(__name__)

DEFAULT_BUDGET_S = 600.0
REPEATS = 7


class CompileProbe:
    """Keeps the first inputs of the model's blocks during the window; measures after it."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.inputs: dict[str, tuple[tuple, dict]] = {}
        self.hooks: dict[str, Any] = {}

    def start(self) -> None:
        """Keep the next inputs of each block: call before the window (the copies would
        otherwise be recorded in it); each hook removes itself once it has them."""
        import torch

        def cp(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                # as in training: an activation needs its gradient, the batch does not
                return x.detach().clone().requires_grad_(x.requires_grad)
            return x

        def keep(name: str):
            def pre(mod: Any, args: tuple, kwargs: dict) -> None:
                if name not in self.inputs:
                    self.inputs[name] = (tuple(cp(a) for a in args), {k: cp(v) for k, v in kwargs.items()})
                    self.hooks.pop(name).remove()
            return pre

        for name, mod in self.model.named_modules():
            if name == "" or any(True for _ in mod.children()):
                self.hooks[name] = mod.register_forward_pre_hook(keep(name), with_kwargs=True)

    def stop(self) -> None:
        for h in self.hooks.values():
            h.remove()
        self.hooks.clear()

    def measure(self, budget_s: float | None = None) -> dict[str, dict]:
        """Eager vs compiled forward + backward time per measured module (µs)."""
        import torch

        budget = budget_s if budget_s is not None else float(os.environ.get(ENV_COMPILE_BUDGET_S, DEFAULT_BUDGET_S))
        t_end = time.monotonic() + budget
        rng = torch.get_rng_state()
        out: dict[str, dict] = {}
        done: dict[tuple, dict] = {}
        try:
            # the model first: it tells what compiling everything would give
            for name in sorted(self.inputs, key=lambda n: (n != "", n.count("."), n)):
                mod = self.model.get_submodule(name)
                args, kwargs = self.inputs[name]
                key = (type(mod).__qualname__, _shapes(args), _shapes(tuple(kwargs.values())))
                if key not in done:
                    if time.monotonic() > t_end:
                        log.warning("dpro: compile measurement budget spent; %s not measured", name)
                        continue
                    try:
                        done[key] = _measure(torch, mod, args, kwargs)
                    except Exception as e:  # noqa: BLE001 - a module that does not compile is skipped
                        log.warning("dpro: %s (%s) not measured under torch.compile: %s", name, key[0], e)
                        done[key] = {}
                if done[key]:
                    out[name] = {"class": key[0], **done[key]}
        finally:
            torch.set_rng_state(rng)
        return out


def _shapes(xs: tuple) -> tuple:
    return tuple(tuple(x.shape) if hasattr(x, "shape") else repr(x) for x in xs)


def _measure(torch: Any, mod: Any, args: tuple, kwargs: dict) -> dict:
    params = [p for p in mod.parameters() if p.requires_grad]
    leaves = [x for x in list(args) + list(kwargs.values()) if isinstance(x, torch.Tensor) and x.requires_grad]
    compiled = torch.compile(mod)

    def run(m: Any) -> None:
        y = m(*args, **kwargs)
        ys = [t for t in (y if isinstance(y, (tuple, list)) else (y,)) if isinstance(t, torch.Tensor)
              and t.requires_grad]
        if ys:
            torch.autograd.grad(sum(t.float().sum() for t in ys), params + leaves, allow_unused=True)

    for _ in range(2):  # compile, warm up
        run(compiled)
        run(mod)
    eager, comp = [], []
    for _ in range(REPEATS):
        for m, acc in ((mod, eager), (compiled, comp)):
            t0 = time.perf_counter()
            run(m)
            acc.append((time.perf_counter() - t0) * 1e6)
    return {"eager_us": statistics.median(eager), "compiled_us": statistics.median(comp)}
