"""Where a batch of independent tasks runs: here, in a local process pool, or as Ray tasks.

A *mapper* is any callable ``mapper(fn, items) -> iterable of fn(item) for each item, in
the items' order``. The stages that have independent work (the per-rank import, the
optimizer's candidate replays) take one, so the caller chooses where it runs:

* :func:`serial` (the default): here, lazily (``map``), so a caller that stops early
  does no more work than a plain loop;
* :class:`ProcessPool`: the machine's cores;
* :class:`RayMapper`: the tasks of a Ray cluster (``pip install dpro[ray]``;
  docs/scale.md). ``fn`` and the items are pickled, so ``fn`` must be a module-level
  function or a :func:`functools.partial` of one.

Every mapper returns the same results as :func:`serial` (the tasks are pure functions).
"""

from __future__ import annotations

import gc
import logging
import mmap
import multiprocessing
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from dpro.errors import DproInputError

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
Mapper = Callable[[Callable[[Any], Any], Iterable[Any]], Iterable[Any]]


def serial(fn: Callable[[T], R], items: Iterable[T]) -> Iterable[R]:
    """``fn`` over ``items`` here, one at a time, as they are asked for."""
    return map(fn, items)


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def start_method() -> str:
    """How a worker process starts: ``fork`` where the platform has it and this process
    runs no other thread (a forked worker starts at once, with what this process imported),
    else ``spawn`` (a fresh interpreter: threads, such as a progress bar's, fork badly)."""
    if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1:
        return "fork"
    return "spawn"


@dataclass(frozen=True)
class ProcessPool:
    """``fn`` over ``items`` in up to ``workers`` processes (default: one per usable
    core), yielded in item order as they finish. The first exception (in item order) is
    raised as ``fn`` raised it; the work not yet started is cancelled then, and when the
    caller stops early (closes the iterator).

    Where nothing else runs in this process (:func:`start_method`), ``workers - 1``
    workers are forked and this process is the last worker: it runs the items no worker
    has taken yet, from the last one back, while it waits for the next result in order
    (one process fewer to start and to hold memory). Else ``workers`` are spawned.

    ``meanwhile``: run once in this process (fork mode) as soon as the workers have
    started, before it takes items itself: work of its own that the items' results do not
    need, done while the workers run (the Kineto import loads numpy there, which the
    analysis after it needs)."""

    workers: int | None = None
    meanwhile: Callable[[], object] | None = None

    def __call__(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        items = list(items)
        n = min(self.workers or usable_cores(), len(items))
        if n <= 1:
            yield from map(fn, items)
            return
        if start_method() != "fork":
            with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) as pool:
                futures: list[Future] = [pool.submit(fn, x) for x in items]
                try:
                    for f in futures:
                        yield f.result()
                finally:
                    for f in futures:
                        f.cancel()
            return
        yield from _forked(fn, items, n - 1, self.meanwhile)


#: the GIL's switch interval in this process while :func:`_forked` runs (Python's default: 5 ms)
SWITCH_INTERVAL_S = 2e-4


