"""The light steps of a CPU-light recording (``DPRO_CPU_LIGHT``): times taken by hooks alone.

After the window's first call (recorded by torch.profiler: the structure), the recorder stops
the profiler and times the later calls with Python hooks on a monotonic clock
(``time.perf_counter_ns``), in µs:

* ``step``: the call of the step function;
* each layer's forward (``dpro.layer::<path>``, the names of the structure step's layer ranges);
* each optimizer step (``Optimizer.step#<class>.step``, the range torch's optimizers open
  around their step; Horovod's DistributedOptimizer waits for its all-reduces in it);
* each DDP bucket's hook (``dpro.bucket::<index>``) and ``comm#k``: the k-th bucket of the
  step from its hook's call to its all-reduce's completion (a callback on the collective's
  future, on the thread that completes it).

:mod:`dpro.importers.kineto.cpu_light` maps the structure step's op times onto each light step
through these anchors. A hook costs a clock read and a list append (about a microsecond),
against torch.profiler's events for every operator.
"""

from __future__ import annotations

import time
from typing import Any

from dpro.contracts.recording import OPTIMIZER_STEP_PREFIX

#: one anchor: (name, start µs, end µs)
Anchor = tuple[str, float, float]


def _now_us() -> float:
    return time.perf_counter_ns() / 1e3


class AnchorLog:
    """The anchors of the light steps, one list per step (in the order they closed)."""

    def __init__(self) -> None:
        self.steps: list[list[Anchor]] = []
        self.numbers: list[int] = []
        self._cur: list[Anchor] | None = None
        self._open: list[tuple[str, float]] = []
        self._comm = 0
        self._t0 = 0.0
        #: Unix time minus the anchors' clock, µs (the importer puts the anchors on the trace's clock)
        self.unix_offset_us = (time.time_ns() - time.perf_counter_ns()) / 1e3

    def begin_step(self, number: int) -> None:
        self._cur = []
        self._open.clear()
        self._comm = 0
        self.numbers.append(number)
        self._t0 = _now_us()

    def end_step(self) -> None:
        t1 = _now_us()
        if self._cur is None:
            return
        self._cur.append(("step", self._t0, t1))
        self.steps.append(self._cur)
        self._cur = None

    def enter(self, name: str) -> None:
        """Open a range (a layer's forward, a bucket's hook); ranges nest."""
        if self._cur is not None:
            self._open.append((name, _now_us()))

    def exit(self) -> None:
        """Close the innermost open range."""
        if self._cur is not None and self._open:
            name, t0 = self._open.pop()
            self._cur.append((name, t0, _now_us()))

    def optimizer_hooks(self) -> list[Any]:
        """Global optimizer step pre- and post-hooks that open and close ``Optimizer.step#...``
        (torch calls them inside that range); the handles, to remove at the window's end."""
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        def pre(opt: Any, args: Any, kwargs: Any) -> None:
            self.enter(f"{OPTIMIZER_STEP_PREFIX}{type(opt).__name__}.step")

        def post(opt: Any, args: Any, kwargs: Any) -> None:
            self.exit()

        return [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]

    def comm(self, fut: Any) -> Any:
        """``fut`` (a bucket's all-reduce) with a callback that adds ``comm#k`` on completion;
        returns the future DDP is to wait on (its value: the reduced bucket)."""
        cur = self._cur
        if cur is None:
            return fut
        name, t0 = f"comm#{self._comm}", _now_us()
        self._comm += 1

        def done(f: Any) -> Any:
            cur.append((name, t0, _now_us()))  # list.append is atomic: the callback's thread is gloo's
            return f.value()

        return fut.then(done)
