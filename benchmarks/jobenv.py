"""The job settings every benchmark harness runs its training jobs with (one place).

A CPU-only distributed job on a small machine repeats within a few % only if each rank
keeps to its share of the cores. :data:`SETTINGS` names the candidate settings;
:data:`DEFAULT` is the one the harnesses use (benchmarks/overhead.py, benchmarks/noise.py;
the what-if and oracle harnesses import it too). A setting is applied to a command by
:meth:`JobSettings.apply`: environment variables for every process of the job, and, with
``pin``, each training rank started through benchmarks/pinned.py, which binds it to core
``rank % cores`` before running the script.

    import jobenv
    cmd = jobenv.default_for("hvd").apply(cmd)   # env ... [pinned.py] script ...
    env = {**os.environ, **jobenv.DEFAULT.env()}

Profiled and unprofiled runs must use the same setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PINNED = HERE / "pinned.py"

def is_rank_script(arg: str) -> bool:
    """A training script whose processes are the job's ranks: a ``.py`` under examples/."""
    return arg.endswith(".py") and "examples" in Path(arg).parts


def thread_env(n: int) -> dict[str, str]:
    """``n`` compute threads per process in every framework's pools (OpenMP, MKL, OpenBLAS,
    MXNet's engine, TF's intra/inter-op pools)."""
    s = str(n)
    return {"OMP_NUM_THREADS": s, "MKL_NUM_THREADS": s, "OPENBLAS_NUM_THREADS": s,
            "MXNET_CPU_WORKER_NTHREADS": s, "MXNET_OMP_MAX_THREADS": s,
            "TF_NUM_INTRAOP_THREADS": s, "TF_NUM_INTEROP_THREADS": s}


#: glibc's malloc with its mmap threshold fixed at 32 MiB (its largest) and the heap never
#: trimmed. Left to itself glibc raises the threshold to the size of the first large block a
#: process frees: a run where that happened early takes its 25 MB gradient buffers from the
#: heap, a run where it did not maps and faults them in again every step (a 2-rank DDP mlp on
#: the 2-core VM: 1.1 M minor faults in 60 steps and 80 ms a step, against 0.3 M and 70 ms).
#: torch.profiler's own allocations raise it, so a profiled run is always the fast kind
#: (docs/whatif.md, session 30). Fixed, every run is.
HEAP_ENV = ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824")


@dataclass(frozen=True)
class JobSettings:
    """Environment for every process of a job, and whether each rank is pinned to a core."""

    name: str
    env_vars: tuple[tuple[str, str], ...] = ()
    pin: bool = False
    notes: str = field(default="", compare=False)

    def env(self) -> dict[str, str]:
        return dict(self.env_vars)

    def script(self, script: str | Path) -> list[str]:
        """How to name the rank script in a launcher's command: ``[pinned.py, script]`` with
        ``pin`` (the launcher runs pinned.py with the job's python), else ``[script]``."""
        return [str(PINNED), str(script)] if self.pin else [str(script)]

    def apply(self, cmd: list[str]) -> list[str]:
        """``cmd`` with the environment set (``env K=V ...`` in front) and, with ``pin``, the
        last training script in it (a ``.py`` under examples/) run through pinned.py."""
        out = list(cmd)
        found = [i for i, a in enumerate(out) if is_rank_script(a)]
        if found:  # the last: a launcher under examples/ (launch_local.py) comes before its script
            out[found[-1]:found[-1] + 1] = self.script(out[found[-1]])
        return ["env", *[f"{k}={v}" for k, v in self.env_vars], *out] if self.env_vars else out


SETTINGS: dict[str, JobSettings] = {
    s.name: s for s in (
        JobSettings("none", notes="what the launchers do on their own"),
        JobSettings("threads1", tuple(thread_env(1).items()), notes="one compute thread per process"),
        JobSettings("pin", (), pin=True, notes="each rank bound to core rank % cores"),
        JobSettings("threads1pin", tuple(thread_env(1).items()), pin=True,
                    notes="one compute thread per process, each rank bound to core rank % cores"),
        JobSettings("threads1heap", (*thread_env(1).items(), HEAP_ENV),
                    notes="one compute thread per process, glibc's mmap threshold fixed (HEAP_ENV)"),
        JobSettings("threads1pinheap", (*thread_env(1).items(), HEAP_ENV), pin=True,
                    notes="threads1pin, glibc's mmap threshold fixed (HEAP_ENV)"),
    )
}
#: what the harnesses use (the figures: docs/fidelity.md "Profiling overhead", benchmarks/noise.py)
DEFAULT = SETTINGS["threads1pin"]
#: torch DDP: not pinned. Pinning made no difference to its repeatability, and a pinned rank's
#: trace says 1 core (``meta.json`` ``cpu.cores`` = its affinity), which the replay's CPU
#: contention model (dpro.replayer.cpu_contention) shared among the host's ranks (fixed in
#: 992fc6d: the union of the host's ranks' affinity sets; not re-measured pinned).
DDP = SETTINGS["threads1"]


def default_for(path: str) -> JobSettings:
    """The harnesses' setting for a job of ``path`` (``ddp``, ``hvd``, ``tf``, ``mx``, ...)."""
    return DDP if path == "ddp" else DEFAULT


def parse_variants(text: str) -> dict[str, dict[str, str]]:
    """Named environment variants of a job, as the harnesses' ``--variants`` give them:
    ``'lean=,full=A=1+B=1'`` -> {"lean": {}, "full": {"A": "1", "B": "1"}}."""
    out: dict[str, dict[str, str]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, env = part.partition("=")
        out[name] = dict(kv.split("=", 1) for kv in env.split("+") if kv)
    return out