def _forked(fn: Callable[[T], R], items: list[T], workers: int,
            meanwhile: Callable[[], object] | None = None) -> Iterator[R]:
    """:class:`ProcessPool`'s fork mode: ``workers`` forked processes and this one.

    The items not started yet are ``items[span[0]:span[1]]``, two integers in shared memory
    that the forked workers inherit: a worker takes the first one itself when it starts a
    task (:func:`_claim`), this process takes the last one. So no item waits queued for a
    busy worker while this process could run it (``ProcessPoolExecutor`` queues one more
    than it has workers: submitting the items themselves left this process idle for that
    item's whole run at the end, ~0.5 s of a grown dlrm rank), and a worker does not wait
    for this process between items either: two claims are queued per worker, and a
    finished one is replaced from the pool's callback (handing it the next item from here
    cost the worker 30-50 ms of idle time per item on ``param_dlrm_8rank``, this process
    being busy converting its own rank)."""
    for stream in (sys.stdout, sys.stderr):  # a forked worker would write buffered output again
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    ctx = multiprocessing.get_context("fork")
    # two int64 in an anonymous shared mapping (what the forked workers see), and a lock:
    # a multiprocessing.Array would import ctypes (~4 ms before the first rank starts)
    span = memoryview(mmap.mmap(-1, 16)).cast("q")
    span[0], span[1] = 0, len(items)
    span_lock = ctx.Lock()
    done = threading.Condition()
    results: dict[int, tuple[bool, object]] = {}  # index -> (ok, result or exception)
    failed: list[BaseException] = []  # the pool broke (a worker died)
    stopped = False

    def take(front: bool) -> int | None:
        with span_lock:
            if span[0] >= span[1]:
                return None
            if front:
                span[0] += 1
                return span[0] - 1
            span[1] -= 1
            return span[1]

    def submit(first: int | None = None) -> None:
        try:
            f = pool.submit(_claim, first)
        except RuntimeError:  # shut down or broken: this process runs what is left
            return
        f.add_done_callback(collect)

    def collect(f: Future) -> None:
        """A claim's result (a done callback): kept, and the worker given another claim."""
        try:
            r = f.result()
        except BaseException as e:  # noqa: BLE001 - the pool broke: raised below, where an item needs it
            with done:
                failed.append(e)
                done.notify_all()
            return
        if r is None:
            return  # nothing was left to take
        with done:
            results[r[0]] = (r[1], r[2])
            done.notify_all()
        if not stopped:
            submit()

    switch = sys.getswitchinterval()
    # the pool's thread reads a worker's result from a pipe 64 KiB at a time, and needs the GIL
    # between reads, which this process's own items hold for the switch interval (5 ms) each
    # time: the worker, blocked on the full pipe, waited ~25 ms per rank of param_dlrm_8rank
    sys.setswitchinterval(min(switch, SWITCH_INTERVAL_S))
    gc.freeze()  # the workers' garbage collector then leaves this process's objects (their pages) alone
    try:
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_claim_setup,
                                   initargs=(span, span_lock, fn, items))
        for _ in range(workers):  # a fork pool starts its workers now; each begins with an item from the front
            if (i := take(front=True)) is not None:
                submit(i)
                submit()
    except BaseException:
        sys.setswitchinterval(switch)  # no pool: the finally below that restores it is not reached
        raise
    finally:
        gc.unfreeze()
    with pool:
        try:
            if meanwhile is not None:
                meanwhile()  # the workers have their first items: this process's own work now
            for i in range(len(items)):
                while i not in results:
                    j = take(front=False)  # the last item not started (at the end: i itself)
                    if j is not None:
                        try:
                            r = (True, fn(items[j]))
                        except Exception as e:  # noqa: BLE001 - raised in item order, below
                            r = (False, e)
                        with done:
                            results[j] = r
                        continue
                    with done:
                        done.wait_for(lambda: i in results or bool(failed))
                        if i not in results:
                            raise failed[0]
                with done:
                    ok, r = results.pop(i)
                if not ok:
                    raise r  # type: ignore[misc]
                yield r  # type: ignore[misc]
        finally:
            stopped = True
            with span_lock:
                span[0] = span[1]  # the workers take nothing more
            sys.setswitchinterval(switch)


#: in a forked worker of :func:`_forked` only: (span, its lock, fn, items), inherited, never pickled
_claim_state: tuple[memoryview, Any, Callable[[Any], Any], list[Any]] | None = None


def _claim_setup(span: memoryview, lock: Any, fn: Callable[[Any], Any], items: list[Any]) -> None:
    """A forked worker's initializer: what :func:`_claim` takes its items from."""
    global _claim_state
    _claim_state = (span, lock, fn, items)


