"""Keep glibc's heaps for the profiling window: the step's memory stays with the process.

Found on the TF + Horovod convnet (#31; docs/fidelity.md "Profiling overhead"): a TF step
frees its ~28 MB of tensors at its end, and glibc reuses that memory the next step (2 page
faults per step unprofiled). With TF's profiler on, its per-thread event buffers are
allocated in the executor thread's arena between those tensors; once they fill that arena's
heap (64 MiB at most), the step's tensors go to a second heap, which is empty again when the
step ends, so glibc deletes it (``heap_trim``: a heap is unmapped when at least ``top_pad``
plus a page of it is free) and the next step maps and faults it in again: ~6900 page faults
and +20-25 % CPU per step from then on, in about half of the profiler sessions of one process
(benchmarks/tf_window_cpu.py; strace shows a 64 MiB heap mapped and unmapped every step).

:class:`WindowHeap` raises glibc's ``M_TOP_PAD`` to 64 MiB for the window (a heap is then
never deleted or shrunk, and the main arena keeps up to that much free memory at its top)
and sets it back to glibc's default after it. Side effect: glibc stops adapting its mmap
and trim thresholds from then on (any ``mallopt`` does that); they keep the values the
warm-up set. Nothing is changed where the process does not use glibc, or where the user
set glibc's malloc through the environment (``MALLOC_*_`` or ``GLIBC_TUNABLES``), or with
``DPRO_KEEP_HEAP=0``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

from dpro.contracts.recording import ENV_KEEP_HEAP

log = logging.getLogger(__name__)

#: ``mallopt`` parameter (malloc.h)
M_TOP_PAD = -2
#: glibc's default top pad (``DEFAULT_TOP_PAD``)
DEFAULT_TOP_PAD = 128 * 1024
#: the window's: a per-thread heap's largest size on 64-bit (``HEAP_MAX_SIZE``), so no heap
#: is deleted or shrunk
WINDOW_TOP_PAD = 64 * 1024 * 1024
#: environment variables through which a user sets glibc's malloc (then dpro leaves it alone)
USER_MALLOC_ENV = ("MALLOC_TOP_PAD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX")


def keep_heap_enabled() -> bool:
    """Whether the window may change glibc's top pad (``DPRO_KEEP_HEAP``, default on)."""
    if os.environ.get(ENV_KEEP_HEAP, "1").strip().lower() in ("0", "false", "no"):
        return False
    if any(k in os.environ for k in USER_MALLOC_ENV) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    return platform.libc_ver()[0] == "glibc"


class WindowHeap:
    """glibc's top pad raised from :meth:`keep` to :meth:`release` (each a no-op where not
    enabled or not available)."""

    def __init__(self) -> None:
        self.kept = False

    def _mallopt(self, value: int) -> bool:
        try:
            return bool(ctypes.CDLL(None).mallopt(M_TOP_PAD, value))
        except (OSError, AttributeError):
            return False

    def keep(self) -> None:
        """From here on glibc keeps the memory the job frees (up to 64 MiB per heap)."""
        if not self.kept and keep_heap_enabled():
            self.kept = self._mallopt(WINDOW_TOP_PAD)
            if not self.kept:
                log.info("dpro: could not raise glibc's top pad for the window")

    def release(self) -> None:
        """Back to glibc's default top pad."""
        if self.kept:
            self.kept = False
            self._mallopt(DEFAULT_TOP_PAD)
