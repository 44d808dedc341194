"""PyTorch integration of the Recorder: torch.profiler, layer annotations, DDP buckets.

What one rank writes into the output directory at the end of the window:

* ``rank<r>.json.gz`` — the torch.profiler Chrome trace of the window (CPU, and CUDA when
  the model is on a GPU), shapes recorded, each profiled call wrapped in a
  ``ProfilerStep#<i>`` annotation and each module's forward in ``dpro.layer::<path>``;
* ``rank<r>.meta.json`` — parameters (name, shape, dtype, bytes), DDP buckets (index,
  parameter names, bytes), optimizer-independent facts (versions, host, world size).

With ``DPRO_CUDA_LIGHT`` (:attr:`RecordConfig.cuda_light`) and a model on CUDA, the first
profiled call is recorded as above (the structure: op names, layers, which op launched which
kernel), then that profiler is stopped and a second one with the CUDA activity alone records
the window's other calls into ``rank<r>.light.gz`` (every kernel and copy and the runtime call
that launched it: the timing, without torch.profiler's per-op CPU cost); the switch runs
between two calls, outside the time the recorder measures of each.
:mod:`dpro.importers.kineto.light` puts the two together.

For a model on the CPU (CPU-light mode, the default there unless allocations are recorded or
the job runs Horovod; ``DPRO_CPU_LIGHT=0``: :attr:`RecordConfig.cpu_light` off), the first
profiled call is recorded as above too; then torch.profiler is stopped and the window's other
calls are timed by the recorder's hooks alone (layers, DDP buckets and their all-reduces,
optimizer steps: :mod:`dpro.profiler.pytorch.anchors`, into the meta's ``cpu_light``);
:mod:`dpro.importers.kineto.cpu_light` puts the two together.

DDP buckets are recorded by a communication hook that wraps DDP's default all-reduce and
notes, for each bucket, its parameters; it costs one Python call per bucket per step.
"""

from __future__ import annotations

import gzip
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dpro.contracts.recording import (
    BUCKET_PREFIX,
    ENV_SLOW_LAYERS,
    FRAMEWORK_PYTORCH,
    LAYER_PREFIX,
    META_FORMAT,
    META_VERSION,
    TORCH_STEP_PREFIX,
    MetaKey,
    env_flag,
    light_trace_name,
    rank_meta_name,
    rank_trace_name,
)
from dpro.jsonio import write_json
from dpro.profiler.config import RecordConfig, measure_compile_enabled
from dpro.profiler.horovod.runtime import WindowTimeline, settings_from_env
from dpro.profiler.pytorch.anchors import AnchorLog
from dpro.profiler.pytorch.compile_probe import CompileProbe
from dpro.profiler.pytorch.memory import MemoryWatch

log = logging.getLogger(__name__)

#: how torch exports a ``_RecordFunctionFast`` range (its category is cpu_op, not
#: user_annotation); the export's lines ``"cat": "cpu_op",`` then ``"name": "dpro.layer::...``
_FAST_CAT, _ANNOT_CAT = b'"cat": "cpu_op",', b'"cat": "user_annotation",'
_LAYER_NAME = b'"name": "' + LAYER_PREFIX.encode()


def fast_range() -> Any | None:
    """torch's C++ profiler range (``torch._C._profiler._RecordFunctionFast``, torch >= 2.2):
    ~2-5 us to open and close against ~20-60 us for ``record_function`` (a dispatcher op
    and a Python object per call), or None where this torch lacks it."""
    try:
        from torch._C._profiler import _RecordFunctionFast
    except ImportError:
        return None
    return _RecordFunctionFast


def copy_trace(fin: Any, fout: Any, relabel: bool) -> int:
    """Copy torch's Chrome-trace export line by line; with ``relabel``, a layer range
    exported as ``cpu_op`` (:func:`fast_range`) gets ``user_annotation``, as
    ``record_function`` writes it, which is what the importer reads as a layer. Returns how
    many were relabelled."""
    n = 0
    prev: bytes | None = None
    for line in fin:
        if relabel and prev is not None and line.lstrip().startswith(_LAYER_NAME) and prev.strip() == _FAST_CAT:
            prev = prev.replace(_FAST_CAT, _ANNOT_CAT)
            n += 1
        if prev is not None:
            fout.write(prev)
        prev = line
    if prev is not None:
        fout.write(prev)
    return n



