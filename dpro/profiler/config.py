"""How a recording is configured: arguments, else the environment `dpro profile` sets."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from dpro.contracts.recording import (
    ENV_AFTER_STEPS,
    ENV_DISABLE,
    ENV_HOST,
    ENV_MEASURE_COMPILE,
    ENV_STEPS,
    ENV_TRACE_DIR,
    ENV_WARMUP,
)

DEFAULT_WARMUP = 5
DEFAULT_STEPS = 5
#: calls timed after the window: the settled unprofiled pace (dpro.graph.overhead)
DEFAULT_AFTER = 20
DEFAULT_OUT = "dpro_traces"


@dataclass(frozen=True)
class RecordConfig:
    """The profiling window and where each rank writes its part."""

    out_dir: Path
    warmup: int = DEFAULT_WARMUP
    steps: int = DEFAULT_STEPS
    host: str = ""
    enabled: bool = True
    after: int = DEFAULT_AFTER

    @classmethod
    def resolve(cls, out_dir: str | os.PathLike | None, warmup: int | None, steps: int | None) -> "RecordConfig":
        """Arguments win over the environment, which wins over the defaults."""
        env = os.environ
        w = warmup if warmup is not None else int(env.get(ENV_WARMUP, DEFAULT_WARMUP))
        n = steps if steps is not None else int(env.get(ENV_STEPS, DEFAULT_STEPS))
        if w < 0 or n < 1:
            raise ValueError(f"dpro: need warmup >= 0 and steps >= 1 (got warmup={w}, steps={n})")
        out = Path(out_dir if out_dir is not None else env.get(ENV_TRACE_DIR, DEFAULT_OUT))
        return cls(
            out_dir=out,
            warmup=w,
            steps=n,
            host=env.get(ENV_HOST) or socket.gethostname(),
            enabled=env.get(ENV_DISABLE, "") not in ("1", "true", "yes"),
            after=max(0, int(env.get(ENV_AFTER_STEPS, DEFAULT_AFTER))),
        )


def measure_compile_enabled() -> bool:
    """Whether the job asked the ranks to time their blocks compiled after the window
    (``dpro profile --measure-compile``: :mod:`dpro.profiler.pytorch.compile_probe`,
    :mod:`dpro.profiler.tensorflow.compile_probe`)."""
    return os.environ.get(ENV_MEASURE_COMPILE, "") in ("1", "true", "yes")
