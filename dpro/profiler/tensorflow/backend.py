"""TensorFlow 2 integration of the Recorder: the TF profiler plus the executed graph.

.. code-block:: python

    recorder = dpro.Recorder(model)          # a Keras model
    @dpro.profile(recorder)
    def step(): ...                          # calls a tf.function train step

What one rank writes into the output directory after the window:

* ``rank<r>.xplane.pb`` — the TF profiler's raw output for the window (host tracer);
* ``rank<r>.json.gz`` — ``{"format": "dpro-tf-rank", ...}``: the executor's op events of
  the window (``[node, op type, thread, ts, dur, kind]``, Unix-epoch µs, converted from
  the xplane by :mod:`dpro.importers.xplane`; kind ``op``, or ``start``/``done`` for the
  two halves of an asynchronous kernel), the step windows (a ``dpro_step`` TraceMe
  around each profiled call), and the **graphs TF executed**: every function graph's
  partition graphs after Grappler (nodes with op type, data and control inputs), i.e.
  the ops the trace names, plus the order of the Horovod ops in the pre-optimisation
  graph (their creation order);
* ``horovod_timeline.json`` (rank 0, Horovod jobs) — when ``dpro profile`` set
  ``HOROVOD_TIMELINE=DYNAMIC``, the recorder starts Horovod's timeline for the window only;
* ``rank<r>.meta.json`` — ``"framework": "tensorflow"``, trainable variables (path, shape,
  dtype, bytes), rank, world size, library, versions, host.

The graphs come from TF's graph collection (``context.enable_graph_collection``), which
records a function's graphs when it is instantiated: the recorder switches it on when it
is created, so create it before the step function first runs (otherwise only the trace is
recorded, and the import falls back to a trace-only DFG with a note), and off at the
window's start once the warm-up's graphs are in (``DPRO_TF_COLLECT_IN_WINDOW=1``: at its
end). Converting the xplane in the rank keeps TensorFlow out of ``dpro collect``; it
happens after the window (:meth:`TFBackend.write`, deferred by the recorder), not in its
last call.

``DPRO_TF_PRIME_STEPS=N`` (default 4, ``0`` switches it off): the last ``N`` warm-up calls
(at most the warm-up less its first call) run under a
throwaway profiler session (started before the first of them, stopped after the last, its
output discarded), and glibc's heaps are kept (``M_TOP_PAD``, :class:`HeapKeeper`) from then
to the window's end. What it is for (#31, docs/fidelity.md): with TF's profiler on, the
executor thread's event buffers take the place in its malloc arena where the step's largest
tensor (~28 MB on the convnet) fitted, so from the window's second or third call on that
tensor lands in a fresh heap, which glibc deletes again when the step frees it: ~6900 page
faults per call. The throwaway session's buffers, freed at its stop, leave room of the right
sizes for the window's buffers: in the 2-worker convnet (#31) the window's calls 2-5 then
fault in 10-30 % of the calls, as unprofiled, instead of 90-100 %. Side effect: the warm-up's
last calls are profiled, so the overhead estimate's fallback (:mod:`dpro.graph.overhead`,
warm-up pace against the window's, used only without the calls timed after the window)
sees less of the profiler's cost.

``DPRO_TF_PROFILER=0`` (a diagnostic, #31): everything of the recorder but TF's profiler (no
throwaway session, no window session; the rank's trace then has the graphs and no events),
to tell the profiler's cost from the rest's (benchmarks/overhead.py variants,
docs/fidelity.md session 28).
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from dpro.contracts.recording import (
    ENV_TF_COLLECT_IN_WINDOW,
    ENV_TF_DEVICE_TRACER_LEVEL,
    ENV_TF_PROFILER,
    FRAMEWORK_TENSORFLOW,
    META_FORMAT,
    META_VERSION,
    TF_EVENT_DONE,
    TF_EVENT_OP,
    TF_EVENT_START,
    TF_RANK_FORMAT,
    TF_RANK_VERSION,
    XPLANE_SUFFIX,
    MetaKey,
    TFRankKey,
    env_flag,
    rank_meta_name,
    rank_trace_name,
    rank_xplane_name,
)
from dpro.jsonio import write_json
from dpro.profiler.config import RecordConfig, measure_compile_enabled
from dpro.profiler.horovod.runtime import WindowTimeline, settings_from_env
from dpro.profiler.tensorflow.compile_probe import XlaProbe

log = logging.getLogger(__name__)

STEP_TRACE = "dpro_step"
#: an asynchronous kernel (IteratorGetNext, HorovodAllreduce...) is traced as a Start event on the
#: executor thread and a Done event on the thread that completed it (stats: name, kernel_type)
ASYNC_EVENTS = {"ExecutorState::ProcessAsync::Start": TF_EVENT_START, "ExecutorState::ProcessAsync::Done": TF_EVENT_DONE}
#: tf.data's internal iterator events carry a type but are no graph ops
SKIP_PREFIXES = ("Iterator::",)


class HeapKeeper:
    """glibc's ``M_TOP_PAD`` raised to a per-thread heap's largest size (64 MiB) while kept,
    so that no heap is deleted or shrunk, and set back to glibc's default (128 KiB) after.
    A no-op where the C library is not glibc or the user set glibc's malloc in the
    environment. Side effect of any ``mallopt``: glibc stops adapting its mmap and trim
    thresholds, which keep the values the warm-up gave them."""

    M_TOP_PAD = -2
    DEFAULT_TOP_PAD = 128 * 1024
    KEPT_TOP_PAD = 64 * 1024 * 1024
    USER_ENV = ("MALLOC_TOP_PAD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX",
                "GLIBC_TUNABLES")

    def __init__(self) -> None:
        self.kept = False

    def _mallopt(self, value: int) -> bool:
        if platform.libc_ver()[0] != "glibc" or any(k in os.environ for k in self.USER_ENV):
            return False
        return bool(ctypes.CDLL(None).mallopt(self.M_TOP_PAD, value))

    def keep(self) -> None:
        if not self.kept:
            self.kept = self._mallopt(self.KEPT_TOP_PAD)

    def release(self) -> None:
        if self.kept:
            self.kept = False
            self._mallopt(self.DEFAULT_TOP_PAD)


def rank_world() -> tuple[int, int, str | None]:
    """(rank, world size, communication library) from Horovod, TF_CONFIG or the env."""
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is not None:
        try:
            if hvd.is_initialized():
                return int(hvd.rank()), int(hvd.size()), "horovod"
        except (ValueError, AttributeError):
            pass
    env = os.environ
    if "HOROVOD_RANK" in env:
        return int(env["HOROVOD_RANK"]), int(env.get("HOROVOD_SIZE", 1)), "horovod"
    if "TF_CONFIG" in env:
        import json

        try:
            cfg = json.loads(env["TF_CONFIG"])
            workers = cfg.get("cluster", {}).get("worker", [])
            return int(cfg.get("task", {}).get("index", 0)), max(1, len(workers)), "grpc"
        except (ValueError, TypeError, AttributeError):
            pass
    return int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), None


def _graph_json(gd: Any) -> list[dict]:
    """A GraphDef's nodes: name, op type, data inputs (``node:k``) and control inputs."""
    out = []
    for n in gd.node:
        data = [i for i in n.input if not i.startswith("^")]
        ctrl = [i[1:] for i in n.input if i.startswith("^")]
        out.append({"name": n.name, "op": n.op, "inputs": data, "control": ctrl})
    return out


