"""The raw recording of `dpro profile`: what the job's ranks write and the importers read.

`dpro profile` (:mod:`dpro.profiler.launcher`) runs the job with the ``ENV_*`` variables
below set; the recorder in each process (:mod:`dpro.profiler`) writes its part into the
recording directory (``ENV_TRACE_DIR``), which ends up in ``OUTPUT/raw``
(:data:`RAW_DIR`); :mod:`dpro.importers.recording` turns that directory into a gTrace.
One recording directory holds:

* ``rank<r>.json.gz`` (:func:`rank_trace_name`): the rank's trace: a torch.profiler Chrome
  trace (PyTorch), a ``{"format": TF_RANK_FORMAT, ...}`` document (TensorFlow,
  :class:`TFRankKey`) or an ``mx.profiler`` Chrome trace (MXNet);
* ``rank<r>.meta.json`` (:func:`rank_meta_name`): what the recorder knows besides the
  trace (:class:`MetaKey`);
* ``rank<r>.xplane.pb`` (TensorFlow): the TF profiler's own output, kept as recorded;
* ``horovod_timeline.json`` (:data:`TIMELINE_NAME`, Horovod jobs, rank 0's host);
* ``server<i>.kv.json`` (:func:`server_file_name`, MXNet parameter servers, :class:`ServerKey`);
* ``nccl/nccl_rank*.jsonl`` (:data:`NCCL_DIR`, when dpro's NCCL profiler plugin was loaded).

Every name here is used by both sides; nested structures are documented where they are
written (:mod:`dpro.profiler.pytorch.backend`, :mod:`dpro.profiler.tensorflow.backend`,
:mod:`dpro.profiler.mxnet.backend`, :mod:`dpro.profiler.mxnet.server`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# ----------------------------------------------------------------------------- environment

#: where each rank writes its part of the recording (`dpro profile` sets it; default ``./dpro_traces``)
ENV_TRACE_DIR = "DPRO_TRACE_DIR"
#: calls of the step function before the profiling window
ENV_WARMUP = "DPRO_WARMUP"
#: calls of the step function profiled
ENV_STEPS = "DPRO_STEPS"
#: calls timed after the window (the unprofiled pace, ``MetaKey.STEP_WALL_AFTER_US``)
ENV_AFTER_STEPS = "DPRO_AFTER_STEPS"
#: the host name recorded (default: the machine's)
ENV_HOST = "DPRO_HOST"
#: ``1``/``true``/``yes``: the recorder records nothing
ENV_DISABLE = "DPRO_DISABLE"
#: ``1``/``true``/``yes``: time the model's blocks compiled after the window (``--measure-compile``)
ENV_MEASURE_COMPILE = "DPRO_MEASURE_COMPILE"
#: seconds the compile measurement may take per rank
ENV_COMPILE_BUDGET_S = "DPRO_COMPILE_BUDGET_S"
#: ``1``/``true``/``yes``: MXNet turns operator bulking off in the window, so that every op of
#: the block is its own event (``dpro profile --mxnet-unbulk``; default: bulking kept, the
#: job runs as unprofiled and a bulked segment is one ``ImperativeBulk`` op)
ENV_MXNET_UNBULK = "DPRO_MXNET_UNBULK"
#: the old opt-in to keep bulking (``--mxnet-keep-bulking``), now the default: accepted, no effect
ENV_MXNET_KEEP_BULKING = "DPRO_MXNET_KEEP_BULKING"
#: ``1``/``0``: torch.profiler records every op's input shapes (``dpro profile --shapes``;
#: layer shapes for `dpro oracle`, collective sizes of old PyTorch versions)
ENV_RECORD_SHAPES = "DPRO_RECORD_SHAPES"
#: ``1``/``0``: the profiler records every allocation and free (``dpro profile --memory``;
#: the allocation-based memory estimates, docs/memory.md)
ENV_PROFILE_MEMORY = "DPRO_PROFILE_MEMORY"
#: TensorFlow: the host tracer's level in the window (default 2: every executor op; 1 keeps
#: only the ops TF deems expensive, so the DFG loses ops)
ENV_TF_HOST_TRACER_LEVEL = "DPRO_TF_HOST_TRACER_LEVEL"
#: TensorFlow's device tracer level in the window (default: 1 where TF sees a GPU, else 0)
ENV_TF_DEVICE_TRACER_LEVEL = "DPRO_TF_DEVICE_TRACER_LEVEL"
#: ``1``: keep TF's graph collection on through the window (default: off from the window's
#: start once the step function's graphs were collected in the warm-up)
ENV_TF_COLLECT_IN_WINDOW = "DPRO_TF_COLLECT_IN_WINDOW"
#: TensorFlow: run a throwaway profiler session over the last N warm-up calls (at most the
#: warm-up less its first call), glibc's heaps kept from then to the window's end (default 4;
#: ``0``: none; docs/fidelity.md "TF + Horovod at 4 workers, and where the window's faults start")
ENV_TF_PRIME_STEPS = "DPRO_TF_PRIME_STEPS"
#: diagnostic (#31): ``0`` runs the TF recorder with everything but TF's profiler (no throwaway
#: session, no window session; the rank's trace then holds no events): what the profiler
#: itself costs, against the rest of the recorder (Horovod's timeline, the step TraceMes)
ENV_TF_PROFILER = "DPRO_TF_PROFILER"
#: ``0``: write the trace when the window ends, inside the last profiled call (default
#: ``1``: after the calls timed after the window, or at exit: off the profiled steps)
ENV_DEFER_WRITE = "DPRO_DEFER_WRITE"
#: ``0``/``false``/``no``: Horovod's timeline writer is idled but not parked between uses;
#: ``outside``: parked outside the profiling window only (default: inside it too, where it
#: holds no lock; dpro/profiler/horovod/writer.py)
ENV_HOROVOD_PARK = "DPRO_HOROVOD_PARK"
#: torch recorder: ``1`` opens the layer ranges with ``record_function`` (the cost before #31)
#: instead of torch's C++ range (dpro/profiler/pytorch/backend.py)
ENV_SLOW_LAYERS = "DPRO_SLOW_LAYERS"
#: ``1``/``true``/``yes``: PyTorch models on CUDA: the window's first step is recorded with CPU
#: operators and layers (the structure), the others with the CUDA activity alone (kernels,
#: copies, runtime calls: the timing), far cheaper (``dpro profile --cuda-light``;
#: :func:`light_trace_name`, ``MetaKey.CUDA_LIGHT``)
ENV_CUDA_LIGHT = "DPRO_CUDA_LIGHT"
#: ``1``/``0``: PyTorch models on the CPU: the window's first step is recorded with
#: torch.profiler (the structure), the others by Python hooks alone (step, layer, DDP bucket
#: and optimizer step times: the timing), far cheaper; or every step by torch.profiler. Unset: on for a
#: model on the CPU, but not with Horovod or recorded allocations (``dpro profile
#: --[no-]cpu-light``; ``MetaKey.CPU_LIGHT``)
ENV_CPU_LIGHT = "DPRO_CPU_LIGHT"
#: ``1``/``0``: PyTorch ranks other than 0 stop torch.profiler after the window's first call
#: (rank 0 records the whole window), or not; the replay takes those ranks' later steps from
#: rank 0's (``MetaKey.SHALLOW``). Unset: only for a DDP model over every rank on a host that
#: runs more ranks than it has cores (docs/profiling.md "Shallow ranks").
ENV_SHALLOW_RANKS = "DPRO_SHALLOW_RANKS"
#: dpro's NCCL profiler plugin library to load (default: the one built in native/nccl_patch)
ENV_NCCL_PLUGIN = "DPRO_NCCL_PLUGIN"
#: where the NCCL plugin writes (read by the plugin, native/nccl_patch)
ENV_NCCL_TRACE_DIR = "DPRO_NCCL_TRACE_DIR"
#: Horovod's own: where its timeline goes; `dpro profile` sets it to :data:`HOROVOD_TIMELINE_DYNAMIC`
ENV_HOROVOD_TIMELINE = "HOROVOD_TIMELINE"
#: the recorder starts Horovod's timeline for the profiling window only
HOROVOD_TIMELINE_DYNAMIC = "DYNAMIC"

# ----------------------------------------------------------------------------- files

#: where `dpro profile` keeps the recording, inside its output gTrace directory
RAW_DIR = "raw"
RANK_PREFIX = "rank"
#: a rank's trace
TRACE_SUFFIX = ".json.gz"
#: a rank's metadata
META_SUFFIX = ".meta.json"
#: a TensorFlow rank's profiler output
XPLANE_SUFFIX = ".xplane.pb"
RANK_TRACE_GLOB = f"{RANK_PREFIX}*{TRACE_SUFFIX}"
RANK_META_GLOB = f"{RANK_PREFIX}*{META_SUFFIX}"
#: the Horovod timeline `dpro profile` asks Horovod to write in the recording directory
TIMELINE_NAME = "horovod_timeline.json"
#: an MXNet parameter server's update timing
SERVER_PREFIX = "server"
SERVER_SUFFIX = ".kv.json"
SERVER_GLOB = f"{SERVER_PREFIX}*{SERVER_SUFFIX}"
#: the NCCL plugin's output directory and files
NCCL_DIR = "nccl"
NCCL_TRACE_GLOB = "nccl_rank*.jsonl"


def env_flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the switch ``name`` is on in ``environ`` (default ``os.environ``): ``1``,
    ``true`` or ``yes``, any case, spaces around ignored."""
    env = os.environ if environ is None else environ
    return env.get(name, "").strip().lower() in ("1", "true", "yes")


