"""How many rank files the import reads at once: :func:`default_mapper`.

A *mapper* ``mapper(fn, items)`` returns ``fn(item)`` for each item, in item order
(:mod:`dpro.executor`); ``import_kineto(mapper=)`` takes any, and picks this default.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from dpro.executor import Mapper, ProcessPool, serial, start_method, usable_cores

#: below this many bytes of trace files in all, ranks are imported serially: starting a
#: spawned worker process (a fresh interpreter importing dpro, ~1 s) costs more than it saves
POOL_MIN_BYTES = 32 * 2**20
#: the same where the workers are forked (:func:`dpro.executor.start_method`): a forked
#: worker starts in milliseconds with dpro already imported, so a pool pays off sooner
#: (param_dlrm_8rank, 8 x 60 KB gzipped, is imported by two workers)
POOL_MIN_BYTES_FORK = 256 * 2**10

#: environment variable: the most worker processes of the default mapper (1: serial)
WORKERS_ENV = "DPRO_IMPORT_WORKERS"


def default_mapper(sizes: Sequence[int]) -> Mapper:
    """Serial or a local process pool for rank files of these ``sizes`` (bytes).

    A worker holds one rank's events while it converts them, about twice the file, so
    the workers are as many as the cores, the files and ``$DPRO_IMPORT_WORKERS`` allow,
    and no more than keeps the files being read at once within half of the input
    (``total // (2 * largest)``): the import's peak memory then stays near the input's
    size however it runs (docs/scale.md). One rank, a small input (:data:`POOL_MIN_BYTES`,
    :data:`POOL_MIN_BYTES_FORK`) or one core: serial.
    """
    if not sizes:
        return serial
    total, largest = sum(sizes), max(sizes)
    cap = os.environ.get(WORKERS_ENV, "").strip()
    workers = min(usable_cores(), len(sizes), int(cap) if cap.isdigit() and int(cap) > 0 else len(sizes),
                  total // (2 * largest) if largest else len(sizes))
    if workers <= 1 or total < (POOL_MIN_BYTES_FORK if start_method() == "fork" else POOL_MIN_BYTES):
        return serial
    return ProcessPool(workers, meanwhile=_load_numpy)


def _load_numpy() -> None:
    """Import numpy (what the analysis after an import needs first: op statistics, the
    replay's arrays; ~0.1 s) while the forked workers convert their first ranks, instead of
    after the ranks; the import itself does not need it (nor do the workers). Loaded when
    this process had no rank left to take instead, it ran after the ranks on most runs of
    ``param_dlrm_8rank`` (this process's own last rank ends last). OpenBLAS's threads spin
    for a while once numpy is loaded, on the core a worker uses: ``dpro replay`` runs it
    with one (``OPENBLAS_NUM_THREADS``, dpro/cli.py)."""
    import numpy  # noqa: F401