def _export(prof: Any, dest: Path, relabel: bool, raw: Path | None = None) -> None:
    """Export a stopped torch.profiler session's Chrome trace to ``dest``, gzipped (through
    :func:`copy_trace`), or the one it exported to ``raw`` already; no half-written file is
    left behind on failure."""
    with tempfile.TemporaryDirectory(prefix="dpro-") as tmp:
        if raw is None:
            raw = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(raw))
        part = dest.parent / f".{dest.name}.part"
        try:
            with raw.open("rb") as fin, gzip.open(part, "wb", compresslevel=6) as fout:
                copy_trace(fin, fout, relabel)
            os.replace(part, dest)
        except BaseException:
            part.unlink(missing_ok=True)  # e.g. a full disk: leave no half-written file
            raise


def _rank_world() -> tuple[int, int, str | None]:
    """(rank, world size, communication library) from torch.distributed, Horovod or the env."""
    import sys

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), str(dist.get_backend())
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None:
        try:
            return int(hvd.rank()), int(hvd.size()), "horovod"
        except ValueError:  # imported but not initialised
            pass
    env = os.environ
    if "HOROVOD_RANK" in env:
        return int(env["HOROVOD_RANK"]), int(env.get("HOROVOD_SIZE", 1)), "horovod"
    return int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), None


