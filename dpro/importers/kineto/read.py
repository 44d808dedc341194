"""Find the rank files of a Kineto trace directory and load their raw events."""

from __future__ import annotations

import functools
import logging
import re
from array import array
from collections.abc import Callable
from functools import partial
from operator import itemgetter
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from dpro.compiled import load_compiled
from dpro.contracts.recording import META_SUFFIX
from dpro.errors import DproInputError, brief, one_line
from dpro.jsonio import MAX_DEPTH, current_read_options, read_array_stream, regular_file_problem

log = logging.getLogger(__name__)

DEFAULT_RANK_PATTERN = r"rank[-_]?(\d+)"
#: bound on a raw event's ``ts + dur`` (µs, or ns in traces that say so): 2^62
MAX_RAW_TIME = float(2**62)
_TRACE_SUFFIXES = (".json", ".json.gz")
#: Event categories the importer turns into ops (see segments.py); a rank file needs one.
OP_CATS = ("cpu_op", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "Kernel", "Memcpy", "Memset", "Runtime",
           "Operator")
#: the categories of PyTorch 1.8's profiler (Kineto's first releases) -> their modern names;
#: a rank file's events are read under the modern names (``RankFile.legacy`` counts them)
LEGACY_CATS = {"Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel", "Memcpy": "gpu_memcpy",
               "Memset": "gpu_memset"}


#: the ``args`` of an event that the importer reads; the others are dropped as it streams
KEPT_ARGS = frozenset({
    "Sequence number", "correlation", "device", "stream", "Collective name", "In msg nelems", "dtype", "Input Dims",
    "Input type", "Concrete Inputs", "Process Group Name", "Process Group Ranks",
})


@dataclass(slots=True)
class KEvent:
    """A complete ('X') event as the converter needs it: checked, compact (``name``,
    ``cat`` and ``tid`` shared between events, only :data:`KEPT_ARGS` of its ``args``,
    equal ``args`` shared too: read-only)."""

    name: str
    #: legacy categories already read as their modern names (``LEGACY_CATS``); None: none given
    cat: str | None
    ts: float
    dur: float
    tid: object = None
    args: dict | None = None


#: names a ``python_function`` frame must not start with to be kept as :class:`PyFrames`
#: only: the names the converter reads (steps, collectives, DDP buckets, layers)
PY_NAMES_READ = ("ProfilerStep#", "c10d::", "nccl:", "record_param_comms", "gloo:", "dpro.")


@dataclass(slots=True)
class PyFrames:
    """One thread's ``python_function`` frames, reduced to what the converter uses of them:
    their times (µs, as read; ``end = ts + dur``) and where the thread first appears.

    The Python tracer writes most of a trace's events (90 % of an H100 TimeSformer trace),
    and the converter treats a frame as transparent context (docs/kineto.md); a frame with
    a kept arg (:data:`KEPT_ARGS`) or a name the converter reads (:data:`PY_NAMES_READ`) is
    kept as a :class:`KEvent` instead. ``segments.cpu_segments`` checks that dropping them
    leaves each thread's tree as it was, and puts them back where it would not.
    """

    ts: array
    dur: array
    #: the number of KEvents kept before this thread's first frame
    first: int

    def __len__(self) -> int:
        return len(self.ts)


@dataclass
class RankFile:
    """One rank's Kineto trace as loaded from disk: its complete events, compact."""

    path: Path
    rank: int
    world_size: int | None
    backend: str | None
    events: list[KEvent]
    meta: dict = field(default_factory=dict)
    #: events whose legacy category (``LEGACY_CATS``) was read as its modern name
    legacy: int = 0
    #: the python_function frames not kept as events, per thread (:class:`PyFrames`)
    python: dict = field(default_factory=dict)
    #: ``segments.step_markers``' result, once computed (the converter asks three times)
    step_markers: tuple | None = field(default=None, repr=False, compare=False)

    def time_span(self) -> tuple[float, float]:
        """(first start, last end) of every complete event, python frames included."""
        import numpy as np

        frames = [(np.frombuffer(f.ts), np.frombuffer(f.dur)) for f in self.python.values()]
        starts = [e.ts for e in self.events] + [float(ts.min()) for ts, _ in frames]
        ends = [e.ts + e.dur for e in self.events] + [float((ts + dur).max()) for ts, dur in frames]
        return min(starts), max(ends)