def _claim(first: int | None = None) -> tuple[int, bool, object] | None:
    """In a forked worker: ``fn`` on item ``first``, else on the first item not started
    (taken from the shared span), as (index, ok, result or exception); None when none is left."""
    assert _claim_state is not None
    span, lock, fn, items = _claim_state
    i = first
    if i is None:
        with lock:
            if span[0] >= span[1]:
                return None
            i = span[0]
            span[0] = i + 1
    try:
        return i, True, fn(items[i])
    except Exception as e:  # noqa: BLE001 - raised in this process's item order
        return i, False, e


def _apply(fn: Callable[[T], R], item: T) -> R:
    return fn(item)


@dataclass(frozen=True)
class RayMapper:
    """``fn`` over ``items`` as Ray tasks (one per item) on the cluster at ``address``.

    ``address``: ``auto`` (the cluster ``ray start`` started on this machine, or
    ``$RAY_ADDRESS``), ``local`` (a Ray started here for this process alone), or an address
    (``HOST:6379``, ``ray://HOST:10001``). A Ray already initialised in this process (e.g.
    by the caller's own ``ray.init``) is used as it is. ``fn`` is put in the object store
    once per call, not once per task; the tasks are submitted when the first result is
    asked for, the results yielded in order as they come (an exception a task raised is
    raised as such). The tasks whose results were not asked for when the caller stops
    (closes the iterator) are cancelled.
    """

    address: str = "auto"

    def __call__(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        ray = connect(self.address)
        task = ray.remote(_apply)
        ref = ray.put(fn)
        refs = [task.remote(ref, x) for x in items]  # all submitted now, taken in order
        taken = 0
        try:
            for r in refs:
                try:
                    yield ray.get(r)
                except ray.exceptions.RayTaskError as e:  # the task's own exception, not Ray's wrapper
                    cause = getattr(e, "cause", None)
                    if isinstance(cause, Exception):
                        raise cause from None
                    raise
                taken += 1
        finally:  # a caller that stops early (the search, on the first candidate that helps)
            for r in refs[taken + 1:]:
                ray.cancel(r)


def connect(address: str):  # noqa: ANN201 - the ray module
    """The ``ray`` module, initialised (connected to ``address``) if it is not yet."""
    try:
        import ray
    except ImportError:
        raise DproInputError(None, "--ray needs Ray: pip install 'dpro[ray]'") from None
    if not ray.is_initialized():
        if problem := _unreachable(address):
            raise DproInputError(None, f"--ray {address}: {problem}")
        try:
            if address == "local":
                start_local()
            else:
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise DproInputError(None, f"--ray {address}: cannot connect to a Ray cluster ({_first_line(e)})") from None
        log.info("ray: %s", ray.cluster_resources())
    return ray


def start_local(num_cpus: int | None = None, tries: int = 3) -> None:
    """Start a Ray cluster in this process (``num_cpus``: default all). Its processes must
    register within Ray's 30 s; on a loaded machine they may not: tried ``tries`` times."""
    import ray

    for i in range(tries):
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
            return
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this timeout
            ray.shutdown()
            if "timed out during startup" not in str(e) or i == tries - 1:
                raise RuntimeError(_first_line(e)) from None
            log.warning("ray: the local cluster did not start in time (%s): trying again", e)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _unreachable(address: str, timeout_s: float = 10.0) -> str | None:
    """Why ``HOST:PORT`` (or ``ray://HOST:PORT``) takes no TCP connection, or None (Ray itself
    retries a wrong address for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return None  # auto, local: Ray says why
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        return f"cannot connect to a Ray cluster there ({e.strerror or e})"
    return None


def mapper_for(ray_address: str | None, workers: int | None = None) -> Mapper:
    """The mapper the CLI's options name: Ray at ``ray_address`` if given (connected now, so a
    wrong address fails before the work), else a process pool of ``workers`` if more than
    one, else :func:`serial`."""
    if ray_address:
        connect(ray_address)
        return RayMapper(ray_address)
    if workers is not None and workers > 1:
        return ProcessPool(workers)
    return serial
