"""The strategy-file contract: the files `dpro optimize -o DIR` writes
(:mod:`dpro.optimizer.output`) and a training script reads (:mod:`dpro.apply`), and the
keys both sides use. What each file holds: docs/optimizer.md, "Applying a strategy"."""

# ---------------------------------------------------------------- files in DIR

#: the summary `dpro optimize` prints
SUMMARY_TXT = "summary.txt"
#: everything (the `dpro optimize --json` output)
STRATEGY_JSON = "strategy.json"
#: PyTorch DDP: ``bucket_cap_mb`` (+ the buckets it gives), or ``keep_default``
DDP_JSON = "ddp.json"
#: Horovod: explicit ``groups`` of parameter names, fusion threshold, cycle time, or ``keep_default``
HOROVOD_JSON = "horovod.json"
#: Horovod's settings as ``NAME=value`` lines (environment variables)
HOROVOD_ENV = "horovod.env"
#: MXNet kvstore (parameter-server jobs): the bigarray bound and the keys it splits
MXNET_JSON = "mxnet.json"
#: the bound as a ``NAME=value`` line
MXNET_ENV = "mxnet.env"
#: op fusion: the modules to ``torch.compile``, or XLA of a TensorFlow job's gradient computation
COMPILE_JSON = "compile.json"
#: memory: modules to checkpoint, micro-batches per step, predicted peak
MEMORY_JSON = "memory.json"
#: mixed precision: forward and loss under autocast
AMP_JSON = "amp.json"

# ---------------------------------------------------------------- keys

#: ddp.json, horovod.json, mxnet.json: true where dpro keeps the library's default
KEEP_DEFAULT = "keep_default"
#: ddp.json: DDP's ``bucket_cap_mb`` (MiB)
BUCKET_CAP_MB = "bucket_cap_mb"
#: horovod.json: lists of parameter names, one per fused group (None: Horovod's default)
GROUPS = "groups"
#: horovod.json and horovod.env: Horovod's environment variables (bytes; ms)
HOROVOD_FUSION_THRESHOLD = "HOROVOD_FUSION_THRESHOLD"
HOROVOD_CYCLE_TIME = "HOROVOD_CYCLE_TIME"
#: mxnet.json and mxnet.env: MXNet's environment variable (elements)
MXNET_KVSTORE_BIGARRAY_BOUND = "MXNET_KVSTORE_BIGARRAY_BOUND"
#: memory.json: module names to checkpoint (recompute in backward)
CHECKPOINT_MODULES = "checkpoint_modules"
#: memory.json: micro-batches per step (gradient accumulation; 1 = none)
ACCUMULATION_STEPS = "accumulation_steps"
#: amp.json: run forward and loss under ``torch.autocast``
AUTOCAST = "autocast"
#: compile.json (TensorFlow): compile the gradient computation with XLA
XLA_JIT_COMPILE = "xla_jit_compile"
#: compile.json (PyTorch): modules to ``torch.compile`` (``""``: the whole model)
TORCH_COMPILE_MODULES = "torch_compile_modules"
#: every file but the summary: the iteration time dpro predicts with the strategy (µs)
PREDICTED_ITERATION_US = "predicted_iteration_us"


def env_lines(settings: dict[str, object], names: tuple[str, ...]) -> str:
    """``NAME=value`` lines (a ``.env`` file) of ``names`` in ``settings``."""
    return "".join(f"{k}={settings[k]}\n" for k in names)


#: the variables each ``.env`` file sets
HOROVOD_ENV_VARS = (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME)
MXNET_ENV_VARS = (MXNET_KVSTORE_BIGARRAY_BOUND,)