def _variables(model: Any) -> list[dict]:
    """The model's trainable variables: path, shape, dtype, bytes."""
    out = []
    for v in getattr(model, "trainable_variables", []) or []:
        shape = [int(d) if d is not None else -1 for d in v.shape]
        n = 1
        for d in shape:
            n *= max(d, 0)
        dtype = getattr(v.dtype, "name", str(v.dtype))
        itemsize = int(getattr(v.dtype, "size", 4))
        out.append({"name": str(getattr(v, "path", None) or v.name), "shape": shape, "dtype": dtype,
                    "bytes": n * itemsize, "requires_grad": True})
    return out


class TFBackend:
    """Records one rank of a TensorFlow 2 job."""

    def __init__(self, model: Any, config: RecordConfig) -> None:
        import tensorflow as tf
        from tensorflow.python.eager import context

        self.tf = tf
        #: where this rank's meta.json went (the recorder adds the steps after the window)
        self.meta_path: Path | None = None
        self.config = config
        self.model = model
        self.ctx = context.context()
        self.ctx.enable_graph_collection()
        #: whether TF's graph collection is on (from here to the window's start, or its end)
        self.collecting = True
        self.logdir: str | None = None
        self.steps: list[int] = []
        self.active = False
        #: the graphs TF collected (RunMetadata exported at the window's start and end), and
        #: (rank, world, library) at the window's end (:meth:`stop`)
        self._run_metadata: list[Any] = []
        self._who: tuple[int, int, str | None] | None = None
        #: the throwaway profiler session before the window (``DPRO_TF_PRIME_STEPS``)
        self._prime_dir: str | None = None
        self.heap = HeapKeeper()
        #: TF's profiler runs (``DPRO_TF_PROFILER=0``, a diagnostic: everything else of the recorder only)
        self.profiler_on = os.environ.get(ENV_TF_PROFILER, "1").strip().lower() not in ("0", "false", "no")
        self.timeline = WindowTimeline("horovod.tensorflow")
        self.xla_probe = XlaProbe(model) if measure_compile_enabled() else None
        if self.xla_probe is not None:
            self.xla_probe.start()

    def keep_parked(self) -> None:
        """Between steps: keep Horovod's timeline writer parked (dpro.profiler.horovod.writer)."""
        self.timeline.keep_parked()

    def _take_graphs(self) -> bool:
        """Keep the graphs TF collected so far (it forgets them on export); True if any."""
        md = self.ctx.export_run_metadata()
        if md is None:
            return False
        self._run_metadata.append(md)
        return bool(md.function_graphs) or bool(md.partition_graphs)

    def _device_tracer_level(self) -> int:
        """``DPRO_TF_DEVICE_TRACER_LEVEL``, else 1 where TF sees a GPU and 0 where it sees none."""
        text = os.environ.get(ENV_TF_DEVICE_TRACER_LEVEL, "").strip()
        if text in ("0", "1"):
            return int(text)
        try:
            return 1 if self.tf.config.list_physical_devices("GPU") else 0
        except Exception:  # noqa: BLE001
            return 1

    def _options(self) -> Any:
        return self.tf.profiler.experimental.ProfilerOptions(host_tracer_level=self.config.tf_host_tracer_level,
                                                             python_tracer_level=0,
                                                             device_tracer_level=self._device_tracer_level())

    def prime_steps(self) -> int:
        """Warm-up calls under the throwaway session: ``DPRO_TF_PRIME_STEPS``, at most the
        warm-up less its first call (which instantiates the step function)."""
        return max(0, min(self.config.tf_prime_steps, self.config.warmup - 1))

    def warmup_call(self, i: int, begin: bool) -> None:
        """Warm-up call ``i`` begins / ends: start the throwaway session before the first of
        the last :meth:`prime_steps` warm-up calls, stop and discard it after the last."""
        n = self.prime_steps()
        if n == 0 or not self.profiler_on:
            return
        if begin and i == self.config.warmup - n:
            self.heap.keep()
            self._prime_dir = tempfile.mkdtemp(prefix="dpro-tf-prime-")
            self.tf.profiler.experimental.start(self._prime_dir, options=self._options())
        elif not begin and i == self.config.warmup - 1:
            self._stop_prime()

    def _stop_prime(self) -> None:
        if self._prime_dir is not None:
            d, self._prime_dir = self._prime_dir, None
            try:
                self.tf.profiler.experimental.stop()
            finally:
                shutil.rmtree(d, ignore_errors=True)

    def start(self) -> None:
        """Start TF's profiler for the window; stop collecting graphs if the warm-up's are in."""
        self._stop_prime()  # not stopped if the warm-up's last call failed
        self.logdir = tempfile.mkdtemp(prefix="dpro-tf-")
        if not env_flag(ENV_TF_COLLECT_IN_WINDOW) and self._take_graphs():
            # the step function was instantiated in the warm-up: its graphs are in
            self._stop_collecting()
        opts = self._options()
        self.timeline.start(self.config.out_dir, self.config.steps,
                            len(getattr(self.model, "trainable_variables", []) or []), rank_world()[1])
        if self.profiler_on:
            self.tf.profiler.experimental.start(self.logdir, options=opts)
            self.active = True

    def step_begin(self, step: int) -> object:
        self.steps.append(step)
        tr = self.tf.profiler.experimental.Trace(STEP_TRACE, step_num=step, _r=1)
        tr.__enter__()
        return tr

    def step_end(self, step: int, token: object) -> None:
        token.__exit__(None, None, None)  # type: ignore[attr-defined]

    def _stop(self) -> None:
        try:
            if self.active:
                self.active = False
                self.tf.profiler.experimental.stop()
            self.timeline.stop()
        finally:
            self.heap.release()

    def abort(self) -> None:
        try:
            self._stop_prime()
        except Exception:  # noqa: BLE001
            pass
        try:
            self._stop()
        except Exception:  # noqa: BLE001
            pass
        self._cleanup()

    def _stop_collecting(self) -> None:
        self.collecting = False
        self.ctx.disable_graph_collection()

    def _cleanup(self) -> None:
        try:
            self._stop_collecting()
        except Exception:  # noqa: BLE001
            pass
        if self.logdir:
            shutil.rmtree(self.logdir, ignore_errors=True)
            self.logdir = None

    def _graphs(self) -> tuple[list[list[dict]], list[str]]:
        """Executed partition graphs of every function instantiated up to the window's end
        (exported by :meth:`stop`); Horovod op creation order."""
        mds, self._run_metadata = self._run_metadata, []
        graphs: list[list[dict]] = []
        hvd_order: list[str] = []
        for md in mds:
            for fg in md.function_graphs:
                for pg in fg.partition_graphs:
                    graphs.append(_graph_json(pg))
                for n in fg.pre_optimization_graph.node:
                    if n.op.startswith("Horovod") and n.name not in hvd_order:
                        hvd_order.append(n.name)
            for pg in md.partition_graphs:
                graphs.append(_graph_json(pg))
        return graphs, hvd_order

    def stop(self) -> None:
        """End the window: stop the profiler (it writes its XSpace to a temporary directory),
        take the graphs TF collected and stop collecting; the conversion waits for :meth:`write`."""
        try:
            self._stop()
        finally:
            self._who = rank_world()  # while Horovod is still up
            try:
                if self.collecting:
                    self._take_graphs()  # what was collected in the window
            finally:
                self._stop_collecting()

    def stop_and_write(self) -> None:
        """Stop the profiler, convert its XSpace and write this rank's raw files (ops, graph, meta)."""
        self.stop()
        self.write()

    def write(self) -> None:
        """Convert the stopped window's XSpace and write this rank's raw files (ops, graph, meta)."""
        from dpro.importers.xplane import read_xspace

        try:
            rank, world, library = self._who or rank_world()
            out = self.config.out_dir
            out.mkdir(parents=True, exist_ok=True)
            assert self.logdir is not None
            found = sorted(Path(self.logdir).rglob(f"*{XPLANE_SUFFIX}"))
            if not found and self.profiler_on:
                raise RuntimeError(f"the TF profiler wrote no {XPLANE_SUFFIX} under {self.logdir}")
            xplane = found[-1] if found else None
            events = read_xspace(xplane) if xplane is not None else []
            steps: dict[str, list[float]] = {}
            ops: list[list] = []
            for e in events:
                if e.name == STEP_TRACE and e.stats.get("step_num") is not None:
                    steps[str(int(e.stats["step_num"]))] = [e.ts, e.dur]
                elif e.name in ASYNC_EVENTS and e.stats.get("name"):
                    ops.append([str(e.stats["name"]), str(e.stats.get("kernel_type") or ""), e.thread, e.ts, e.dur,
                                ASYNC_EVENTS[e.name]])
                elif e.op_type and not e.name.startswith(SKIP_PREFIXES):
                    ops.append([e.node or e.name, e.op_type, e.thread, e.ts, e.dur, TF_EVENT_OP])
            graphs, hvd_order = self._graphs()
            if not graphs:
                log.warning("dpro: no TF function graph was collected (was dpro.Recorder created after the step "
                            "function first ran?): the import will build a trace-only DFG")
            if xplane is not None:
                shutil.copyfile(xplane, out / f".{rank_xplane_name(rank)}.part")
                os.replace(out / f".{rank_xplane_name(rank)}.part", out / rank_xplane_name(rank))
            write_json(out / rank_trace_name(rank), {
                TFRankKey.FORMAT: TF_RANK_FORMAT,
                TFRankKey.VERSION: TF_RANK_VERSION,
                TFRankKey.RANK: rank,
                TFRankKey.CLOCK: "unix-epoch-us",
                TFRankKey.STEPS: steps,
                TFRankKey.EVENTS: ops,
                TFRankKey.GRAPHS: graphs,
                TFRankKey.HOROVOD_OPS: hvd_order,
            })
            compiled = {}
            if self.xla_probe is not None:
                log.warning("dpro: rank %d measuring its model under XLA (--measure-compile)", rank)
                compiled = self.xla_probe.measure()
            self.meta_path = out / rank_meta_name(rank)
            write_json(self.meta_path, {
                MetaKey.FORMAT: META_FORMAT,
                MetaKey.VERSION: META_VERSION,
                MetaKey.FRAMEWORK: FRAMEWORK_TENSORFLOW,
                MetaKey.FRAMEWORK_VERSION: self.tf.__version__,
                MetaKey.RANK: rank,
                MetaKey.WORLD_SIZE: world,
                MetaKey.LIBRARY: library,
                MetaKey.HOST: self.config.host,
                MetaKey.STEPS: self.steps,
                MetaKey.MODEL: type(self.model).__name__,
                MetaKey.PARAMS: _variables(self.model),
                **({MetaKey.COMPILE: compiled} if compiled else {}),
                # wall µs of each call of the step function, warm-up and window (dpro.graph.overhead)
                MetaKey.STEP_WALL_US: list(getattr(self, "step_wall_us", [])),
                # Horovod's timeline writer, moved to idle priority (dpro.profiler.horovod.writer)
                MetaKey.HOROVOD_WRITER_THREAD: self.timeline.writer_tid,
                # the fusion settings it ran with (dpro.optimizer: Horovod's default is the job's own grouping)
                **({MetaKey.HOROVOD_SETTINGS: settings_from_env()} if library == "horovod" else {}),
            })
            log.info("dpro: rank %d wrote its trace to %s", rank, out)
        finally:
            self._cleanup()