def _cpus() -> list[int]:
    """The CPUs this process may run on (its affinity set)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


#: attribute of a DDP model that holds dpro's comm hook's :class:`_HookTarget`
_HOOK_ATTR = "_dpro_comm_hook_target"


@dataclass
class _HookTarget:
    """The recorder backend dpro's DDP comm hook reports to (the model's latest one)."""

    backend: Any


class TorchBackend:
    """Records one rank of a PyTorch job."""

    def __init__(self, model: Any, config: RecordConfig) -> None:
        self.config = config
        self.model = model
        #: where this rank's meta.json went (the recorder adds the steps after the window)
        self.meta_path: Path | None = None
        self.inner = getattr(model, "module", model)
        self.names = {id(p): n for n, p in self.inner.named_parameters()}
        self.buckets: dict[int, dict] = {}
        self.active = False
        self.prof: Any = None
        #: light mode (``config.cuda_light``, model on CUDA): the CUDA-only session of the
        #: window's later calls, and the call numbers it recorded
        self.light = False
        self.light_prof: Any = None
        self.light_steps: list[int] = []
        #: where the structure step's session was exported at the switch (light mode)
        self._struct_tmp: tempfile.TemporaryDirectory | None = None
        #: CPU-light mode (``config.cpu_light``, model on the CPU): whether it is on, and the
        #: light steps' anchors once the structure step is recorded
        self.cpu_light = False
        self.anchors: AnchorLog | None = None
        #: shallow ranks (:meth:`_shallow_wanted`) on a rank other than 0: the profiler was
        #: stopped after the window's first call
        self.shallow = False
        self.hooks: list[Any] = []
        self.steps: list[int] = []
        self.memory = MemoryWatch(model)
        self.compile_probe = CompileProbe(self.inner) if measure_compile_enabled() else None
        if self.compile_probe is not None:
            self.compile_probe.start()  # before the window: its input copies are not profiled
        self._install_comm_hook()
        self.timeline = WindowTimeline("horovod.torch")

    # ---------------------------------------------------------------- DDP buckets
    def _install_comm_hook(self) -> None:
        """Wrap DDP's all-reduce to name each bucket in the trace. DDP takes one comm hook per
        model and cannot drop it, so the hook is registered once and follows the model's latest
        recorder (:class:`_HookTarget`): a second ``dpro.Recorder`` on the same model (another
        window in the same job) gets its buckets too."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        if not isinstance(self.model, DDP):
            return
        target = getattr(self.model, _HOOK_ATTR, None)
        if isinstance(target, _HookTarget):  # dpro's hook from an earlier recorder: repoint it
            target.backend = self
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        target = _HookTarget(self)

        def dpro_allreduce_hook(state, bucket):  # no annotations: DDP checks them
            backend = target.backend
            if not backend.active:
                return default_hooks.allreduce_hook(state, bucket)
            anchors = backend.anchors
            if anchors is not None:  # a CPU-light step: the hook's and the collective's times only
                anchors.enter(f"{BUCKET_PREFIX}{bucket.index()}")
                fut = default_hooks.allreduce_hook(state, bucket)
                anchors.exit()
                return anchors.comm(fut)
            idx = bucket.index()
            if idx not in backend.buckets:
                buf = bucket.buffer()
                backend.buckets[idx] = {
                    "index": idx,
                    "bytes": buf.numel() * buf.element_size(),
                    "params": [backend.names.get(id(p), "?") for p in bucket.parameters()],
                }
            with torch.profiler.record_function(f"{BUCKET_PREFIX}{idx}"):
                return default_hooks.allreduce_hook(state, bucket)

        try:
            self.model.register_comm_hook(None, dpro_allreduce_hook)
        except RuntimeError as e:  # the job's own hook is registered: buckets come from the trace only
            log.warning("dpro: cannot register the DDP bucket hook (%s); bucket membership will be unknown", e)
            return
        setattr(self.model, _HOOK_ATTR, target)

    # ---------------------------------------------------------------- layers
    def _install_layer_hooks(self) -> None:
        stack: list[Any] = []
        fast = None if env_flag(ENV_SLOW_LAYERS) else fast_range()
        self._fast_layers = fast is not None
        make = fast if fast is not None else torch.profiler.record_function
        anchors = self.anchors

        def pre(mod: Any, args: Any, name: str) -> None:
            if anchors is not None:
                anchors.enter(name)
                return
            rf = make(name)
            rf.__enter__()
            stack.append(rf)

        def post(mod: Any, args: Any, out: Any) -> None:
            if anchors is not None:
                anchors.exit()
            elif stack:
                stack.pop().__exit__(None, None, None)

        # Every module but the model itself: an op belongs to the innermost one that ran it
        # (ops in a container's own forward, e.g. a residual add or a functional attention,
        # belong to the container; recomputation checkpoints containers).
        for name, mod in self.inner.named_modules():
            if name:
                self.hooks.append(mod.register_forward_pre_hook(lambda m, a, n=LAYER_PREFIX + name: pre(m, a, n)))
                self.hooks.append(mod.register_forward_hook(post))

    def _remove_layer_hooks(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks.clear()

    def keep_parked(self) -> None:
        """Between steps: keep Horovod's timeline writer parked (dpro.profiler.horovod.writer)."""
        self.timeline.keep_parked()

    # ---------------------------------------------------------------- window
    def start(self) -> None:
        """Start torch.profiler (and the memory watch) for the window."""
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU]
        on_cuda = self._on_cuda()
        if on_cuda:
            acts.append(ProfilerActivity.CUDA)
        self.light = self.config.cuda_light and on_cuda and self.config.steps > 1
        # auto (None): on, unless the allocations are recorded (the memory estimates analyse
        # the window's steps after its first: dpro.importers.recording.allocations) or the job
        # runs Horovod (its main thread's waits for the all-reduces have no anchor: placed by
        # scaling, they miss the timeline's collectives, which the what-if then reads as host
        # work; docs/fidelity.md "CPU-light")
        want = (self.config.cpu_light if self.config.cpu_light is not None
                else not self.config.profile_memory and _rank_world()[2] != "horovod")
        self.cpu_light = want and not on_cuda and self.config.steps > 1
        if self.config.cpu_light and not self.cpu_light:
            log.warning("dpro: DPRO_CPU_LIGHT needs a model on the CPU (on CUDA: DPRO_CUDA_LIGHT) and a window of "
                        "2 steps or more: every step is recorded with its CPU operators")
        if self.config.cuda_light and not self.light:
            log.warning("dpro: DPRO_CUDA_LIGHT needs a model on CUDA and a window of 2 steps or more: "
                        "every step is recorded with its CPU operators")
        if self.light:
            # no kernel of the warm-up still running when the structure step starts: the
            # importer would leave that step out as the capture's warm-up (one sync, untimed)
            torch.cuda.synchronize()
        self._install_layer_hooks()
        self.timeline.start(self.config.out_dir, self.config.steps, len(self.names), _rank_world()[1])
        self.memory.start()
        # op identity, order and durations always; shapes and allocations when asked
        # (DPRO_RECORD_SHAPES / DPRO_PROFILE_MEMORY: docs/profiling.md "What it costs")
        self.prof = profile(activities=acts, record_shapes=self.config.record_shapes,
                            profile_memory=self.config.profile_memory)
        self.prof.start()
        self.active = True

    def _on_cuda(self) -> bool:
        """Whether the model runs on CUDA (the profiler then records the CUDA activity)."""
        return torch.cuda.is_available() and any(p.is_cuda for p in self.inner.parameters())

    def step_begin(self, step: int) -> object:
        self.steps.append(step)
        if self.anchors is not None:
            self.anchors.begin_step(step)
            return None
        if self.light_prof is not None:
            self.light_steps.append(step)
        rf = torch.profiler.record_function(f"{TORCH_STEP_PREFIX}{step}")
        rf.__enter__()
        return rf

    def step_end(self, step: int, token: object) -> None:
        if self.anchors is not None:
            self.anchors.end_step()
            return
        token.__exit__(None, None, None)  # type: ignore[attr-defined]
        if self.light and self.light_prof is None and len(self.steps) == 1 and self.config.steps > 1:
            self._go_light()
        elif self.cpu_light and len(self.steps) == 1:
            self._go_cpu_light()
        elif (not self.light and not self.shallow and len(self.steps) == 1 and self.config.steps > 1
              and _rank_world()[0] != 0 and self._shallow_wanted()):
            self._go_shallow()

    def _shallow_wanted(self) -> bool:
        """``config.shallow_ranks``; where unset (auto), whether the model is DDP over every
        rank (data parallel: all ranks run the same ops) and this host runs more ranks than
        it has cores (``LOCAL_WORLD_SIZE``, set by torchrun, against ``os.cpu_count()``): there
        each rank's per-op recording takes cores from the others and the synchronous step
        waits for the slowest (docs/profiling.md "Shallow ranks")."""
        if self.config.shallow_ranks is not None:
            return self.config.shallow_ranks
        from torch.nn.parallel import DistributedDataParallel as DDP

        if not isinstance(self.model, DDP):
            return False
        try:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
            world = _rank_world()[1]
            group = self.model.process_group.size() if self.model.process_group is not None else world
        except (ValueError, RuntimeError, AttributeError):
            return False
        return group == world and local > (os.cpu_count() or local)

    def _go_shallow(self) -> None:
        """Shallow ranks (:meth:`_shallow_wanted`), between two calls: stop this rank's
        profiler after the window's first call; its later calls run unrecorded."""
        self._remove_layer_hooks()
        self.prof.stop()
        self.shallow = True

    def _go_light(self) -> None:
        """After the structure step (between two calls, outside their timing): stop the
        CPU + CUDA session and start the CUDA-only one for the window's other calls."""
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()  # the structure step's kernels all end inside its session
        self._remove_layer_hooks()  # the layers are known from the structure step
        self.prof.stop()
        # Exported now, not after the window: a torch.profiler session started later wipes
        # the CUDA events of one stopped before it (an H100 with torch 2.11: every runtime
        # call, kernel and copy of the structure step exported at ts 0, dur 0). Between two
        # calls, outside the time the recorder measures; gzipped in :meth:`write`.
        self._struct_tmp = tempfile.TemporaryDirectory(prefix="dpro-")
        self.prof.export_chrome_trace(str(Path(self._struct_tmp.name) / "trace.json"))
        self.light_prof = profile(activities=[ProfilerActivity.CUDA])
        self.light_prof.start()

    def _go_cpu_light(self) -> None:
        """After the structure step (between two calls, outside the recorder's timing of
        each): stop torch.profiler and time the window's other calls by the hooks. Its
        session is exported after the window, with the full window's (:meth:`write`): no
        other session starts in between."""
        self._remove_layer_hooks()
        self.prof.stop()
        self.anchors = AnchorLog()
        self._install_layer_hooks()  # now timing the layers on the anchors' clock
        self.hooks += self.anchors.optimizer_hooks()

    def _stop(self) -> None:
        self.active = False
        self.memory.stop()
        if self.compile_probe is not None:
            self.compile_probe.stop()
        self._remove_layer_hooks()
        if self.light_prof is not None:
            torch.cuda.synchronize()  # the last step's kernels end inside the session
            self.light_prof.stop()
        elif self.prof is not None and not self.shallow and self.anchors is None:
            self.prof.stop()
        self.timeline.stop()

    def abort(self) -> None:
        try:
            self._stop()
        except Exception:  # noqa: BLE001
            pass
        self._drop_sessions()

    def stop(self) -> None:
        """End the window: stop the profiler (its events stay in memory until :meth:`write`)."""
        self._stop()
        self._who = _rank_world()  # while the process group is still up

    def stop_and_write(self) -> None:
        """Stop the profiler and write this rank's raw files (Kineto trace, meta)."""
        self.stop()
        self.write()

    def write(self) -> None:
        """Write this rank's raw files (Kineto trace, meta) of the stopped window."""
        rank, world, backend = getattr(self, "_who", None) or _rank_world()
        out = self.config.out_dir
        out.mkdir(parents=True, exist_ok=True)
        struct = Path(self._struct_tmp.name) / "trace.json" if self._struct_tmp is not None else None
        _export(self.prof, out / rank_trace_name(rank), getattr(self, "_fast_layers", False), struct)
        light = None
        if self.light_prof is not None:
            _export(self.light_prof, out / light_trace_name(rank), False)
            light = {"structure_step": self.steps[0], "steps": list(self.light_steps),
                     "trace": light_trace_name(rank)}
        cpu_light = None
        if self.anchors is not None and self.anchors.steps:
            done = self.anchors.steps
            cpu_light = {"structure_step": self.steps[0], "steps": self.anchors.numbers[:len(done)],
                         "unix_minus_clock_us": self.anchors.unix_offset_us,
                         "anchors": [[[n, round(a, 3), round(b, 3)] for n, a, b in s] for s in done]}
        params = [
            {"name": n, "shape": list(p.shape), "dtype": str(p.dtype).replace("torch.", ""),
             "bytes": p.numel() * p.element_size(), "requires_grad": p.requires_grad}
            for n, p in self.inner.named_parameters()
        ]
        compiled = {}
        if self.compile_probe is not None:
            log.warning("dpro: rank %d measuring its blocks under torch.compile (--measure-compile)", rank)
            compiled = self.compile_probe.measure()
        self.meta_path = out / rank_meta_name(rank)
        write_json(self.meta_path, {
            MetaKey.FORMAT: META_FORMAT,
            MetaKey.VERSION: META_VERSION,
            MetaKey.FRAMEWORK: FRAMEWORK_PYTORCH,
            MetaKey.FRAMEWORK_VERSION: torch.__version__,
            MetaKey.RANK: rank,
            MetaKey.WORLD_SIZE: world,
            MetaKey.LIBRARY: backend,
            MetaKey.HOST: self.config.host,
            MetaKey.STEPS: self.steps,
            MetaKey.DDP: type(self.model).__name__ == "DistributedDataParallel",
            MetaKey.PARAMS: params,
            MetaKey.BUCKETS: [self.buckets[k] for k in sorted(self.buckets)],
            MetaKey.MEMORY: self.memory.facts([self.buckets[k] for k in sorted(self.buckets)]),
            **({MetaKey.COMPILE: compiled} if compiled else {}),
            # the rank's CPUs and the computation's threads (dpro.replayer.cpu_contention)
            MetaKey.CPU: {"cores": len(cpus := _cpus()), "affinity": cpus, "threads": torch.get_num_threads()},
            # wall µs of each call of the step function, warm-up and window (dpro.graph.overhead)
            MetaKey.STEP_WALL_US: list(getattr(self, "step_wall_us", [])),
            # Horovod's timeline writer, moved to idle priority (dpro.profiler.horovod.writer)
            MetaKey.HOROVOD_WRITER_THREAD: self.timeline.writer_tid,
            # the fusion settings it ran with (dpro.optimizer: Horovod's default is the job's own grouping)
            **({MetaKey.HOROVOD_SETTINGS: settings_from_env()} if backend == "horovod" else {}),
            # light mode: the calls recorded CUDA-only, and where (dpro.importers.kineto.light)
            **({MetaKey.CUDA_LIGHT: light} if light is not None else {}),
            # CPU-light mode: the later steps' hook times (dpro.importers.kineto.cpu_light)
            **({MetaKey.CPU_LIGHT: cpu_light} if cpu_light is not None else {}),
            # shallow rank (DPRO_SHALLOW_RANKS): the calls its profiler recorded (dpro.importers.recording.shallow)
            **({MetaKey.SHALLOW: {"deep_steps": self.steps[:1]}} if self.shallow else {}),
        })
        log.info("dpro: rank %d wrote its trace to %s", rank, out)
        self._drop_sessions()

    def _drop_sessions(self) -> None:
        self.prof = self.light_prof = None
        self.anchors = None
        if self._struct_tmp is not None:
            self._struct_tmp.cleanup()
            self._struct_tmp = None
