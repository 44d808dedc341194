"""Find the rank files of a Kineto trace directory and load their raw events."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from dpro.contracts.recording import META_SUFFIX
from dpro.errors import DproInputError, brief, one_line
from dpro.jsonio import current_read_options, read_json, regular_file_problem

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


@dataclass
class RankFile:
    """One rank's Kineto trace as loaded from disk."""

    path: Path
    rank: int
    world_size: int | None
    backend: str | None
    events: list[dict]
    meta: dict = field(default_factory=dict)
    #: events whose legacy category (``LEGACY_CATS``) was read as its modern name
    legacy: int = 0


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
            raise DproInputError(p, f"{problem} (named like a rank's trace; use --allow-missing-ranks to skip it)")
    if not files:
        raise DproInputError(path, "no trace files (*.json, *.json.gz) in this directory")
    return files


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _check_events(path: Path, evs: list) -> None:
    """Complete ('X') events must be well-formed: the importer relies on it."""
    has_op = False
    for i, e in enumerate(evs):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        name = e.get("name")
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
        has_op = has_op or e.get("cat") in OP_CATS
    if not has_op:
        cats = sorted({str(e.get("cat")) for e in evs if isinstance(e, dict) and e.get("ph") == "X"})
        raise DproInputError(
            path,
            f"empty trace: no operator events (no 'X' events of category {', '.join(OP_CATS[:4])}, ...; "
            f"categories found: {', '.join(cats)})",
        )


def load_rank_file(path: Path, rank_pattern: str, index: int) -> RankFile:
    """Load one file; rank from ``distributedInfo``, else the file-name pattern, else ``index``."""
    d = read_json(path)
    if isinstance(d, list):
        d = {"traceEvents": d}
    if not isinstance(d, dict) or not isinstance(d.get("traceEvents"), list):
        raise DproInputError(path, "not a Chrome trace (no 'traceEvents' list)")
    events = [e for e in d["traceEvents"] if isinstance(e, dict)]
    if not any(e.get("ph") == "X" for e in events):
        raise DproInputError(path, "empty trace: no complete ('X') events")
    _check_events(path, d["traceEvents"])
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
    legacy = 0
    for e in events:
        cat = e.get("cat")
        if isinstance(cat, str) and cat in LEGACY_CATS:
            e["cat"] = LEGACY_CATS[cat]
            legacy += 1
    return RankFile(
        path=path,
        rank=rank,
        world_size=ws,
        backend=backend if isinstance(backend, str) else None,
        events=events,
        meta={k: d[k] for k in ("deviceProperties", "host_name") if k in d},
        legacy=legacy,
    )


def check_rank_pattern(rank_pattern: str) -> None:
    """A usable ``--rank-pattern``: a regular expression with a group (the rank)."""
    try:
        groups = re.compile(rank_pattern).groups
    except re.error as e:
        raise DproInputError(None, f"bad --rank-pattern '{rank_pattern}': {e}") from None
    if groups < 1:
        raise DproInputError(None, f"bad --rank-pattern '{rank_pattern}': needs a group, e.g. rank(\\d+)")
