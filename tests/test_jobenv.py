"""The benchmark harnesses' job settings (benchmarks/jobenv.py, pinned.py) and boost.py's groups."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "whatif"))
import boost  # noqa: E402
import jobenv  # noqa: E402


def test_apply_sets_env_and_pins_the_rank_script_not_the_launcher():
    cmd = ["py", "examples/mxnet/launch_local.py", "-n", "2", "--", "examples/mxnet/train_ps.py", "--model", "mlp"]
    out = jobenv.SETTINGS["threads1pin"].apply(cmd)
    assert out[0] == "env" and "OMP_NUM_THREADS=1" in out and "MXNET_CPU_WORKER_NTHREADS=1" in out
    i = out.index("examples/mxnet/train_ps.py")
    assert out[i - 1] == str(jobenv.PINNED) and "examples/mxnet/launch_local.py" in out[:i - 1]
    assert jobenv.SETTINGS["none"].apply(cmd) == cmd
    assert jobenv.SETTINGS["threads1"].apply(cmd)[-len(cmd):] == cmd


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable cores")
def test_pinned_binds_each_rank_to_its_core(tmp_path):
    script = tmp_path / "show.py"
    script.write_text("import os, sys\nprint(sorted(os.sched_getaffinity(0)), sys.argv[1:], __name__)\n")
    cores = sorted(os.sched_getaffinity(0))
    for var, rank in (("RANK", 1), ("HOROVOD_RANK", 2), ("PINNED_INDEX", 3)):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "HOROVOD_RANK", "PINNED_INDEX")}
        out = subprocess.run([sys.executable, str(jobenv.PINNED), str(script), "--x", "1"], env={**env, var: str(rank)},
                             capture_output=True, text=True, check=True).stdout
        assert out.strip() == f"[{cores[rank % len(cores)]}] ['--x', '1'] __main__"
    out = subprocess.run([sys.executable, str(jobenv.PINNED), str(script)], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith(str(cores))  # no rank: unpinned


def _autogroup(pid: int | str) -> tuple[str, int]:
    group, _, nice = Path(f"/proc/{pid}/autogroup").read_text().split()
    return group, int(nice)


def _autogroup_on() -> bool:
    """Autogroup scheduling on and readable here (some CI containers show an empty file)."""
    try:
        _autogroup("self")
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except (OSError, ValueError):
        return False


@pytest.mark.skipif(not _autogroup_on(), reason="no readable autogroup scheduling")
def test_boost_sets_the_jobs_groups_never_the_callers():
    own = _autogroup("self")
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        time.sleep(0.2)
        assert boost.boost_once(os.getpid(), 19) == 1  # raising a group's nice needs no privilege
        assert _autogroup(job.pid)[1] == 19
        assert _autogroup("self") == own
    finally:
        job.kill()
        job.wait()


def test_a_niced_harness_gives_its_jobs_nice_19():
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks' / 'whatif')!r}); import boost; print(boost.caller_nice())"
    out = subprocess.run(["nice", "-n", "19", sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "19"


def test_ddp_ranks_are_not_pinned_by_default():
    # a pinned DDP rank's trace would say 1 core, shared by the replay's CPU model among the host's ranks
    assert not jobenv.default_for("ddp").pin and jobenv.default_for("hvd").pin
    assert jobenv.default_for("ddp").env()["OMP_NUM_THREADS"] == "1"


def test_heap_setting_stops_glibc_mapping_large_buffers_anew(tmp_path):
    """HEAP_ENV (the ``*heap`` settings): a process that allocates, fills and frees a ~25 MB
    buffer ten times, each a little larger (as glibc's dynamic mmap threshold would otherwise
    follow), faults its pages in once, not ten times (a real glibc, counted by getrusage)."""
    script = tmp_path / "churn.py"
    script.write_text(
        "import ctypes, resource\n"
        "libc = ctypes.CDLL(None); libc.malloc.restype = ctypes.c_void_p; libc.free.argtypes = [ctypes.c_void_p]\n"
        "f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for i in range(10):\n"
        "    n = (25 << 20) + i * (64 << 10)\n"
        "    p = libc.malloc(n); ctypes.memset(p, 1, n); libc.free(p)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)\n")
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    faults = {}
    for name, extra in (("default", {}), ("heap", dict([jobenv.HEAP_ENV]))):
        out = subprocess.run([sys.executable, str(script)], env={**env, **extra}, capture_output=True, text=True,
                             check=True).stdout
        faults[name] = int(out)
    pages = (25 << 20) // 4096
    assert faults["default"] > 8 * pages, faults  # every buffer mapped and faulted in anew
    assert faults["heap"] < 2 * pages, faults  # the heap's pages faulted in once, then reused
    assert "threads1heap" in jobenv.SETTINGS and jobenv.HEAP_ENV in jobenv.SETTINGS["threads1pinheap"].env_vars
