"""Parse a Horovod timeline (``HOROVOD_TIMELINE`` / ``horovodrun --timeline-filename``).

What Horovod writes (0.28.1, ``horovod/common/timeline.cc``), on the coordinator (rank 0)
only, as a Chrome-trace JSON *array* appended record by record:

* ``{"name": "process_name", "ph": "M", "pid": 0, "args":
  {"start_time_since_epoch_in_micros": N}}`` first: the Unix-epoch wall-clock time (µs,
  ``system_clock``) of the timeline's origin. Every ``ts`` in the file is µs since that
  origin (``steady_clock``), so ``N + ts`` is Unix-epoch µs, the clock ``torch.profiler``
  uses too (a Kineto trace's ``ts + baseTimeNanoseconds / 1000``).
* Each tensor is modelled as a process: ``process_name`` metadata maps a ``pid`` (1, 2,
  ... in order of first appearance) to the tensor name (``allreduce.<param>`` for the
  gradients ``hvd.DistributedOptimizer`` reduces, ``broadcast.<key>``, ``barrier.noname``,
  ...).
* Per tensor and operation, nested ``B``/``E`` pairs (``E`` records have no name):

  - ``NEGOTIATE_<REQUEST>`` (``NEGOTIATE_ALLREDUCE``, ``NEGOTIATE_BROADCAST``,
    ``NEGOTIATE_BARRIER``...): the coordinator waiting until every rank submitted the
    tensor; inside, ``X`` records named by a rank (``"0"``, ``"1"``) mark when that rank
    was ready (only while the response cache misses; later steps have no ``X``);
  - then the operation itself, ``B <RESPONSE>`` (``ALLREDUCE``, ``BROADCAST``...) ...
    ``E`` (args ``dtype``, ``shape``), containing the activities Horovod ran for it in
    sequence: ``INIT_FUSION_BUFFER`` (first fused op only), ``MEMCPY_IN_FUSION_BUFFER``,
    the communication (``GLOO_ALLREDUCE``, ``GLOO_BCAST``, ``MPI_ALLREDUCE``,
    ``NCCL_ALLREDUCE``...), ``MEMCPY_OUT_FUSION_BUFFER``; GPU builds add ``QUEUE``,
    ``WAIT_FOR_DATA``... Barriers and joins are negotiated but never "executed".
* ``{"ph": "i", "name": "CYCLE_START", "s": "g"}`` markers (no pid) with
  ``HOROVOD_TIMELINE_MARK_CYCLES=1``.

The file is valid JSON only between writes: Horovod ends every record with ``}]`` and
seeks back over the ``]`` to append the next one (the seek also flushes, so even a job
killed with SIGKILL usually leaves a valid file). A writer dying inside a write, or a copy
taken at the wrong moment, lacks the closing ``]`` or ends inside a record: both are
accepted (``truncated`` is set, the partial record dropped); anything else that is not
JSON is a :class:`~dpro.errors.DproInputError`. Operations still open at the end (e.g.
the negotiation of a final ``hvd.barrier()``) are listed in ``unfinished``.

Fusion groups: Horovod executes one *response* at a time; a response lists the tensors
fused into one operation, and ``PerformOperation`` writes ``B <RESPONSE>`` for all its
tensors back to back before any activity starts (and every activity is then started for
all of them together). So a fusion group is a maximal run of consecutive top-level
``B <RESPONSE>`` records of the same kind, broken by any other ``B`` record, a marker, or
the end of a member's operation (``E`` and ``X`` records of other tensors do not break it).
A group's members' communication phases are checked to overlap (a warning otherwise).

All times are in µs on the timeline's own clock (``ts``) unless a name says ``epoch``;
sizes are in bytes.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import orjson

from dpro.errors import DproInputError
from dpro.jsonio import MAX_DEPTH, read_bytes, too_deep

log = logging.getLogger(__name__)

#: Activity names that move data between ranks (the "comm" phase of an operation).
COMM_PHASE_RE = re.compile(r"^(GLOO|MPI|NCCL|CCL|DDL)_[A-Z_]+$")
NEGOTIATE_PREFIX = "NEGOTIATE_"

#: Bytes per element of Horovod's ``DataType_Name`` spellings.
DTYPE_BYTES = {
    "uint8": 1, "int8": 1, "bool": 1,
    "uint16": 2, "int16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "float32": 4,
    "int64": 8, "float64": 8,
}


@dataclass
class Phase:
    """One named interval of an operation (a negotiation or an activity), µs."""

    name: str
    start_us: float
    end_us: float

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us

    @property
    def is_comm(self) -> bool:
        return bool(COMM_PHASE_RE.match(self.name))


@dataclass
class TensorOp:
    """One collective operation on one tensor (e.g. one step's all-reduce of a gradient).

    ``phases`` are in time order: the ``NEGOTIATE_*`` phase (when it was recorded) followed
    by the activities inside the operation. ``exec_start_us``/``exec_end_us`` bound the
    top-level ``B <kind>`` ... ``E`` pair. Barriers and joins have no ``B <kind>`` record
    (``exec_start_us`` is None) but do have the ``E`` (``exec_end_us``); they belong to no
    fusion group. ``start_us``/``end_us`` span everything.
    """

    tensor: str
    pid: int
    kind: str  # ALLREDUCE, BROADCAST, ALLGATHER, BARRIER, ...
    index: int  # n-th operation of this tensor in the file (0-based)
    phases: list[Phase] = field(default_factory=list)
    exec_start_us: float | None = None
    exec_end_us: float | None = None
    rank_ready_us: dict[int, float] = field(default_factory=dict)
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    fusion_group: int | None = None  # index into HorovodTimeline.fusion_groups

    @property
    def start_us(self) -> float:
        return min([p.start_us for p in self.phases] + ([self.exec_start_us] if self.exec_start_us is not None else []))

    @property
    def end_us(self) -> float:
        return max([p.end_us for p in self.phases] + ([self.exec_end_us] if self.exec_end_us is not None else []))

    @property
    def negotiation(self) -> Phase | None:
        return next((p for p in self.phases if p.name.startswith(NEGOTIATE_PREFIX)), None)

    @property
    def comm(self) -> Phase | None:
        """The (first) communication phase, e.g. ``GLOO_ALLREDUCE``."""
        return next((p for p in self.phases if p.is_comm), None)

    @property
    def size_bytes(self) -> int | None:
        """Tensor size from the final ``dtype``/``shape`` args (None when unknown)."""
        if self.shape is None or self.dtype not in DTYPE_BYTES:
            return None
        n = 1
        for d in self.shape:
            n *= d
        return n * DTYPE_BYTES[self.dtype]


@dataclass
class FusionGroup:
    """Tensors Horovod reduced together in one (fused) operation: one response."""

    index: int
    kind: str
    ops: list[TensorOp]

    @property
    def tensors(self) -> list[str]:
        return [op.tensor for op in self.ops]

    @property
    def exec_start_us(self) -> float:
        return min(op.exec_start_us for op in self.ops if op.exec_start_us is not None)

    @property
    def exec_end_us(self) -> float:
        return max(op.exec_end_us for op in self.ops if op.exec_end_us is not None)

    @property
    def comm_name(self) -> str | None:
        c = self.ops[0].comm
        return c.name if c else None

    @property
    def comm_start_us(self) -> float | None:
        cs = [op.comm.start_us for op in self.ops if op.comm is not None]
        return min(cs) if cs else None

    @property
    def comm_end_us(self) -> float | None:
        cs = [op.comm.end_us for op in self.ops if op.comm is not None]
        return max(cs) if cs else None

    @property
    def size_bytes(self) -> int | None:
        sizes = [op.size_bytes for op in self.ops]
        return None if any(s is None for s in sizes) else sum(sizes)  # type: ignore[arg-type]


@dataclass
class HorovodTimeline:
    """A parsed Horovod timeline (rank 0's view of every collective operation)."""

    path: Path
    #: Unix-epoch µs of ``ts == 0`` (pid 0's ``start_time_since_epoch_in_micros``), if present.
    start_epoch_us: int | None
    #: tensor name -> its operations in time order
    tensors: dict[str, list[TensorOp]]
    #: tensor name -> Horovod's pid for it
    pids: dict[str, int]
    fusion_groups: list[FusionGroup]
    #: ``ts`` of ``CYCLE_START`` markers (only with HOROVOD_TIMELINE_MARK_CYCLES=1)
    cycle_starts_us: list[float]
    #: the file lacked its closing ``]`` or ended inside a record
    truncated: bool = False
    #: operations not finished at the end of the file, not in ``tensors``: (tensor, name of
    #: the open phase or of a negotiation never followed by its execution, start)
    unfinished: list[tuple[str, str, float]] = field(default_factory=list)

    def ops(self) -> Iterator[TensorOp]:
        """Every operation, sorted by start time."""
        yield from sorted((op for ops in self.tensors.values() for op in ops), key=lambda o: (o.start_us, o.pid))

    def to_epoch_us(self, ts_us: float) -> float:
        """Unix-epoch µs of a timeline ``ts`` (needs ``start_epoch_us``)."""
        if self.start_epoch_us is None:
            raise DproInputError(self.path, "no start_time_since_epoch_in_micros record: cannot map to wall-clock time")
        return self.start_epoch_us + ts_us

    def offset_to_kineto_us(self, base_time_ns: int) -> float:
        """What to add to a timeline ``ts`` to put it on a Kineto trace's ``ts`` axis.

        ``base_time_ns`` is the trace's ``baseTimeNanoseconds`` (Kineto's ``ts`` are µs
        since it, Unix-epoch). Valid for the trace of a process on the same host (rank 0).
        """
        return self.to_epoch_us(0) - base_time_ns / 1000.0


# ----------------------------------------------------------------------------- loading


def _fail(path: Path, problem: str) -> DproInputError:
    """The one-line error for a bad file (newlines from names or decoder messages flattened)."""
    return DproInputError(path, " ".join(problem.split("\n")))


def _decode_records(path: Path, raw: bytes) -> tuple[list[Any], bool]:
    """The JSON array of records, tolerating a missing ``]`` / truncated last record;
    nesting deeper than dpro.jsonio.MAX_DEPTH is refused (no recursion on input data)."""
    data, partial = _decode_any(path, raw)
    if too_deep(data):
        raise _fail(path, f"lists/objects nested more than {MAX_DEPTH} deep")
    return data, partial


def _decode_any(path: Path, raw: bytes) -> tuple[list[Any], bool]:
    body = raw.strip()
    if not body:
        raise _fail(path, "empty file (Horovod writes nothing before the first collective operation)")
    if body[:1] != b"[":
        what = "a JSON object (a Chrome/Kineto trace?)" if body[:1] == b"{" else "not JSON"
        raise _fail(path, f"not a Horovod timeline: expected a JSON array of trace records, found {what}")
    try:
        data = orjson.loads(body)
        return data, False
    except orjson.JSONDecodeError as e:
        first_err = str(e)
    # Writer stopped between records: "...}" or "...}," without the closing bracket.
    head = body[:-1] if body.endswith(b",") else body
    try:
        data = orjson.loads(head + b"]")
        log.warning("%s: no closing ']' (timeline still being written or job killed); read anyway", path)
        return data, True
    except orjson.JSONDecodeError:
        pass
    # Writer stopped inside a record: cut after the last complete one.
    cut = head.rfind(b"},")
    tail = head[cut + 2:].lstrip() if cut >= 0 else b""
    if cut >= 0 and tail[:1] == b"{":
        try:
            data = orjson.loads(head[: cut + 1] + b"]")
            log.warning("%s: truncated last record (%d bytes) dropped", path, len(tail))
            return data, True
        except orjson.JSONDecodeError:
            pass
    raise _fail(path, f"invalid JSON in Horovod timeline: {first_err}")


def _num(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _parse_shape(s: object) -> tuple[int, ...] | None:
    if not isinstance(s, str):
        return None
    s = s.strip()
    if not (s.startswith("[") and s.endswith("]")):
        return None
    inner = s[1:-1].strip()
    if not inner:
        return ()
    try:
        return tuple(int(x) for x in inner.split(","))
    except ValueError:
        return None


@dataclass
class _Open:
    """An unmatched ``B`` record on a pid's stack."""

    role: str  # "neg" | "op" | "act"
    name: str
    start: float
    op: TensorOp | None = None  # for "op" and "act"
    neg: TensorOp | None = None  # for "neg": the TensorOp the negotiation belongs to (provisional)


class _Builder:
    """Walks the records in file order (= Horovod's enqueue order)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.names: dict[int, str] = {}
        self.start_epoch_us: int | None = None
        self.stacks: dict[int, list[_Open]] = {}
        self.done: dict[str, list[TensorOp]] = {}
        self.pending_neg: dict[str, TensorOp] = {}  # negotiated, operation not started yet
        self.markers: list[float] = []
        self.groups: list[list[TensorOp]] = []
        self.run: list[TensorOp] | None = None  # the fusion group being collected
        self.run_kind = ""
        self.unmatched_e = 0
        self.unknown_ph: dict[str, int] = {}

    # -- helpers
    def tensor(self, pid: int) -> str:
        name = self.names.get(pid)
        if name is None:
            name = f"<pid {pid}>"
            self.names[pid] = name
            log.warning("%s: pid %d has no process_name record; calling it %r", self.path, pid, name)
        return name

    def finish(self, op: TensorOp) -> None:
        ops = self.done.setdefault(op.tensor, [])
        op.index = len(ops)
        ops.append(op)

    def close_run(self) -> None:
        self.run = None

    # -- record kinds
    def meta(self, i: int, r: dict) -> None:
        pid, args = r.get("pid"), r.get("args")
        if r.get("name") != "process_name" or not isinstance(args, dict):
            return
        if not _int(pid):
            raise _fail(self.path, f"record {i}: process_name without an integer 'pid'")
        if "name" in args:
            if not isinstance(args["name"], str):
                raise _fail(self.path, f"record {i}: process_name 'args.name' is not a string")
            self.names[pid] = args["name"]
        start = args.get("start_time_since_epoch_in_micros")
        if start is not None:
            if not _num(start):
                raise _fail(self.path, f"record {i}: start_time_since_epoch_in_micros is not a number")
            self.start_epoch_us = int(start)

    def begin(self, i: int, pid: int, name: str, ts: float) -> None:
        stack = self.stacks.setdefault(pid, [])
        t = self.tensor(pid)
        if not stack:
            if name.startswith(NEGOTIATE_PREFIX):
                self.close_run()
                prev = self.pending_neg.pop(t, None)
                if prev is not None:  # negotiated but never executed (barrier, join)
                    self.finish(prev)
                op = TensorOp(t, pid, name[len(NEGOTIATE_PREFIX):], -1)
                stack.append(_Open("neg", name, ts, neg=op))
                return
            op = self.pending_neg.pop(t, None)
            if op is not None and op.kind != name:
                self.finish(op)
                op = None
            if op is None:
                op = TensorOp(t, pid, name, -1)
            op.exec_start_us = ts
            stack.append(_Open("op", name, ts, op=op))
            if self.run is not None and self.run_kind == name and all(o.tensor != t for o in self.run):
                self.run.append(op)
            else:
                self.run = [op]
                self.run_kind = name
                self.groups.append(self.run)
            return
        self.close_run()
        top = stack[-1]
        stack.append(_Open("act", name, ts, op=top.op if top.role != "neg" else top.neg))

    def end(self, i: int, pid: int, ts: float, args: object) -> None:
        stack = self.stacks.get(pid)
        if not stack:
            t = self.tensor(pid)
            if t in self.pending_neg:
                # BARRIER/JOIN: Horovod writes no 'B <kind>' for them, but does write the 'E'.
                op = self.pending_neg.pop(t)
                op.exec_end_us = ts
                self.finish(op)
            else:
                self.unmatched_e += 1
            return
        o = stack.pop()
        if ts < o.start:
            raise _fail(self.path, f"record {i}: 'E' at ts {ts:g} before its 'B' {o.name} at {o.start:g} (pid {pid})")
        if o.role == "neg":
            assert o.neg is not None
            o.neg.phases.insert(0, Phase(o.name, o.start, ts))
            self.pending_neg[o.neg.tensor] = o.neg
        elif o.role == "act":
            if o.op is not None:
                o.op.phases.append(Phase(o.name, o.start, ts))
        else:
            op = o.op
            assert op is not None
            op.exec_end_us = ts
            if isinstance(args, dict):
                dt = args.get("dtype")
                op.dtype = dt if isinstance(dt, str) else None
                op.shape = _parse_shape(args.get("shape"))
            if self.run is not None and any(m is op for m in self.run):
                self.close_run()
            self.finish(op)

    def instant(self, i: int, r: dict, ts: float) -> None:
        pid = r.get("pid")
        name = r.get("name")
        if _int(pid) and self.stacks.get(pid):
            top = self.stacks[pid][-1]
            if top.role == "neg" and isinstance(name, str) and name.isdigit():
                assert top.neg is not None
                top.neg.rank_ready_us[int(name)] = ts
                return
        if r.get("ph") == "i":
            self.close_run()
            if name == "CYCLE_START":
                self.markers.append(ts)

    # -- driver
    def feed(self, records: list[Any]) -> None:
        for i, r in enumerate(records):
            if not isinstance(r, dict):
                raise _fail(self.path, f"record {i} is not a JSON object")
            ph = r.get("ph")
            if ph == "M":
                self.meta(i, r)
                continue
            if ph not in ("B", "E", "X", "i", "I"):
                self.unknown_ph[str(ph)] = self.unknown_ph.get(str(ph), 0) + 1
                continue
            ts = r.get("ts")
            if not _num(ts):
                raise _fail(self.path, f"record {i} (ph {ph!r}): 'ts' is missing or not a number ({ts!r})")
            ts = float(ts)
            if ph in ("X", "i", "I"):
                self.instant(i, r, ts)
                continue
            pid = r.get("pid")
            if not _int(pid):
                raise _fail(self.path, f"record {i} (ph {ph!r}): 'pid' is missing or not an integer ({pid!r})")
            if ph == "B":
                name = r.get("name")
                if not isinstance(name, str) or not name:
                    raise _fail(self.path, f"record {i}: 'B' record without a name")
                self.begin(i, pid, name, ts)
            else:
                self.end(i, pid, ts, r.get("args"))

    def result(self, truncated: bool) -> HorovodTimeline:
        unfinished: list[tuple[str, str, float]] = []
        for op in self.pending_neg.values():  # negotiated, not executed (yet) when the file ends
            neg = op.negotiation
            assert neg is not None
            unfinished.append((op.tensor, neg.name, neg.start_us))
        open_ops: set[int] = set()
        for pid, stack in self.stacks.items():
            for o in stack:
                unfinished.append((self.tensor(pid), o.name, o.start))
                if o.op is not None:
                    open_ops.add(id(o.op))
        if unfinished:
            log.info("%s: %d operation(s) still open at the end of the timeline, ignored", self.path, len(unfinished))
        if self.unmatched_e:
            log.warning("%s: %d 'E' record(s) without a matching 'B' ignored", self.path, self.unmatched_e)
        if self.unknown_ph:
            log.debug("%s: ignored records by phase: %s", self.path, self.unknown_ph)
        tensors = {t: sorted(ops, key=lambda o: o.start_us) for t, ops in self.done.items()}
        for ops in tensors.values():
            for k, op in enumerate(ops):
                op.index = k
        groups: list[FusionGroup] = []
        for members in self.groups:
            members = [m for m in members if id(m) not in open_ops and m.exec_end_us is not None]
            if not members:
                continue
            g = FusionGroup(len(groups), members[0].kind, members)
            for m in members:
                m.fusion_group = g.index
            _check_group(self.path, g)
            groups.append(g)
        if not tensors and self.start_epoch_us is None and not self.names:
            raise _fail(self.path, "not a Horovod timeline: no process_name records and no tensor operations")
        pids = {name: pid for pid, name in self.names.items() if pid != 0}
        return HorovodTimeline(
            path=self.path,
            start_epoch_us=self.start_epoch_us,
            tensors=tensors,
            pids=pids,
            fusion_groups=groups,
            cycle_starts_us=self.markers,
            truncated=truncated,
            unfinished=unfinished,
        )


def _check_group(path: Path, g: FusionGroup) -> None:
    """Members of one fused response must communicate at the same time."""
    comms = [op.comm for op in g.ops if op.comm is not None]
    if len(comms) > 1 and max(c.start_us for c in comms) > min(c.end_us for c in comms):
        log.warning("%s: fusion group %d (%s): communication phases of its %d tensors do not overlap",
                    path, g.index, g.kind, len(g.ops))


def parse_horovod_timeline(raw: bytes, path: str | Path = "<timeline>") -> HorovodTimeline:
    """Parse the bytes of a Horovod timeline (see the module docstring)."""
    p = Path(path)
    records, truncated = _decode_records(p, raw)
    if isinstance(records, dict):
        raise _fail(p, "not a Horovod timeline: expected a JSON array of trace records, found a JSON object")
    if not isinstance(records, list):
        raise _fail(p, "not a Horovod timeline: expected a JSON array of trace records")
    b = _Builder(p)
    b.feed(records)
    tl = b.result(truncated)
    log.debug("%s: %d tensors, %d operations, %d fusion groups", p, len(tl.tensors),
              sum(len(v) for v in tl.tensors.values()), len(tl.fusion_groups))
    return tl


def load_horovod_timeline(path: str | Path) -> HorovodTimeline:
    """Read and parse a Horovod timeline file (``.gz`` is decompressed transparently)."""
    p = Path(path)
    return parse_horovod_timeline(read_bytes(p), p)
