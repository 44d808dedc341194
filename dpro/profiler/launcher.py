"""`dpro profile`: run a training command with the recorder configured, then collect."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dpro.contracts.recording import (
    ENV_HOROVOD_TIMELINE,
    ENV_MEASURE_COMPILE,
    ENV_MXNET_UNBULK,
    ENV_PROFILE_MEMORY,
    ENV_RECORD_SHAPES,
    ENV_NCCL_PLUGIN,
    ENV_NCCL_TRACE_DIR,
    ENV_STEPS,
    ENV_TRACE_DIR,
    ENV_WARMUP,
    HOROVOD_TIMELINE_DYNAMIC,
    NCCL_DIR,
    RAW_DIR,
    TIMELINE_NAME,
)
from dpro.errors import DproInputError
from dpro.gtrace.io import write_gtrace
from dpro.importers.recording import collect, rank_files

log = logging.getLogger(__name__)


@dataclass
class ProfileOutcome:
    returncode: int
    ranks: int
    out: Path | None
    message: str


def command_line(args: list[str]) -> list[str]:
    """``train.py ...`` runs with this Python; anything else runs as given."""
    if not args:
        raise DproInputError(None, "no command to run (dpro profile -o DIR -- python train.py ...)")
    if args[0].endswith(".py"):
        return [sys.executable, *args]
    return list(args)


def check_output_dir(out: Path, force: bool) -> None:
    """Refuse, before running anything, an output that exists and is not empty (unless force)."""
    if out.exists() and not out.is_dir():
        raise DproInputError(out, "already exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise DproInputError(out, "already exists and is not empty (use --force to replace it)")
    parent = out.resolve().parent
    if parent.exists() and not os.access(parent, os.W_OK):
        raise DproInputError(out, "cannot write here (permission denied)")


def user_timeline(cmd: list[str], env: dict[str, str]) -> Path | None:
    """Where the job's Horovod timeline goes if the user chose (horovodrun option or environment)."""
    for i, a in enumerate(cmd):
        if a == "--timeline-filename" and i + 1 < len(cmd):
            return Path(cmd[i + 1])
        if a.startswith("--timeline-filename="):
            return Path(a.split("=", 1)[1])
    v = env.get(ENV_HOROVOD_TIMELINE, "")
    return Path(v) if v and v.upper() != HOROVOD_TIMELINE_DYNAMIC else None


def keep_timeline(src: Path | None, raw: Path, since: float) -> None:
    """Copy a user-placed Horovod timeline written by this job into the recording dir."""
    dest = raw / TIMELINE_NAME
    if src is None or dest.exists():
        return
    try:
        if src.is_file() and src.stat().st_mtime >= since - 1.0:
            shutil.copyfile(src, dest)
    except OSError as e:
        log.warning("dpro: cannot copy the Horovod timeline %s: %s", src, e)


def run_job(cmd: list[str], env: dict[str, str]) -> int:
    """Run the job with inherited stdio; forward SIGINT/SIGTERM; return its exit code."""
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as e:
        raise DproInputError(cmd[0], f"cannot run: {e.strerror or e}") from None
    old = {s: signal.signal(s, lambda n, f: proc.send_signal(n)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)


NCCL_PLUGIN_NAME = "libnccl-profiler-dpro.so"


def nccl_plugin_library() -> Path | None:
    """dpro's NCCL profiler plugin (``DPRO_NCCL_PLUGIN``, else built in native/nccl_patch)."""
    if os.environ.get(ENV_NCCL_PLUGIN):
        return Path(os.environ[ENV_NCCL_PLUGIN])
    built = Path(__file__).resolve().parents[2] / "native" / "nccl_patch" / "build" / NCCL_PLUGIN_NAME
    return built if built.is_file() else None


def nccl_plugin_env(env: dict[str, str], raw: Path) -> None:
    """Load dpro's NCCL plugin into jobs that use NCCL (harmless for others: only NCCL reads it).

    Left alone when the user already set ``NCCL_PROFILER_PLUGIN`` or the plugin is not built.
    """
    lib = nccl_plugin_library()
    if lib is None or env.get("NCCL_PROFILER_PLUGIN"):
        return
    env["NCCL_PROFILER_PLUGIN"] = str(lib)
    env.setdefault(ENV_NCCL_TRACE_DIR, str(raw.resolve() / NCCL_DIR))


def profile_job(
    args: list[str], out: Path, *, warmup: int, steps: int, force: bool = False, progress: bool | None = None,
    measure_compile: bool = False, mxnet_unbulk: bool = False,
    record_shapes: bool | None = None, profile_memory: bool | None = None,
) -> ProfileOutcome:
    """Run ``args`` with recording on, then write the gTrace to ``out`` (raw traces in out/raw).

    ``measure_compile``: the ranks also time their blocks compiled after the window
    (:mod:`dpro.profiler.pytorch.compile_probe`, :mod:`dpro.profiler.tensorflow.compile_probe`). ``mxnet_unbulk``: MXNet ranks
    turn operator bulking off in the window (default: kept; :mod:`dpro.profiler.mxnet.backend`). ``record_shapes`` /
    ``profile_memory``: record every op's input shapes / every allocation (None: the
    recorder's default, :mod:`dpro.profiler.config`)."""
    cmd = command_line(args)
    check_output_dir(out, force)
    out.resolve().parent.mkdir(parents=True, exist_ok=True)
    raw = Path(tempfile.mkdtemp(dir=out.resolve().parent, prefix=f".{out.name}.raw-"))
    env = dict(os.environ)
    env.update({ENV_TRACE_DIR: str(raw), ENV_WARMUP: str(warmup), ENV_STEPS: str(steps)})
    if measure_compile:
        env[ENV_MEASURE_COMPILE] = "1"
    if mxnet_unbulk:
        env[ENV_MXNET_UNBULK] = "1"
    for name, on in ((ENV_RECORD_SHAPES, record_shapes), (ENV_PROFILE_MEMORY, profile_memory)):
        if on is not None:
            env[name] = "1" if on else "0"
    nccl_plugin_env(env, raw)
    theirs = user_timeline(cmd, env)
    if theirs is None and not env.get(ENV_HOROVOD_TIMELINE):
        env[ENV_HOROVOD_TIMELINE] = HOROVOD_TIMELINE_DYNAMIC
    try:
        started = time.time()
        rc = run_job(cmd, env)
        keep_timeline(theirs, raw, started)
        n = len(rank_files(raw))
        if n == 0:
            why = f"the job exited with code {rc}" if rc else "the job finished"
            msg = (f"{why} but recorded nothing: is dpro.Recorder in the training script, and did the "
                   f"decorated step run more than {warmup} time(s)?")
            return ProfileOutcome(rc or 2, 0, None, msg)
        gt = collect(raw, progress=progress)
        write_gtrace(gt, out, force=force)
        shutil.move(str(raw), out / RAW_DIR)
        msg = f"recorded {n} rank(s), steps {gt.manifest.steps}: wrote {out}"
        if rc:
            msg += f" (the job exited with code {rc}: the trace holds what was recorded before)"
        for note in gt.notes:
            msg += f"\n  note: {note}"
        return ProfileOutcome(rc, n, out, msg)
    finally:
        if raw.exists():
            shutil.rmtree(raw, ignore_errors=True)