def trace_files(path: Path) -> list[Path]:
    """The Chrome-trace files under ``path`` (a file or a directory), sorted.

    A name like a trace file that is not a readable regular file (a directory, a broken
    link, a FIFO, a device) is an error naming it, or with ``--allow-missing-ranks`` a
    warning: no rank is dropped without a word.
    """
    if not path.is_dir():
        problem = regular_file_problem(path)
        if problem == "file not found":
            raise DproInputError(path, "no such file or directory")
        if problem:
            raise DproInputError(path, problem)
        return [path]
    try:
        named = sorted(p for p in path.iterdir() if p.name.endswith(_TRACE_SUFFIXES) and not p.name.endswith(META_SUFFIX))
    except OSError as e:
        raise DproInputError(path, f"cannot read directory: {e.strerror or e}") from None
    files = []
    for p in named:
        problem = regular_file_problem(p)
        if problem is None:
            files.append(p)
        elif current_read_options().allow_missing_ranks:
            log.warning("%s", one_line(f"{p}: {problem}; skipped (--allow-missing-ranks)"))
        else:
            raise DproInputError(p, f"{problem} (named like a rank's trace; to skip it: dpro --allow-missing-ranks "
                                    "COMMAND ..., an option before the command, or DPRO_ALLOW_MISSING_RANKS=1)")
    if not files:
        raise DproInputError(path, "no trace files (*.json, *.json.gz) in this directory")
    return files


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


_NUM_TYPES = frozenset({int, float})
#: kept args that differ from event to event: not worth sharing
_UNIQUE_ARGS = frozenset({"correlation", "Sequence number"})
_ID_TYPES = frozenset({int, str})


