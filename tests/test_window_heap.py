"""dpro/profiler/heap.py: glibc's top pad raised for the profiling window keeps a thread's
second heap mapped, so memory freed and taken again every step is not faulted in again.

Real glibc, no mock: a thread fills its arena's first heap (64 MiB) with 100 KiB blocks, so
the last ones land in a second heap; it then frees and re-takes those last blocks three times
(a "step") and counts its minor page faults. By default glibc unmaps the emptied second heap
each time (~1970 faults per step for 8 MB); with :class:`WindowHeap` kept, none. Runs in a
subprocess (``mallopt`` changes the process for good). Linux/glibc only.
"""

from __future__ import annotations

import ast
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpro.profiler import heap

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import ctypes, resource, sys, threading
    from dpro.profiler.heap import WindowHeap
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    BLOCK, N, TAIL = 100 * 1024, 760, 80   # 76 MB: past one heap; the last 8 MB in a second one
    out = {}
    def work(keep):
        h = WindowHeap()
        if keep:
            h.keep()
        ps = [libc.malloc(BLOCK) for _ in range(N)]
        for p in ps:
            libc.memset(p, 1, BLOCK)
        faults = []
        for _ in range(3):
            for p in reversed(ps[-TAIL:]):
                libc.free(p)
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            ps[-TAIL:] = [libc.malloc(BLOCK) for _ in range(TAIL)]
            for p in ps[-TAIL:]:
                libc.memset(p, 1, BLOCK)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        out["kept"] = h.kept
        h.release()
        for p in ps:
            libc.free(p)
        out["faults"] = faults
    t = threading.Thread(target=work, args=(sys.argv[1] == "keep",))
    t.start()
    t.join()
    print(repr(out))
""")

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                           reason="glibc's heaps")


def _run(mode: str, **env: str) -> dict:
    import os

    e = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    e.update(env, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60, env=e)
    assert r.returncode == 0, r.stderr[-2000:]
    return ast.literal_eval(r.stdout.strip().splitlines()[-1])


@glibc
def test_kept_heap_is_not_faulted_in_again():
    default, kept = _run("default"), _run("keep")
    assert kept["kept"] and not default["kept"]
    assert min(default["faults"]) > 1000, default      # 8 MB unmapped and faulted in again per step
    assert max(kept["faults"]) < 100, kept             # reused


@glibc
def test_switched_off_by_env_or_a_user_malloc_setting():
    assert not _run("keep", DPRO_KEEP_HEAP="0")["kept"]
    assert not _run("keep", MALLOC_ARENA_MAX="2")["kept"]
    assert not _run("keep", GLIBC_TUNABLES="glibc.malloc.top_pad=1000000")["kept"]


def test_enabled_flag(monkeypatch):
    for k in heap.USER_MALLOC_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setenv("DPRO_KEEP_HEAP", "no")
    assert not heap.keep_heap_enabled()
    monkeypatch.setenv("DPRO_KEEP_HEAP", "1")
    assert heap.keep_heap_enabled() == (platform.libc_ver()[0] == "glibc")
    h = heap.WindowHeap()
    h.release()  # nothing kept: nothing to do
    assert not h.kept
