"""How a recording is configured: arguments, else the environment `dpro profile` sets."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from dpro.contracts.recording import (
    ENV_AFTER_STEPS,
    ENV_CPU_LIGHT,
    ENV_CUDA_LIGHT,
    ENV_DEFER_WRITE,
    ENV_DISABLE,
    ENV_HOST,
    ENV_MEASURE_COMPILE,
    ENV_PROFILE_MEMORY,
    ENV_RECORD_SHAPES,
    ENV_SHALLOW_RANKS,
    ENV_STEPS,
    ENV_TF_HOST_TRACER_LEVEL,
    ENV_TF_PRIME_STEPS,
    ENV_TRACE_DIR,
    ENV_WARMUP,
    env_flag,
)

DEFAULT_WARMUP = 5
DEFAULT_STEPS = 5
#: calls timed after the window: the settled unprofiled pace (dpro.graph.overhead)
DEFAULT_AFTER = 20
DEFAULT_OUT = "dpro_traces"
#: what the profiler records beyond op identity, order and durations when not asked
#: (``DPRO_RECORD_SHAPES`` / ``DPRO_PROFILE_MEMORY``; docs/profiling.md "What it costs")
DEFAULT_RECORD_SHAPES = False
DEFAULT_PROFILE_MEMORY = False
#: TensorFlow: warm-up calls under a throwaway profiler session before the window (at most the
#: warm-up less its first call; docs/fidelity.md "TF + Horovod at 4 workers, and where the
#: window's faults start")
DEFAULT_TF_PRIME_STEPS = 4


@dataclass(frozen=True)
class RecordConfig:
    """The profiling window and where each rank writes its part."""

    out_dir: Path
    warmup: int = DEFAULT_WARMUP
    steps: int = DEFAULT_STEPS
    host: str = ""
    enabled: bool = True
    after: int = DEFAULT_AFTER
    #: every op's input shapes (layer shapes for `dpro oracle`)
    record_shapes: bool = DEFAULT_RECORD_SHAPES
    #: every allocation and free (allocation-based memory estimates)
    profile_memory: bool = DEFAULT_PROFILE_MEMORY
    #: export the trace after the calls timed after the window (or at exit), not inside the window's last call
    defer_write: bool = True
    #: TensorFlow's host tracer level in the window
    tf_host_tracer_level: int = 2
    #: TensorFlow: calls at the warm-up's end run under a throwaway profiler session, glibc's
    #: heaps kept from then to the window's end (``DPRO_TF_PRIME_STEPS``; 0: none)
    tf_prime_steps: int = DEFAULT_TF_PRIME_STEPS
    #: PyTorch on CUDA: CPU operators in the window's first step only, CUDA activity alone in
    #: the others (``DPRO_CUDA_LIGHT``, ``dpro profile --cuda-light``; docs/profiling.md)
    cuda_light: bool = False
    #: PyTorch on the CPU: torch.profiler in the window's first step only, the others timed by
    #: the recorder's hooks alone (``DPRO_CPU_LIGHT``, ``dpro profile --[no-]cpu-light``);
    #: None: on for a model on the CPU unless ``profile_memory`` or Horovod (the recorder decides)
    cpu_light: bool | None = None
    #: PyTorch: ranks other than 0 stop the profiler after the window's first call
    #: (``DPRO_SHALLOW_RANKS``; dpro/contracts/recording.py); None: where the host runs more
    #: ranks of a data-parallel DDP model than it has cores (the recorder decides)
    shallow_ranks: bool | None = None
    #: why recording is off although not disabled on purpose (a bad ``DPRO_*`` value)
    problem: str | None = None

    @classmethod
    def resolve(cls, out_dir: str | os.PathLike | None, warmup: int | None, steps: int | None) -> "RecordConfig":
        """Arguments win over the environment, which wins over the defaults.

        Bad arguments raise ValueError (a bug in the calling code); a bad ``DPRO_*``
        environment value turns recording off with a ``problem`` that says why, so the
        training job itself goes on.
        """
        env = os.environ
        problems: list[str] = []
        if (warmup is not None and warmup < 0) or (steps is not None and steps < 1):
            raise ValueError(f"dpro: need warmup >= 0 and steps >= 1 (got warmup={warmup}, steps={steps})")
        w = warmup if warmup is not None else _env_int(ENV_WARMUP, DEFAULT_WARMUP, 0, problems)
        n = steps if steps is not None else _env_int(ENV_STEPS, DEFAULT_STEPS, 1, problems)
        after = _env_int(ENV_AFTER_STEPS, DEFAULT_AFTER, 0, problems)
        shapes = _env_bool(ENV_RECORD_SHAPES, DEFAULT_RECORD_SHAPES, problems)
        memory = _env_bool(ENV_PROFILE_MEMORY, DEFAULT_PROFILE_MEMORY, problems)
        defer = _env_bool(ENV_DEFER_WRITE, True, problems)
        light = _env_bool(ENV_CUDA_LIGHT, False, problems)
        cpu_light = _env_bool(ENV_CPU_LIGHT, None, problems)
        shallow = _env_bool(ENV_SHALLOW_RANKS, None, problems)
        tf_level = _env_int(ENV_TF_HOST_TRACER_LEVEL, 2, 1, problems)
        if tf_level > 3:
            problems.append(f"{ENV_TF_HOST_TRACER_LEVEL}={tf_level} is outside 1..3")
            tf_level = 2
        tf_prime = _env_int(ENV_TF_PRIME_STEPS, DEFAULT_TF_PRIME_STEPS, 0, problems)
        raw_out = out_dir if out_dir is not None else env.get(ENV_TRACE_DIR, DEFAULT_OUT)
        if not str(raw_out) or "\0" in str(raw_out):
            problems.append(f"{ENV_TRACE_DIR}={str(raw_out)!r} is not a directory name")
            raw_out = DEFAULT_OUT
        host = env.get(ENV_HOST) or socket.gethostname()
        if not host.isprintable() or len(host) > 255:
            problems.append(f"{ENV_HOST}={host[:40]!r} is not a host name")
            host = socket.gethostname()
        return cls(
            out_dir=Path(raw_out),
            warmup=w,
            steps=n,
            host=host,
            enabled=not env_flag(ENV_DISABLE, env) and not problems,
            after=after,
            record_shapes=shapes,
            profile_memory=memory,
            defer_write=defer,
            tf_host_tracer_level=tf_level,
            tf_prime_steps=tf_prime,
            cuda_light=light,
            cpu_light=cpu_light,
            shallow_ranks=shallow,
            problem="; ".join(problems) or None,
        )


#: the most steps a window (or the calls timed after it) may span: more is a typo
MAX_STEPS = 10**6


def _env_int(name: str, default: int, minimum: int, problems: list[str]) -> int:
    """``int(os.environ[name])`` checked to lie in ``minimum..MAX_STEPS``; else ``default``,
    with the problem added to ``problems``."""
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return default
    try:
        v = int(text.strip())
    except ValueError:
        problems.append(f"{name}={text[:40]!r} is not an integer")
        return default
    if not minimum <= v <= MAX_STEPS:
        problems.append(f"{name}={v} is outside {minimum}..{MAX_STEPS}")
        return default
    return v


def _env_bool(name: str, default: bool | None, problems: list[str]) -> bool | None:
    """``1/true/yes`` or ``0/false/no`` in ``os.environ[name]``; else ``default`` (a
    different value is added to ``problems``)."""
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return default
    if env_flag(name):
        return True
    if text in ("0", "false", "no"):
        return False
    problems.append(f"{name}={text[:40]!r} is not 0 or 1")
    return default


def measure_compile_enabled() -> bool:
    """Whether the job asked the ranks to time their blocks compiled after the window
    (``dpro profile --measure-compile``: :mod:`dpro.profiler.pytorch.compile_probe`,
    :mod:`dpro.profiler.tensorflow.compile_probe`)."""
    return env_flag(ENV_MEASURE_COMPILE)