def _is_num(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _args_plan(names: tuple) -> tuple:
    """For an event's ``args`` with keys ``names``: (the kept keys, sorted, or None for
    none; a function giving their values as a tuple; whether equal ones are shared)."""
    keys = tuple(sorted(k for k in set(names) if k in KEPT_ARGS))
    if not keys:
        return None, None, False
    get = itemgetter(*keys) if len(keys) > 1 else (lambda a, k=keys[0]: (a[k],))
    return keys, get, _UNIQUE_ARGS.isdisjoint(keys)


class _Collector:
    """Checks each raw event as it streams in and keeps the complete ones as KEvents."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reset()

    def reset(self) -> None:
        self.events: list[KEvent] = []
        self.python: dict[object, PyFrames] = {}
        self.index = 0  # of the next raw event in traceEvents
        self.legacy = 0
        self.has_op = False
        self.cats: set[str] = set()
        self._strings: dict = {}
        #: one copy of each distinct kept ``args`` (read-only from here on)
        self._args: dict[tuple, dict] = {}
        #: what to keep of an ``args`` with these keys, in this order (:func:`_args_plan`)
        self._plans: dict[tuple, tuple] = {}

    def _shared(self, s: str) -> str:
        return self._strings.setdefault(s, s)

    def add(self, batch: list) -> None:
        """Check and keep ``batch`` (raw events), whose first is ``traceEvents[self.index]``:
        the compiled loop (``_collect.c``) when it was built, else :meth:`add_python`."""
        fast = _compiled()
        if isinstance(fast, str):
            self.add_python(batch)
        else:
            fast.add(self, batch, KEvent, _new_frames, _args_plan, orjson.dumps, LEGACY_CATS, OP_CATS, PY_NAMES_READ,
                     KEPT_ARGS, self.add_python, _kevent_slots())

    def add_python(self, batch: list) -> None:
        """The reference of :meth:`add` (and its fallback): the compiled loop keeps what this
        keeps, and hands it any event not of the common shape (one at a time)."""
        shared, out, num, ids = self._strings.setdefault, self.events, _NUM_TYPES, _ID_TYPES
        same_args, plans = self._args, self._plans
        python, kept, py_read = self.python, KEPT_ARGS, PY_NAMES_READ
        i = self.index - 1
        for e in batch:
            i += 1
            if type(e) is not dict or e.get("ph") != "X":
                continue
            ts, dur, tid, args = e.get("ts"), e.get("dur", 0), e.get("tid"), e.get("args")
            # the common case in one test; any doubt goes to _check, which says what is wrong
            if not (type(ts) in num and type(dur) in num and 0 <= dur and abs(ts) + dur < MAX_RAW_TIME
                    and (type(tid) in ids or (tid is None and "tid" not in e))
                    and (type(args) is dict or args is None) and type(e.get("pid", 0)) in ids):
                self._check(i, e)
            name = e.get("name", "")
            cat = e.get("cat")
            if cat == "python_function" and type(name) is str and not name.startswith(py_read) and (
                    not args or args.keys().isdisjoint(kept)):
                f = python.get(tid)
                if f is None:
                    f = python[tid] = PyFrames(array("d"), array("d"), len(out))
                    if not self.has_op:
                        self.cats.add(cat)
                f.ts.append(ts)
                f.dur.append(dur)
                continue
            if cat is not None:
                if type(cat) is not str:
                    cat = str(cat)
                if cat in LEGACY_CATS:
                    cat = LEGACY_CATS[cat]
                    self.legacy += 1
                cat = shared(cat, cat)
            if not self.has_op:
                self.has_op = cat in OP_CATS
                self.cats.add(str(e.get("cat")))
            if args:
                plan = plans.get(names := tuple(args))
                if plan is None:
                    plan = plans[names] = _args_plan(names)
                keys, get, share = plan
                if keys is None:
                    args = None
                elif share:  # shapes repeat from step to step: one copy
                    vals = get(args)
                    key = (keys, orjson.dumps(vals))
                    args = same_args.get(key) or same_args.setdefault(key, dict(zip(keys, vals)))
                else:
                    args = dict(zip(keys, get(args)))
            else:
                args = None
            if type(name) is not str:
                name = str(name)
            out.append(KEvent(shared(name, name), cat, float(ts), float(dur), shared(tid, tid), args))
        self.index = i + 1

    def _check(self, i: int, e: dict) -> None:
        """Raise the error of complete event ``e`` (``traceEvents[i]``), if it has one."""
        path, name = self.path, e.get("name")
        what = f"traceEvents[{i}]" + (f" ({name[:80]})" if isinstance(name, str) else "")
        ts, dur = e.get("ts"), e.get("dur", 0)
        if not _is_num(ts):
            raise DproInputError(path, f"{what}: 'ts' is missing or not a number ({brief(ts)})")
        if not _is_num(dur):
            raise DproInputError(path, f"{what}: 'dur' is not a number ({brief(dur)})")
        if dur < 0:
            raise DproInputError(path, f"{what}: negative duration {brief(dur)}")
        if not abs(ts) + dur < MAX_RAW_TIME:
            raise DproInputError(path, f"{what}: 'ts' {ts:g} + 'dur' {dur:g} is out of range (below 2^62 allowed)")
        if "args" in e and e["args"] is not None and not isinstance(e["args"], dict):
            raise DproInputError(path, f"{what}: 'args' is not an object")
        for k in ("pid", "tid"):
            if k in e and not isinstance(e[k], (int, str)):
                raise DproInputError(path, f"{what}: '{k}' is neither a number nor a string")


@functools.cache
def _kevent_slots() -> tuple:
    """KEvent's slot descriptors in field order: the compiled loop sets them as __init__ does."""
    import dataclasses

    names = tuple(f.name for f in dataclasses.fields(KEvent))
    if names != ("name", "cat", "ts", "dur", "tid", "args"):
        raise RuntimeError("read.KEvent changed: update _collect.c (keep_event)")
    return tuple(KEvent.__dict__[n] for n in names)


def _depth_check() -> Callable[[object], bool] | None:
    """The compiled nesting check for orjson-parsed batches (jsonio.too_deep's result on
    them, without encoding them again), or None (jsonio's own)."""
    fast = _compiled()
    return None if isinstance(fast, str) else partial(_nests, fast.too_deep)


def _nests(too_deep: Callable[[object, int], bool], obj: object) -> bool:
    return too_deep(obj, MAX_DEPTH)


def _new_frames(first: int) -> PyFrames:
    return PyFrames(array("d"), array("d"), first)


def _compiled():
    """The compiled reader loop (``dpro.importers.kineto._collect``), or why it cannot be
    loaded (a string): built by setup.py with the replay core; optional."""
    return load_compiled("dpro.importers.kineto._collect")


def reader_line() -> str | None:
    """One line saying the Kineto reader runs its Python loop because the compiled one is
    missing; None when the compiled loop runs."""
    why = _compiled()
    if isinstance(why, str):
        return f"kineto reader: python (the compiled loop is {why}; reinstall dpro with a C compiler for a faster import)"
    return None


def compact_events(events: list) -> list[KEvent]:
    """The KEvents of raw events (a list of Chrome-trace event dicts), as the reader keeps them."""
    c = _Collector(Path("events"))
    c.add(events)
    return c.events


def load_rank_file(path: Path, rank_pattern: str, index: int) -> RankFile:
    """Load one file, streaming its events; rank from ``distributedInfo``, else the
    file-name pattern, else ``index``."""
    c = _Collector(path)
    d, found = read_array_stream(path, "traceEvents", c.add, c.reset, depth_check=_depth_check())
    if isinstance(d, list):
        d = {}
    if not isinstance(d, dict) or not found:
        raise DproInputError(path, "not a Chrome trace (no 'traceEvents' list)")
    if not c.events and not c.python:
        raise DproInputError(path, "empty trace: no complete ('X') events")
    if not c.has_op:
        raise DproInputError(
            path,
            f"empty trace: no operator events (no 'X' events of category {', '.join(OP_CATS[:4])}, ...; "
            f"categories found: {', '.join(sorted(c.cats))})",
        )
    info = d.get("distributedInfo") if isinstance(d.get("distributedInfo"), dict) else {}
    rank = info.get("rank")
    if not _is_int(rank):
        m = re.search(rank_pattern, path.name)
        if m and m.groups() and m.group(1) is not None:
            if not re.fullmatch(r"[0-9]{1,9}", m.group(1)):
                raise DproInputError(path, f"--rank-pattern matched '{m.group(1)}' in the file name, which is not a rank")
            rank = int(m.group(1))
        else:
            rank = index
    if rank < 0:
        raise DproInputError(path, f"distributedInfo: negative rank {rank}")
    ws = info.get("world_size")
    ws = ws if _is_int(ws) and ws > 0 else None
    if ws is not None and rank >= ws:
        raise DproInputError(path, f"rank {rank} is outside world_size {ws} (distributedInfo)")
    backend = info.get("backend")
    return RankFile(
        path=path,
        rank=rank,
        world_size=ws,
        backend=backend if isinstance(backend, str) else None,
        events=c.events,
        meta={k: d[k] for k in ("deviceProperties", "host_name", "distributedInfo", "baseTimeNanoseconds") if k in d},
        legacy=c.legacy,
        python=c.python,
    )


def check_rank_pattern(rank_pattern: str) -> None:
    """A usable ``--rank-pattern``: a regular expression with a group (the rank)."""
    try:
        groups = re.compile(rank_pattern).groups
    except re.error as e:
        raise DproInputError(None, f"bad --rank-pattern '{rank_pattern}': {e}") from None
    if groups < 1:
        raise DproInputError(None, f"bad --rank-pattern '{rank_pattern}': needs a group, e.g. rank(\\d+)")