def rank_stem(rank: int) -> str:
    """``rank<r>``: the stem of every file of rank ``r``."""
    return f"{RANK_PREFIX}{rank}"


def rank_trace_name(rank: int) -> str:
    """``rank<r>.json.gz``."""
    return f"{RANK_PREFIX}{rank}{TRACE_SUFFIX}"


#: a rank's CUDA-only trace of the window's light steps (``DPRO_CUDA_LIGHT``): a torch.profiler
#: Chrome trace like ``rank<r>.json.gz``, named outside its glob (and outside ``*.json.gz``,
#: so that a Kineto import of the directory does not take it for another rank)
LIGHT_SUFFIX = ".light.gz"


def light_trace_name(rank: int) -> str:
    """``rank<r>.light.gz``: the light steps' trace of rank ``r``."""
    return f"{RANK_PREFIX}{rank}{LIGHT_SUFFIX}"


def rank_meta_name(rank: int) -> str:
    """``rank<r>.meta.json``."""
    return f"{RANK_PREFIX}{rank}{META_SUFFIX}"


def rank_xplane_name(rank: int) -> str:
    """``rank<r>.xplane.pb``."""
    return f"{RANK_PREFIX}{rank}{XPLANE_SUFFIX}"


def server_file_name(rank: int) -> str:
    """``server<i>.kv.json``."""
    return f"{SERVER_PREFIX}{rank}{SERVER_SUFFIX}"


