"""Find the rank files of a Kineto trace directory and load their raw events."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from dpro.errors import DproInputError
from dpro.jsonio import read_json

DEFAULT_RANK_PATTERN = r"rank[-_]?(\d+)"
_TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass
class RankFile:
    """One rank's Kineto trace as loaded from disk."""

    path: Path
    rank: int
    world_size: int | None
    backend: str | None
    events: list[dict]
    meta: dict = field(default_factory=dict)


def trace_files(path: Path) -> list[Path]:
    """The Chrome-trace files under ``path`` (a file or a directory), sorted."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DproInputError(path, "no such file or directory")
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(_TRACE_SUFFIXES))
    if not files:
        raise DproInputError(path, "no trace files (*.json, *.json.gz) in this directory")
    return files


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
    info = d.get("distributedInfo") if isinstance(d.get("distributedInfo"), dict) else {}
    rank = info.get("rank")
    if not isinstance(rank, int):
        m = re.search(rank_pattern, path.name)
        rank = int(m.group(1)) if m else index
    ws = info.get("world_size")
    return RankFile(
        path=path,
        rank=rank,
        world_size=ws if isinstance(ws, int) else None,
        backend=info.get("backend"),
        events=events,
        meta={k: d[k] for k in ("deviceProperties", "host_name") if k in d},
    )


def load_rank_files(path: Path, rank_pattern: str = DEFAULT_RANK_PATTERN) -> list[RankFile]:
    """All rank files of a Kineto directory, sorted by rank; duplicate ranks are an error."""
    try:
        re.compile(rank_pattern)
    except re.error as e:
        raise DproInputError(None, f"bad --rank-pattern '{rank_pattern}': {e}") from None
    ranks = [load_rank_file(p, rank_pattern, i) for i, p in enumerate(trace_files(path))]
    seen: dict[int, Path] = {}
    for r in ranks:
        if r.rank in seen:
            raise DproInputError(r.path, f"rank {r.rank} also in {seen[r.rank].name} (set --rank-pattern?)")
        seen[r.rank] = r.path
    return sorted(ranks, key=lambda r: r.rank)
