"""How the per-rank import runs: a *mapper* ``mapper(fn, items)`` returns ``fn(item)`` for
each item, in item order (an iterable, consumed as results arrive).

``fn`` and the items are picklable (a top-level function, dataclasses), so a mapper may run
them in other processes or on other machines (a Ray-based mapper passes through the same
keyword). :func:`default_mapper` picks serial or a local process pool.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: ``mapper(fn, items) -> results in item order``
Mapper = Callable[[Callable[[Any], Any], Sequence[Any]], Iterable[Any]]

#: below this many bytes of trace files in all, ranks are imported serially: starting a
#: worker process (a fresh interpreter importing dpro, ~1 s) costs more than it saves
POOL_MIN_BYTES = 32 * 2**20


def serial_mapper(fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
    """``fn(item)`` for each item, one after the other, in this process."""
    for item in items:
        yield fn(item)


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def process_pool_mapper(fn: Callable[[T], R], items: Sequence[T], max_workers: int | None = None) -> Iterator[R]:
    """``fn(item)`` for each item in a pool of ``min(cores, items)`` spawned processes,
    yielded in item order. The first exception (in item order) is re-raised as raised by
    ``fn``; the work not yet started is cancelled."""
    items = list(items)
    if not items:
        return
    workers = max(1, min(max_workers or usable_cores(), len(items)))
    # spawn, not fork: the parent may hold threads (the progress bar's), which fork copies badly
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures: list[Future] = [pool.submit(fn, item) for item in items]
        try:
            for f in futures:
                yield f.result()
        finally:
            for f in futures:
                f.cancel()


#: environment variable: the most worker processes of the default mapper (1: serial)
WORKERS_ENV = "DPRO_IMPORT_WORKERS"


def default_mapper(n_items: int, total_bytes: int) -> Mapper:
    """Serial for one item, a small input or one core; else a local process pool of
    min(cores, items, ``$DPRO_IMPORT_WORKERS``) processes. Each worker holds one rank
    file's events while it converts them: fewer workers, less memory."""
    cap = os.environ.get(WORKERS_ENV, "").strip()
    workers = min(usable_cores(), n_items, int(cap) if cap.isdigit() and int(cap) > 0 else n_items)
    if workers <= 1 or total_bytes < POOL_MIN_BYTES:
        return serial_mapper
    return functools.partial(process_pool_mapper, max_workers=workers)