# ----------------------------------------------------------------------------- contents

#: ``format`` / ``version`` of a PyTorch or TensorFlow rank's meta.json (MXNet writes neither)
META_FORMAT = "dpro-rank-meta"
META_VERSION = 1
#: ``format`` / ``version`` of a TensorFlow rank's trace
TF_RANK_FORMAT = "dpro-tf-rank"
TF_RANK_VERSION = 1
#: the kinds of a TensorFlow event (``TFRankKey.EVENTS``): an op, or the two halves of an
#: asynchronous kernel (its Start on the executor thread, its Done where it completed)
TF_EVENT_OP = "op"
TF_EVENT_START = "start"
TF_EVENT_DONE = "done"
#: ``MetaKey.FRAMEWORK`` values
FRAMEWORK_PYTORCH = "pytorch"
FRAMEWORK_TENSORFLOW = "tensorflow"
FRAMEWORK_MXNET = "mxnet"
#: version of the memory facts (``MetaKey.MEMORY``; the importers keep them under the same key
#: in a node's DFG ``meta``, docs/memory.md)
MEMORY_VERSION = 1
#: the kinds of static storage the memory facts count (``memory["static"]``)
MEMORY_STATIC_KINDS = ("params", "grads", "optimizer_state", "buffers")

#: torch.profiler annotations the PyTorch recorder adds: each module's forward and each DDP bucket's
#: all-reduce (read by :mod:`dpro.importers.kineto`)
LAYER_PREFIX = "dpro.layer::"
BUCKET_PREFIX = "dpro.bucket::"
#: the range torch's optimizers open around each ``step()`` (``Optimizer.step#SGD.step``)
OPTIMIZER_STEP_PREFIX = "Optimizer.step#"
#: the annotation around each profiled call (torch.profiler's own step marker's name)
TORCH_STEP_PREFIX = "ProfilerStep#"


