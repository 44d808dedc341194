"""Reading what a BytePS job leaves: each GPU process's ``comm.json``, server profiles, the
DEBUG logs' partition sizes, and the directory layout (docs/byteps.md)."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from dpro.errors import DproInputError, brief
from dpro.jsonio import read_bytes, read_json, regular_file_problem

#: BytePS ``QueueType`` names in their enum order, which is also the order a partition
#: goes through them (byteps/common/common.h, GetPushQueueList/GetPullQueueList).
STAGES = (
    "COORDINATE_REDUCE", "REDUCE", "COPYD2H", "PCIE_REDUCE", "COORDINATE_PUSH", "COMPRESS",
    "PUSH", "PULL", "DECOMPRESS", "COPYH2D", "COORDINATE_BROADCAST", "BROADCAST",
)
_SIZE_RE = re.compile(r"(\S+) partitioned to (\d+) part\(s\), total_len=(\d+), key_range=\[(\d+), (\d+)\]")
_BOUND_RE = re.compile(r"Partition size round up to (\d+) \(bytes\)")
_TRAILING_INT = re.compile(r"(\d+)$")

Interval = tuple[float, float]  # (ts, dur) µs
#: the most partitions one tensor may have in a log (BytePS makes one per 4 MB by default)
MAX_PARTS = 2**20
INT64_MAX = 2**63 - 1


@dataclass
class RankComm:
    """One comm.json: per tensor its sync intervals, per (tensor, key, stage) its stage intervals."""

    path: Path
    totals: dict[str, list[Interval]] = field(default_factory=dict)
    stages: dict[tuple[str, int, str], list[Interval]] = field(default_factory=dict)

    def keys(self) -> dict[int, str]:
        return {k: t for t, k, _ in self.stages}

    def is_root(self) -> bool:
        return any(s == "PUSH" for _, _, s in self.stages)


@dataclass
class ServerProfile:
    """One server_profile.json: (key, sender, "push"|"pull") -> [(B, E)] in order."""

    path: Path
    reqs: dict[tuple[int, int, str], list[tuple[float, float]]] = field(default_factory=dict)
    truncated: bool = False


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def read_comm_json(path: Path) -> RankComm:
    """Parse and check one BytePS ``comm.json`` (docs/timeline.md, BytePSGlobal::EmitTrace)."""
    d = read_json(path)
    evs = d.get("traceEvents") if isinstance(d, dict) else None
    if not isinstance(evs, list):
        raise DproInputError(path, "not a BytePS comm.json: no 'traceEvents' list")
    rc = RankComm(path)
    for i, e in enumerate(evs):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        pid, name, tid, ts, dur = (e.get(k) for k in ("pid", "name", "tid", "ts", "dur"))
        where = f"traceEvents[{i}]"
        if not (isinstance(pid, str) and pid.startswith("Comm.") and isinstance(name, str)):
            raise DproInputError(path, f"{where}: expected pid and name 'Comm.<tensor>...' (got pid {brief(pid)})")
        if not _num(ts) or not _num(dur):
            raise DproInputError(path, f"{where} ({name}): 'ts'/'dur' missing or not numbers")
        if dur < 0:
            raise DproInputError(path, f"{where} ({name}): negative duration {dur}")
        tensor = pid[len("Comm."):]
        if tid == "total":
            if name != pid:
                raise DproInputError(path, f"{where}: a 'total' event named '{name}', expected '{pid}'")
            rc.totals.setdefault(tensor, []).append((float(ts), float(dur)))
            continue
        if not (isinstance(tid, (str, int)) and not isinstance(tid, bool) and str(tid).isdigit()):
            raise DproInputError(path, f"{where} ({name}): tid {brief(tid)} is neither 'total' nor a partition key")
        stage = name[len(pid) + 1:] if name.startswith(pid + ".") else ""
        if stage not in STAGES:
            raise DproInputError(path, f"{where}: '{name}' does not end in a BytePS stage ({', '.join(STAGES)})")
        rc.stages.setdefault((tensor, int(tid), stage), []).append((float(ts), float(dur)))
    if not rc.stages:
        raise DproInputError(path, "no partition stage events (tid = partition key) in this comm.json")
    owner: dict[int, str] = {}
    for t, k, _ in rc.stages:
        if owner.setdefault(k, t) != t:
            raise DproInputError(path, f"partition key {k} appears under two tensors, '{owner[k]}' and '{t}'")
    for v in rc.stages.values():
        v.sort()
    for v in rc.totals.values():
        v.sort()
    return rc


def read_server_profile(path: Path) -> ServerProfile:
    """Parse one ps-lite ``server_profile.json``.

    The server writes it incrementally and never closes the JSON array while running, so
    a file without its closing ``]}`` (or with a cut last line) is read line by line.
    """
    raw = read_bytes(path)
    sp = ServerProfile(path)
    try:
        d = orjson.loads(raw)
        evs = d.get("traceEvents") if isinstance(d, dict) else None
        if not isinstance(evs, list):
            raise DproInputError(path, "not a server profile: no 'traceEvents' list")
    except orjson.JSONDecodeError:
        text = raw.decode("utf-8", "replace")
        if '"traceEvents"' not in text[:200]:
            raise DproInputError(path, "invalid JSON and not an unterminated server profile") from None
        evs, lines = [], [ln.strip().rstrip(",") for ln in text.splitlines()]
        body = [ln for ln in lines if ln.startswith("{\"")]
        for j, ln in enumerate(body):
            try:
                evs.append(orjson.loads(ln))
            except orjson.JSONDecodeError:
                if j != len(body) - 1:
                    raise DproInputError(path, f"unreadable event line: {ln[:80]!r}") from None
                sp.truncated = True  # the line being written when the server stopped
    open_b: dict[tuple[int, int, str], list[float]] = defaultdict(list)
    for i, e in enumerate(evs):
        where = f"traceEvents[{i}]"
        if not isinstance(e, dict):
            raise DproInputError(path, f"{where}: not an object")
        name, ph, key, ts = e.get("name"), e.get("ph"), e.get("pid"), e.get("ts")
        m = re.fullmatch(r"(push|pull)-(\d+)", name) if isinstance(name, str) else None
        if m is None or ph not in ("B", "E"):
            raise DproInputError(path, f"{where}: expected name 'push-<sender>'/'pull-<sender>' and ph B/E, got {brief(name)} {brief(ph)}")
        if not isinstance(key, int) or isinstance(key, bool) or key < 0 or not _num(ts):
            raise DproInputError(path, f"{where} ({name}): 'pid' (the key) must be a non-negative integer and 'ts' a number")
        k = (key, int(m.group(2)), m.group(1))
        if ph == "B":
            open_b[k].append(float(ts))
            continue
        if not open_b[k]:
            raise DproInputError(path, f"{where}: '{name}' ends (E) for key {key} without a begin (B)")
        b = open_b[k].pop(0)
        if ts < b:
            raise DproInputError(path, f"{where} ({name}, key {key}): ends before it begins")
        sp.reqs.setdefault(k, []).append((b, float(ts)))
    sp.truncated |= any(open_b.values())
    return sp


def read_sizes(root: Path, notes: list[str]) -> dict[str, tuple[list[int], int]]:
    """Tensor name -> (partition sizes in bytes, first key), from BytePS DEBUG logs
    (``*.log``) under root: ``<name> partitioned to <n> part(s), total_len=<bytes>,
    key_range=[<first>, <last>]`` and ``Partition size round up to <bytes> (bytes)``."""
    tensors: dict[str, tuple[int, int, int]] = {}
    bound = None
    for f in sorted(root.rglob("*.log")):
        text = read_bytes(f).decode("utf-8", "replace")
        for m in _SIZE_RE.finditer(text):
            n, tot, first = (int(m.group(i)) if len(m.group(i)) <= 19 else -1 for i in (2, 3, 4))
            if not (1 <= n <= min(tot, MAX_PARTS) and tot <= INT64_MAX and 0 <= first <= INT64_MAX):
                raise DproInputError(f, f"tensor '{m.group(1)[:80]}': {m.group(2)[:20]} partitions of {m.group(3)[:20]} "
                                        f"bytes at key {m.group(4)[:20]} is out of range (1 to {MAX_PARTS} partitions "
                                        "of at least a byte, sizes and keys below 2^63)")
            tensors[m.group(1)] = (n, tot, first)
        for m in _BOUND_RE.finditer(text):
            bound = int(m.group(1)) if len(m.group(1)) <= 19 else 0
            if not 1 <= bound <= INT64_MAX:
                raise DproInputError(f, f"partition size {m.group(1)[:20]} is out of range (1 to 2^63-1 bytes)")
    if not tensors:
        return {}
    multi = [(n, tot) for n, tot, _ in tensors.values() if n > 1]
    if bound is None and multi:
        bound = max(-(-tot // n) for n, tot in multi)
        notes.append(f"partition size not in the logs; inferred {bound} bytes from the tensor sizes")
    out: dict[str, tuple[list[int], int]] = {}
    for name, (n, tot, first) in tensors.items():
        b = bound if (n > 1 and bound is not None) else tot
        parts = [b] * (n - 1) + [tot - b * (n - 1)]
        if parts[-1] <= 0 or parts[-1] > b:
            raise DproInputError(root, f"log: tensor '{name}' of {tot} bytes cannot have {n} partitions of {b} bytes")
        out[name] = (parts, first)
    return out


def _index_by_name(paths: list[Path]) -> dict[Path, int]:
    """Trailing number of each name when they are distinct, else the sorted order."""
    nums = [_TRAILING_INT.search(p.name) for p in paths]
    if all(nums) and len({int(m.group(1)) for m in nums}) == len(paths):  # type: ignore[union-attr]
        return {p: int(m.group(1)) for p, m in zip(paths, nums)}  # type: ignore[union-attr]
    return {p: i for i, p in enumerate(sorted(paths))}


def discover(root: Path) -> tuple[dict[str, tuple[int, dict[int, Path]]], list[Path]]:
    """Worker machines (name -> (worker id, local rank -> comm.json)) and server profiles."""
    if not root.exists():
        raise DproInputError(root, "no such file or directory")
    if not root.is_dir():
        raise DproInputError(root, "expected a BytePS trace directory (BYTEPS_TRACE_DIR)")

    def ranks(d: Path) -> dict[int, Path]:
        return {int(p.parent.name): p for p in d.glob("*/comm.json") if p.parent.name.isdigit()}

    machines: dict[str, tuple[int, dict[int, Path]]] = {}
    if ranks(root):
        machines[root.resolve().name or "machine0"] = (0, ranks(root))
    else:
        dirs = sorted(d for d in root.iterdir() if d.is_dir() and ranks(d))
        idx = _index_by_name(dirs)
        machines = {d.name: (idx[d], ranks(d)) for d in dirs}
    if not machines:
        raise DproInputError(root, "no BytePS comm.json found (expected <local_rank>/comm.json or <machine>/<local_rank>/comm.json)")
    servers = sorted(root.rglob("server*.json"))
    for p in servers:
        problem = regular_file_problem(p)
        if problem:
            raise DproInputError(p, f"{problem} (named like a server profile)")
    return machines, servers


