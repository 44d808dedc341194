"""Reading the plugin's JSON-lines files (format: ``native/nccl_patch/README.md``) and
choosing the communicator to replay."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from dpro.errors import DproInputError, brief
from dpro.jsonio import read_bytes

FORMAT_NAME = "dpro-nccl-trace"
FORMAT_VERSION = 1

DTYPE_BYTES = {
    "ncclInt8": 1, "ncclUint8": 1, "ncclFloat8e4m3": 1, "ncclFloat8e5m2": 1,
    "ncclFloat16": 2, "ncclBfloat16": 2,
    "ncclInt32": 4, "ncclUint32": 4, "ncclFloat32": 4,
    "ncclInt64": 8, "ncclUint64": 8, "ncclFloat64": 8,
}


# --------------------------------------------------------------------------- records


@dataclass(slots=True)
class Step:
    """One network step (chunk) of a proxy op; times in ns since the epoch (None: not seen).

    Send: ``t0`` buffer posted, ``s1`` waiting for the GPU, ``s2`` data ready (waiting for
    the receiver's credit), ``s3`` posted to the network, ``t1`` completed.
    Receive: ``t0`` started, ``s1`` receive posted, ``s2`` data arrived, ``s3`` visible to
    the GPU, ``t1`` consumed by the GPU.
    """

    index: int
    bytes: int
    t0: int | None
    s1: int | None
    s2: int | None
    s3: int | None
    t1: int | None
    open: bool = False

    def span(self, is_send: bool) -> tuple[int, int] | None:
        """(start, end) ns of the step as a chunk op (see the module doc), or None."""
        if is_send:
            start = self.s3 if self.s3 is not None else self.s2 if self.s2 is not None else self.t0
            end = self.t1
        else:
            start = self.s2 if self.s2 is not None else self.t1
            end = self.s3 if self.s3 is not None else start
        if start is None or end is None:
            return None
        return start, max(start, end)


@dataclass(slots=True)
class ProxyOp:
    """A channel's network sends to (or receives from) one peer for one collective."""

    id: int
    coll: int
    channel: int
    peer: int
    is_send: bool
    nsteps: int
    chunk: int
    remote: bool
    t0: int | None
    t1: int | None
    open: bool = False
    steps: dict[int, Step] = field(default_factory=dict)


@dataclass(slots=True)
class Coll:
    """A collective (or, with ``p2p``, a send/recv) as NCCL enqueued it on one rank."""

    id: int
    seq: int
    func: str
    count: int
    dtype: str
    root: int
    algo: str
    proto: str
    nch: int
    rank: int
    t0: int | None
    t1: int | None
    p2p: bool = False
    open: bool = False
    ops: list[ProxyOp] = field(default_factory=list)
    kernel_channels: list[dict] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return self.count * DTYPE_BYTES.get(self.dtype, 0)


@dataclass
class Comm:
    """One communicator as one process saw it."""

    serial: int
    hash: str
    name: str
    nnodes: int
    nranks: int
    rank: int
    interface: str
    t: int
    colls: dict[int, Coll] = field(default_factory=dict)
    summary: dict | None = None

    def collectives(self) -> list[Coll]:
        """The collectives (not p2p), in enqueue order."""
        return sorted((c for c in self.colls.values() if not c.p2p), key=lambda c: (c.t0 or 0, c.id))


@dataclass
class PluginFile:
    """One rank's (one process's) trace file."""

    path: Path
    pid: int
    host: str
    #: the job rank from the environment (RANK, ...), -1 if it was not set
    rank: int
    comms: dict[int, Comm] = field(default_factory=dict)
    #: (step, ns since the epoch) from dpro_nccl_trace_mark_step
    marks: list[tuple[int, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def dropped(self) -> dict[str, int]:
        """Drops per reason over the file's communicators (from their summaries)."""
        out: dict[str, int] = defaultdict(int)
        for c in self.comms.values():
            for k, v in ((c.summary or {}).get("dropped") or {}).items():
                out[k] += int(v)
        return dict(out)


def _rel(v: object, base: int, where: str) -> int | None:
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{where}: not an integer time ({brief(v)})")
    return base + v


def read_plugin_file(path: str | Path) -> PluginFile:
    """Parse one plugin output file (``.jsonl``, optionally gzipped)."""
    path = Path(path)
    lines = read_bytes(path).splitlines()
    pf: PluginFile | None = None
    steps: list[tuple[int, int, Step]] = []  # (comm, op id, step)
    ops: list[tuple[int, ProxyOp]] = []
    kchs: list[tuple[int, int, dict]] = []
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            d = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            if n == len(lines) and pf is not None:
                pf.notes.append(f"{path.name}: last line truncated (writer killed?); ignored")
                break
            raise DproInputError(path, f"line {n}: invalid JSON ({e})") from None
        if not isinstance(d, dict):
            raise DproInputError(path, f"line {n}: not a JSON object")
        typ = d.get("type")
        try:
            if pf is None:
                if typ != "header" or d.get("format") != FORMAT_NAME:
                    raise DproInputError(path, f"line {n}: not a dpro NCCL plugin trace (no '{FORMAT_NAME}' header)")
                if int(d.get("version", 0)) > FORMAT_VERSION:
                    raise DproInputError(path, f"format version {d['version']} is newer than this reader ({FORMAT_VERSION})")
                pf = PluginFile(path, int(d.get("pid", 0)), str(d.get("host", "")), int(d.get("rank", -1)))
                continue
            if typ == "header":
                continue
            if typ == "mark":
                pf.marks.append((int(d["step"]), int(d["t"])))
                continue
            cm = int(d["comm"])
            if typ == "comm":
                pf.comms[cm] = Comm(cm, str(d.get("hash", "")), str(d.get("name", "")), int(d.get("nnodes", 0)),
                                    int(d.get("nranks", 0)), int(d.get("rank", -1)), str(d.get("interface", "")),
                                    int(d["t"]))
                continue
            comm = pf.comms.get(cm)
            if comm is None:
                raise DproInputError(path, f"line {n}: record of communicator {cm} before its 'comm' line")
            base = comm.t
            if typ in ("coll", "p2p"):
                c = Coll(
                    id=int(d["id"]), seq=int(d.get("seq", 0)), func=str(d["func"]), count=int(d.get("count", 0)),
                    dtype=str(d.get("dtype", "")), root=int(d.get("root", d.get("peer", -1))),
                    algo=str(d.get("algo", "")), proto=str(d.get("proto", "")), nch=int(d.get("nch", 0)),
                    rank=int(d.get("rank", comm.rank)), t0=_rel(d.get("t0"), base, "t0"), t1=_rel(d.get("t1"), base, "t1"),
                    p2p=typ == "p2p", open=bool(d.get("open")),
                )
                comm.colls[c.id] = c
            elif typ == "op":
                ops.append((cm, ProxyOp(
                    id=int(d["id"]), coll=int(d["coll"]), channel=int(d["ch"]), peer=int(d["peer"]),
                    is_send=bool(d["send"]), nsteps=int(d.get("nsteps", 0)), chunk=int(d.get("chunk", 0)),
                    remote=bool(d.get("remote")), t0=_rel(d.get("t0"), base, "t0"), t1=_rel(d.get("t1"), base, "t1"),
                    open=bool(d.get("open")),
                )))
            elif typ == "step":
                t = d["t"]
                if not isinstance(t, list) or len(t) != 5:
                    raise ValueError("'t' must be a list of 5 times")
                steps.append((cm, int(d["op"]), Step(
                    int(d["step"]), int(d.get("bytes", 0)), *(_rel(x, base, "t") for x in t), open=bool(d.get("open")),
                )))
            elif typ == "kch":
                kchs.append((cm, int(d["coll"]), {
                    "channel": int(d["ch"]), "gpu0": int(d.get("gpu0") or 0), "gpu1": int(d.get("gpu1") or 0),
                    "t0": _rel(d.get("t0"), base, "t0"), "t1": _rel(d.get("t1"), base, "t1"),
                }))
            elif typ == "summary":
                comm.summary = d
            # other types: newer writers; ignored
        except DproInputError:
            raise
        except (KeyError, ValueError, TypeError) as e:
            raise DproInputError(path, f"line {n} ({typ}): bad record ({type(e).__name__}: {e})") from None
    if pf is None:
        raise DproInputError(path, "empty file: no header line")
    by_op: dict[tuple[int, int], ProxyOp] = {}
    for cm, op in ops:
        by_op[(cm, op.id)] = op
        coll = pf.comms[cm].colls.get(op.coll)
        if coll is not None:
            coll.ops.append(op)
    orphans = 0
    for cm, op_id, st in steps:
        op = by_op.get((cm, op_id))
        if op is None:
            orphans += 1
            continue
        op.steps[st.index] = st
    for cm, coll_id, k in kchs:
        coll = pf.comms[cm].colls.get(coll_id)
        if coll is not None:
            coll.kernel_channels.append(k)
    if orphans:
        pf.notes.append(f"{path.name}: {orphans} step record(s) without their proxy op (dropped or PXN)")
    for comm in pf.comms.values():
        for c in comm.colls.values():
            c.ops.sort(key=lambda o: (o.channel, not o.is_send, o.peer, o.t0 or 0, o.id))
    pf.marks.sort(key=lambda m: m[1])
    return pf


def read_plugin_dir(path: str | Path) -> list[PluginFile]:
    """Every plugin file (``*.jsonl``, ``*.jsonl.gz``) of a directory, or one file."""
    path = Path(path)
    if path.is_file():
        return [read_plugin_file(path)]
    if not path.is_dir():
        raise DproInputError(path, "no such file or directory")
    files = sorted(p for p in path.iterdir() if p.name.endswith((".jsonl", ".jsonl.gz")))  # each read or reported
    if not files:
        raise DproInputError(path, "no NCCL plugin traces (*.jsonl) in this directory")
    return [read_plugin_file(p) for p in files]


# --------------------------------------------------------------------------- communicators


@dataclass
class RankView:
    """One rank's side of the chosen communicator."""

    rank: int
    file: PluginFile
    comm: Comm


def select_comm(files: list[PluginFile], nranks: int | None = None, comm: str | None = None) -> dict[int, RankView]:
    """rank -> its view of one communicator present in the files.

    ``comm``: a communicator hash (``0x...``) or name; default: among communicators with
    ``nranks`` ranks (default: the largest), the one with the most collectives. Ranks are
    the communicator's own (the job's ranks for the default process group).
    """
    groups: dict[str, list[tuple[PluginFile, Comm]]] = defaultdict(list)
    for f in files:
        for c in f.comms.values():
            key = c.hash if c.hash.strip("0x") else f"n{c.nranks}:{c.name}"  # v3 has no hash
            groups[key].append((f, c))
    if not groups:
        raise DproInputError(files[0].path if files else None, "no communicator in the NCCL plugin traces")
    if comm is not None:
        cands = {k: v for k, v in groups.items() if k == comm or any(c.name == comm for _, c in v)}
        if not cands:
            raise DproInputError(None, f"no communicator '{comm}' in the NCCL plugin traces (have {sorted(groups)})")
    else:
        want = nranks or max(c.nranks for v in groups.values() for _, c in v)
        cands = {k: v for k, v in groups.items() if any(c.nranks == want for _, c in v)} or groups
    key = max(cands, key=lambda k: (sum(len(c.collectives()) for _, c in cands[k]), k))
    out: dict[int, RankView] = {}
    for f, c in cands[key]:
        r = c.rank if c.rank >= 0 else f.rank
        if r in out:
            raise DproInputError(f.path, f"rank {r} of communicator {key} also in {out[r].file.path.name}")
        out[r] = RankView(r, f, c)
    return out

