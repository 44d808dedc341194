"""The two-line API.

.. code-block:: python

    recorder = dpro.Recorder(model)
    @dpro.profile(recorder)
    def train_one_step(batch): ...

The recorder counts calls of the decorated step function; calls ``warmup`` to
``warmup + steps - 1`` are profiled, then the profiler stops and this rank's part of the
trace is written to the output directory (``dpro profile`` sets it; default
``./dpro_traces``): by a backend that can defer it (PyTorch), after the calls timed after
the window or at exit, so that no step waits for the export (``DPRO_DEFER_WRITE=0``: at
once, inside the window's last call). Outside the window
a call costs one counter increment and a comparison (and in Horovod jobs a clock read:
keeping Horovod's timeline writer parked, dpro.profiler.horovod.writer). The ``after``
calls that follow the window are timed too (two clock reads each) and their wall times
added to the rank's ``meta.json`` (``step_wall_after_us``): the job's settled pace without
the profiler, which `dpro replay` uses to take the profiler's overhead out of its
prediction. Over the same calls the process's and the training thread's CPU time are
added (``cpu_after_us``; two more clock reads each): what the other threads — the
communication library's — cost, for the optimizer's CPU-contention model
(dpro.replayer.cpu_contention).
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from dpro.contracts.recording import MetaKey
from dpro.jsonio import read_json, write_json
from dpro.profiler.config import RecordConfig

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


class Backend(Protocol):
    """What a framework integration provides."""

    def start(self) -> None: ...
    def step_begin(self, step: int) -> object: ...
    def step_end(self, step: int, token: object) -> None: ...
    def stop_and_write(self) -> None: ...
    def abort(self) -> None: ...


def _backend_for(model: Any, config: RecordConfig) -> Backend:
    mod = type(model).__module__
    if mod.startswith("torch") or any(c.__module__.startswith("torch.nn") for c in type(model).__mro__):
        from dpro.profiler.pytorch.backend import TorchBackend

        return TorchBackend(model, config)
    if mod.startswith(("keras", "tensorflow", "tf_keras")):
        from dpro.profiler.tensorflow.backend import TFBackend

        return TFBackend(model, config)
    if mod.startswith("mxnet"):
        from dpro.profiler.mxnet.backend import MXNetBackend

        return MXNetBackend(model, config)
    raise TypeError(f"dpro.Recorder: unsupported model type {type(model).__module__}.{type(model).__name__}")


class Recorder:
    """Profiles a window of training steps of ``model`` and writes this rank's trace."""

    def __init__(
        self,
        model: Any,
        *,
        out_dir: str | None = None,
        warmup: int | None = None,
        steps: int | None = None,
    ) -> None:
        self.config = RecordConfig.resolve(out_dir, warmup, steps)
        self.calls = 0
        self.step_wall_us: list[float] = []
        self.done = False
        #: wall µs of the calls after the window while they are being timed, else None
        self._after: list[float] | None = None
        #: CPU µs of the process and of the calling thread over those calls
        self._cpu_after = [0.0, 0.0]
        self._lock = threading.Lock()
        #: the window is stopped but its trace not yet exported (``defer_write``)
        self._unwritten = False
        self._backend: Backend | None = None
        if self.config.problem:
            log.error("dpro: recording disabled: %s (the training goes on unprofiled)", self.config.problem)
        if self.config.enabled:
            try:
                self._backend = _backend_for(model, self.config)
            except TypeError:
                raise
            except Exception as e:  # noqa: BLE001 - profiling must never break training
                log.error("dpro: recording disabled: %s: %s", type(e).__name__, e)
        if self._backend is None:
            self.done = True
        #: called before every step: keeps Horovod's timeline writer parked (horovod.writer)
        self._tick: Callable[[], None] | None = getattr(self._backend, "keep_parked", None)
        atexit.register(self._at_exit)

    @property
    def window(self) -> range:
        return range(self.config.warmup, self.config.warmup + self.config.steps)

    def _stop(self, what: str, e: BaseException) -> None:
        """Recording failed (e.g. an unwritable trace directory, a full disk): say why,
        once, and leave the training to run unprofiled."""
        self.done = True
        self._after = None
        log.error("dpro: recording stopped: could not %s: %s: %s (the training goes on unprofiled)",
                  what, type(e).__name__, e)
        if self._backend is not None:
            try:
                self._backend.abort()
            except Exception:  # noqa: BLE001 - never break the training job
                log.debug("dpro: abort after a failure failed too", exc_info=True)

    def _begin(self) -> tuple[int, object] | None:
        i = self.calls
        self.calls += 1
        if self.done:
            return None
        if i < self.config.warmup:
            self._warmup_edge(i, begin=True)
            return None
        assert self._backend is not None
        try:
            if i == self.config.warmup:
                self._backend.start()
            return i, self._backend.step_begin(i)
        except Exception as e:  # noqa: BLE001 - never break the training job
            self._stop("start profiling" if i == self.config.warmup else f"profile step {i}", e)
            return None

    def _warmup_edge(self, i: int, begin: bool) -> None:
        """A warm-up call begins or ends: the backend's ``warmup_call`` hook, if it has one
        (TensorFlow: a throwaway profiler session before the window, ``DPRO_TF_PRIME_STEPS``)."""
        hook = getattr(self._backend, "warmup_call", None)
        if hook is None or self.done:
            return
        try:
            hook(i, begin)
        except Exception as e:  # noqa: BLE001 - never break the training job
            self._stop(f"prepare the window in warm-up step {i}", e)

    def _end(self, state: tuple[int, object] | None, failed: bool) -> None:
        if state is None:
            if 0 < self.calls <= self.config.warmup:
                self._warmup_edge(self.calls - 1, begin=False)
            return
        i, token = state
        assert self._backend is not None
        try:
            self._backend.step_end(i, token)
        except Exception as e:  # noqa: BLE001 - never break the training job
            self._stop(f"profile step {i}", e)
            return
        if failed or i == self.window.stop - 1:
            self.done = True
            if not failed and self._defers():
                # stop now; export after the calls timed after the window (or at exit), so
                # that no step of the job waits for the trace to be written
                try:
                    self._backend.stop()  # type: ignore[attr-defined]
                except Exception as e:  # noqa: BLE001 - never break the training job
                    self._stop("stop profiling", e)
                    return
                self._unwritten = True
                self._after = [] if self.config.after > 0 else None
                return
            try:
                self._backend.stop_and_write()
            except Exception as e:  # noqa: BLE001 - never break the training job
                self._stop(f"write the trace to {self.config.out_dir}", e)
                return
            if not failed and self.config.after > 0 and getattr(self._backend, "meta_path", None) is not None:
                self._after = []

    def _defers(self) -> bool:
        """Whether the trace is exported after the window rather than in its last call."""
        b = self._backend
        return self.config.defer_write and callable(getattr(b, "stop", None)) and callable(getattr(b, "write", None))

    def _flush(self) -> bool:
        """Export a stopped window not yet written (deferred); False if that failed."""
        if not self._unwritten:
            return True
        self._unwritten = False
        assert self._backend is not None
        try:
            self._backend.write()  # type: ignore[attr-defined]
        except Exception as e:  # noqa: BLE001 - never break the training job
            self._stop(f"write the trace to {self.config.out_dir}", e)
            return False
        return True

    def _after_step(self, wall_us: float, process_us: float, thread_us: float) -> None:
        assert self._after is not None
        self._after.append(wall_us)
        self._cpu_after[0] += process_us
        self._cpu_after[1] += thread_us
        if len(self._after) >= self.config.after:
            self._write_after()

    def _write_after(self) -> None:
        """Add the timed calls after the window to the rank's meta.json (then stop timing)."""
        walls, self._after = self._after, None
        if not self._flush():
            return
        path = getattr(self._backend, "meta_path", None)
        if not walls or path is None:
            return
        try:
            meta = read_json(path)
            meta[MetaKey.STEP_WALL_AFTER_US] = walls
            meta[MetaKey.CPU_AFTER_US] = {"process": self._cpu_after[0], "thread": self._cpu_after[1], "calls": len(walls)}
            write_json(path, meta)
        except Exception as e:  # noqa: BLE001 - never break the training job
            log.warning("dpro: could not add the steps after the window to %s: %s", path, e)

    def wrap(self, fn: F) -> F:
        """``fn`` (the training step) run under the recorder: warm-up calls, the profiled
        window, then the timed calls after it; the job's own result is returned unchanged."""
        @functools.wraps(fn)
        def step(*args: Any, **kwargs: Any) -> Any:
            if self._tick is not None:
                self._tick()
            if self.done:
                if self._after is None:
                    return fn(*args, **kwargs)
                p0, c0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
                out = fn(*args, **kwargs)
                t1 = time.perf_counter()
                self._after_step((t1 - t0) * 1e6, (time.process_time() - p0) * 1e6, (time.thread_time() - c0) * 1e6)
                return out
            state = self._begin()
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            except BaseException:
                self._end(state, failed=True)
                raise
            # wall time of every call up to the window's end, warm-up included: the
            # unprofiled pace the profiler's overhead is measured against
            self.step_wall_us.append((time.perf_counter() - t0) * 1e6)
            if self._backend is not None:
                self._backend.step_wall_us = self.step_wall_us  # type: ignore[attr-defined]
            self._end(state, failed=False)
            return out

        return step  # type: ignore[return-value]

    def _at_exit(self) -> None:
        if self._after is not None:
            self._write_after()
        self._flush()
        if self.done:
            return
        if self.calls <= self.config.warmup:
            log.warning(
                "dpro: the profiled step function ran %d time(s), but profiling starts after %d warm-up "
                "step(s): nothing was recorded (call it more often or lower the warm-up)",
                self.calls, self.config.warmup,
            )
            self.done = True
            return
        log.warning("dpro: the job ended inside the profiling window: writing the %d step(s) recorded",
                    self.calls - self.config.warmup)
        try:
            self.close()
        except Exception as e:  # noqa: BLE001
            log.error("dpro: could not write the trace: %s", e)

    def close(self) -> None:
        """Write what was recorded if the window did not complete (called at exit)."""
        if self._after is not None:
            self._write_after()
        self._flush()
        if not self.done and self._backend is not None and self.calls > self.config.warmup:
            self.done = True
            self._backend.stop_and_write()


def profile(recorder: Recorder) -> Callable[[F], F]:
    """Decorator: profile the decorated training-step function with ``recorder``."""
    if not isinstance(recorder, Recorder):
        raise TypeError("dpro.profile(recorder): expected a dpro.Recorder")
    return recorder.wrap
