"""In-memory model of a gTrace (format spec: docs/gtrace.md).

Times are microseconds (float), sizes bytes (int), everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FORMAT_NAME = "gtrace"
FORMAT_VERSION = 1

#: Op categories. OTHER holds host work we cannot attribute (documented).
CATEGORIES = ("FW", "BW", "UPDATE", "IO", "COMM", "OTHER")

#: Communication sub-ops.
#: ALLREDUCE/ALLGATHER/REDUCESCATTER/BROADCAST/ALLTOALL/BARRIER/SENDRECV: one coarse op per
#: collective per rank (what gloo and NCCL kernels show). SEND/RECV: one chunk of a ring step.
#: PUSH_REQ/PUSH_RES/PULL_REQ/PULL_RES: parameter-server messages. IN/OUT: virtual ops that
#: join a tensor's local producer/consumer to its communication topology.
COARSE_SUB_OPS = (
    "ALLREDUCE",
    "ALLGATHER",
    "REDUCESCATTER",
    "BROADCAST",
    "ALLTOALL",
    "BARRIER",
    "SENDRECV",
)
SUB_OPS = COARSE_SUB_OPS + ("SEND", "RECV", "PUSH_REQ", "PUSH_RES", "PULL_REQ", "PULL_RES", "IN", "OUT")

ROLES = ("worker", "server", "scheduler")
SCHEMES = ("allreduce", "ps")


@dataclass(slots=True)
class Op:
    """One node of a local DFG: an op that runs once per iteration on one device queue."""

    id: str
    name: str
    cat: str
    device: str
    # Communication attributes (COMM ops only).
    sub_op: str | None = None
    tensor: str | None = None
    bytes: int = 0
    txn: str | None = None
    peer: int | None = None
    group: tuple[int, ...] | None = None
    #: the model layer (module path) the op belongs to, when the profiler knows it
    layer: str | None = None

    def to_json(self) -> dict:
        """The op as it appears in a ``*.dfg.json.gz`` file (docs/gtrace.md)."""
        d: dict = {"id": self.id, "name": self.name, "cat": self.cat, "device": self.device}
        if self.layer is not None:
            d["layer"] = self.layer
        if self.cat == "COMM":
            d.update(sub_op=self.sub_op, tensor=self.tensor, bytes=self.bytes, txn=self.txn)
            if self.peer is not None:
                d["peer"] = self.peer
            if self.group is not None:
                d["group"] = list(self.group)
        return d


@dataclass(slots=True)
class Event:
    """One execution of an op in one profiled step (absolute µs on the node's clock)."""

    op: str
    step: int
    ts: float
    dur: float


@dataclass(slots=True)
class NodeInfo:
    """A process of the job: a worker, a server or the scheduler."""

    name: str
    role: str
    rank: int
    host: str
    events: str = ""
    dfg: str = ""

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "role": self.role,
            "rank": self.rank,
            "host": self.host,
            "events": self.events,
            "dfg": self.dfg,
        }


@dataclass(slots=True)
class Tensor:
    """A gradient tensor: what is synchronised, where it is produced, how it travels."""

    name: str
    bytes: int
    shape: tuple[int, ...] = ()
    dtype: str = "float32"
    #: the local op that produces it (e.g. its AccumulateGrad), if known
    producer: str | None = None
    #: the COMM transaction (bucket / fused group) that carries it, if known
    txn: str | None = None

    def to_json(self) -> dict:
        d: dict = {"name": self.name, "bytes": self.bytes, "shape": list(self.shape), "dtype": self.dtype}
        if self.producer is not None:
            d["producer"] = self.producer
        if self.txn is not None:
            d["txn"] = self.txn
        return d


#: ``NodeTrace.meta`` key: the node's measured step period (µs) where its GPU, not its CPU,
#: sets it (a GPU-bound Kineto trace, docs/kineto.md); the measured iteration takes it
#: where it exceeds the step marker's duration
GPU_PERIOD_META = "gpu_period_us"


@dataclass
class NodeTrace:
    """Everything recorded for one node: local DFG, events, step windows."""

    info: NodeInfo
    ops: dict[str, Op] = field(default_factory=dict)
    edges: list[tuple[str, str]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    #: step -> (start µs, duration µs) as measured by the framework's step marker.
    steps: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: gradient tensors (recorded by dpro's profiler; empty for imported traces)
    tensors: list[Tensor] = field(default_factory=list)
    #: what the profiler knew about the node (optimizer type, versions, ...)
    meta: dict = field(default_factory=dict)
    #: the first profiled step as imported, kept or left out: ``{"step", "start", "end", "cpu_ops"}``
    #: (the set of ``layer/op`` names on its CPU threads); for shallow ranks
    #: (dpro.importers.recording.shallow); not written to disk
    first_step: dict | None = field(default=None, repr=False, compare=False)


@dataclass
class Manifest:
    """What the job was; see docs/gtrace.md."""

    framework: str
    scheme: str
    library: str
    world_size: int
    nodes: list[NodeInfo]
    steps: list[int]
    version: int = FORMAT_VERSION
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """The ``manifest.json`` of a gTrace directory (docs/gtrace.md)."""
        return {
            "format": FORMAT_NAME,
            "version": self.version,
            "framework": self.framework,
            "scheme": self.scheme,
            "library": self.library,
            "world_size": self.world_size,
            "nodes": [n.to_json() for n in self.nodes],
            "steps": list(self.steps),
            "meta": self.meta,
        }


@dataclass
class GTrace:
    """A whole gTrace held in memory."""

    manifest: Manifest
    nodes: dict[str, NodeTrace]
    #: Where it was loaded from (for messages); None when built in memory.
    source: str | None = None
    #: Human-readable notes gathered while importing (shown by `dpro replay`).
    notes: list[str] = field(default_factory=list)

    def workers(self) -> list[NodeTrace]:
        """Worker nodes sorted by rank."""
        return sorted((n for n in self.nodes.values() if n.info.role == "worker"), key=lambda n: n.info.rank)
