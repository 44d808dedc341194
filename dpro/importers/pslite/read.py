"""Reading the ps-lite patch's JSON-lines message traces (format: docs/pslite.md): one
:class:`ProcessTrace` per process, every line checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from dpro.errors import DproInputError
from dpro.jsonio import read_bytes

FORMAT_NAME = "dpro-pslite-trace"
FORMAT_VERSION = 1
FILE_GLOB = "pslite.*.jsonl"
DATA_KINDS = ("push_req", "push_res", "pull_req", "pull_res")
KINDS = DATA_KINDS + ("control", "simple")
ROLES = ("worker", "server", "scheduler")


@dataclass(slots=True)
class Record:
    """One message as one process saw it (µs on that process's host clock)."""

    line: int
    ts: float
    dir: str
    kind: str
    node: int | None
    sender: int | None
    recver: int | None
    app: int | None
    customer: int | None
    msg_ts: int | None
    mid: str
    seq: int
    wire_bytes: int
    dur_us: float
    keys: tuple[int, ...] = ()
    nkeys: int = 0
    data_bytes: int = 0
    val_bytes: int = 0
    cmd: str | None = None


@dataclass
class ProcessTrace:
    """One process's file: who it is and what it sent and received."""

    path: Path
    host: str
    pid: int
    role: str
    records: list[Record] = field(default_factory=list)
    #: ps-lite node id (from the data messages; None when it sent or received none)
    node_id: int | None = None

    @property
    def rank(self) -> int:
        """ps-lite's Postoffice::IDtoRank."""
        return max(((self.node_id or 0) - 8) // 2, 0)

    @property
    def name(self) -> str:
        return f"{self.role}{self.rank}"


# --------------------------------------------------------------------------- reading


def _field(d: dict, key: str, typ: tuple[type, ...], path: Path, line: int, nullable: bool = False, signed: bool = False) -> Any:
    if key not in d:
        raise DproInputError(path, f"line {line}: missing field '{key}'")
    v = d[key]
    if v is None and nullable:
        return None
    if not isinstance(v, typ) or isinstance(v, bool):
        raise DproInputError(path, f"line {line}: field '{key}' has the wrong type ({type(v).__name__})")
    if isinstance(v, (int, float)) and (v != v or abs(v) == float("inf") or (v < 0 and not signed)):
        raise DproInputError(path, f"line {line}: field '{key}' must not be negative ({v})")
    return v


def _parse_header(d: Any, path: Path) -> ProcessTrace:
    if not isinstance(d, dict) or d.get("format") != FORMAT_NAME:
        raise DproInputError(path, f"line 1: not a ps-lite trace (expected a header with \"format\": \"{FORMAT_NAME}\")")
    version = _field(d, "version", (int,), path, 1)
    if version > FORMAT_VERSION:
        raise DproInputError(path, f"line 1: trace version {version} is newer than this dpro supports ({FORMAT_VERSION})")
    if d.get("unit") != "us" or d.get("clock") != "CLOCK_REALTIME":
        raise DproInputError(path, "line 1: expected \"unit\": \"us\" and \"clock\": \"CLOCK_REALTIME\"")
    role = _field(d, "role", (str,), path, 1)
    if role not in ROLES:
        raise DproInputError(path, f"line 1: unknown role '{role}' (DMLC_ROLE; expected one of {', '.join(ROLES)})")
    return ProcessTrace(path=path, host=_field(d, "host", (str,), path, 1), pid=_field(d, "pid", (int,), path, 1), role=role)


def _parse_record(d: Any, path: Path, n: int) -> Record:
    if not isinstance(d, dict):
        raise DproInputError(path, f"line {n}: expected a JSON object")
    num = (int, float)
    direction = _field(d, "dir", (str,), path, n)
    if direction not in ("send", "recv"):
        raise DproInputError(path, f"line {n}: field 'dir' must be \"send\" or \"recv\", not {direction!r}")
    kind = _field(d, "kind", (str,), path, n)
    if kind not in KINDS:
        raise DproInputError(path, f"line {n}: unknown message kind {kind!r} (expected one of {', '.join(KINDS)})")
    rec = Record(
        line=n,
        ts=float(_field(d, "ts", num, path, n)),
        dir=direction,
        kind=kind,
        node=_field(d, "node", (int,), path, n, nullable=True),
        sender=_field(d, "sender", (int,), path, n, nullable=True),
        recver=_field(d, "recver", (int,), path, n, nullable=True),
        app=_field(d, "app", (int,), path, n, nullable=True),
        customer=_field(d, "customer", (int,), path, n, nullable=True),
        msg_ts=_field(d, "msg_ts", (int,), path, n, nullable=True),
        mid=_field(d, "mid", (str,), path, n),
        seq=_field(d, "seq", (int,), path, n),
        wire_bytes=_field(d, "wire_bytes", (int,), path, n),
        dur_us=float(_field(d, "dur_us", num, path, n)),
    )
    if kind == "control":
        rec.cmd = _field(d, "cmd", (str,), path, n)
    elif kind in DATA_KINDS:
        keys = _field(d, "keys", (list,), path, n)
        if not all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in keys):
            raise DproInputError(path, f"line {n}: field 'keys' must be a list of non-negative integers")
        rec.keys = tuple(keys)
        rec.nkeys = _field(d, "nkeys", (int,), path, n)
        if rec.nkeys < len(keys) or (rec.nkeys > 0 and not keys):
            raise DproInputError(path, f"line {n}: 'nkeys' {rec.nkeys} does not match the {len(keys)} key(s) listed")
        rec.data_bytes = _field(d, "data_bytes", (int,), path, n)
        rec.val_bytes = _field(d, "val_bytes", (int,), path, n)
        _field(d, "head", (int,), path, n, nullable=True, signed=True)
        for k in ("node", "sender", "recver", "app", "customer", "msg_ts"):
            if getattr(rec, k) is None:
                raise DproInputError(path, f"line {n}: a {kind} message without '{k}'")
        me = rec.sender if direction == "send" else rec.recver
        if me != rec.node:
            raise DproInputError(path, f"line {n}: node {rec.node} is not the message's {'sender' if direction == 'send' else 'receiver'} ({me})")
    return rec


def read_trace_file(path: str | Path) -> ProcessTrace:
    """Parse and validate one process's trace; DproInputError names the file and line."""
    path = Path(path)
    lines = read_bytes(path).split(b"\n")
    pt: ProcessTrace | None = None
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            if i < len(lines):  # only the final newline may leave an empty line
                raise DproInputError(path, f"line {i}: empty line")
            continue
        try:
            d = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise DproInputError(path, f"line {i}: not valid JSON ({e})") from None
        if pt is None:
            if i != 1:
                raise DproInputError(path, "line 1: missing header")
            pt = _parse_header(d, path)
            continue
        rec = _parse_record(d, path, i)
        if rec.kind in DATA_KINDS:
            if pt.node_id is None:
                pt.node_id = rec.node
            elif rec.node != pt.node_id:
                raise DproInputError(path, f"line {i}: node id {rec.node} differs from this process's earlier id {pt.node_id}")
        pt.records.append(rec)
    if pt is None:
        raise DproInputError(path, "empty file: no header")
    if pt.node_id is not None:
        expect = "worker" if pt.node_id % 2 else "server"
        if pt.node_id < 8 or pt.role != expect:
            raise DproInputError(path, f"node id {pt.node_id} does not belong to a {pt.role} (ps-lite: servers 8, 10, ..., workers 9, 11, ...)")
    return pt


def read_trace_dir(root: str | Path) -> list[ProcessTrace]:
    """Every ``pslite.*.jsonl`` of ``root`` (a directory), parsed."""
    root = Path(root)
    if not root.is_dir():
        raise DproInputError(root, "not a directory")
    files = sorted(root.glob(FILE_GLOB))
    if not files:
        raise DproInputError(root, f"no ps-lite trace files ({FILE_GLOB}); was PS_TRACE_DIR set?")
    procs = [read_trace_file(f) for f in files]
    seen: dict[int, Path] = {}
    for p in procs:
        if p.node_id is not None:
            if p.node_id in seen:
                raise DproInputError(p.path, f"node id {p.node_id} also in {seen[p.node_id].name} (traces of two jobs in one directory?)")
            seen[p.node_id] = p.path
    return procs