class MetaKey:
    """Top-level keys of ``rank<r>.meta.json``."""

    FORMAT = "format"
    VERSION = "version"
    #: ``pytorch``, ``tensorflow`` or ``mxnet``: which importer reads the recording
    FRAMEWORK = "framework"
    FRAMEWORK_VERSION = "framework_version"
    RANK = "rank"
    WORLD_SIZE = "world_size"
    #: the communication library (``gloo``, ``nccl``, ``horovod``, ``grpc``...)
    LIBRARY = "library"
    HOST = "host"
    #: the profiled calls (PyTorch, TensorFlow: their numbers; MXNet: ``{step, ts, dur}`` each)
    STEPS = "steps"
    #: the trainable parameters (PyTorch, TensorFlow: ``{name, shape, dtype, bytes, requires_grad}``
    #: each; MXNet: their names)
    PARAMS = "params"
    #: static memory facts (PyTorch, MXNet; version :data:`MEMORY_VERSION`)
    MEMORY = "memory"
    #: eager vs compiled times of the model's blocks (``--measure-compile``)
    COMPILE = "compile"
    #: wall µs of each call of the step function, warm-up and window
    STEP_WALL_US = "step_wall_us"
    #: wall µs of the calls after the window (added by the recorder once they ran)
    STEP_WALL_AFTER_US = "step_wall_after_us"
    #: CPU µs of the process and the training thread over those calls
    CPU_AFTER_US = "cpu_after_us"
    #: the rank's CPUs and the computation's threads
    CPU = "cpu"
    #: thread id of Horovod's timeline writer, idled by the recorder, or null
    HOROVOD_WRITER_THREAD = "horovod_writer_thread"
    #: Horovod's fusion settings the job ran with (the environment variables set)
    HOROVOD_SETTINGS = "horovod_settings"
    # PyTorch
    DDP = "ddp"
    #: DDP buckets: ``{index, bytes, params}`` each
    BUCKETS = "buckets"
    # TensorFlow
    MODEL = "model"
    # MXNet
    KVSTORE = "kvstore"
    NUM_SERVERS = "num_servers"
    BIGARRAY_BOUND = "bigarray_bound"
    PID = "pid"
    #: kvstore keys: ``{key, name, bytes, shape, dtype, calls}`` each
    KEYS = "keys"
    #: the hybridized block's symbol (``tojson()``)
    SYMBOL = "symbol"
    #: how the window ran the job differently from the user's steps, or null
    WINDOW_CHANGES_JOB = "window_changes_job"
    #: PyTorch light mode (``ENV_CUDA_LIGHT``): ``{"structure_step": i, "steps": [...], "trace":
    #: light_trace_name(r)}``: the steps recorded CUDA-only, in :func:`light_trace_name`
    CUDA_LIGHT = "cuda_light"
    #: PyTorch CPU-light mode (``ENV_CPU_LIGHT``): ``{"structure_step": i, "steps": [...],
    #: "unix_minus_clock_us": x, "anchors": [[[name, start_us, end_us], ...] per light step]}``
    #: (the anchors' clock plus x is Unix time): the times of the step, each layer's forward,
    #: each DDP bucket's hook and all-reduce (``comm#k``: the hook's call to the collective's
    #: completion) and each optimizer step in the steps recorded without torch.profiler, on
    #: one monotonic clock (dpro.importers.kineto.cpu_light)
    CPU_LIGHT = "cpu_light"
    #: ``ENV_SHALLOW_RANKS`` on a rank other than 0: ``{"deep_steps": [first window call]}``:
    #: its profiler recorded that call only; the importer times its other window steps from
    #: rank 0's (:func:`dpro.importers.recording.shallow.fill_shallow_steps`)
    SHALLOW = "shallow"


class TFRankKey:
    """Top-level keys of a TensorFlow rank's ``rank<r>.json.gz``."""

    FORMAT = "format"
    VERSION = "version"
    RANK = "rank"
    CLOCK = "clock"
    #: step number -> ``[ts, dur]`` (µs)
    STEPS = "steps"
    #: ``[node, op type, thread, ts, dur, kind]`` each
    EVENTS = "events"
    #: the executed partition graphs: lists of ``{name, op, inputs, control}``
    GRAPHS = "graphs"
    #: Horovod op names in creation order
    HOROVOD_OPS = "horovod_ops"


class ServerKey:
    """Top-level keys of an MXNet parameter server's ``server<i>.kv.json``."""

    FRAMEWORK = "framework"
    ROLE = "role"
    RANK = "rank"
    NUM_WORKERS = "num_workers"
    HOST = "host"
    PID = "pid"
    WARMUP = "warmup"
    STEPS = "steps"
    COLUMNS = "columns"
    #: ``[key, call, ts_call, ts_merged, ts_end, bytes]`` each
    UPDATES = "updates"
