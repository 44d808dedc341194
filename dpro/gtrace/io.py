"""Load and write gTrace directories (docs/gtrace.md), validating as we go."""

from __future__ import annotations

import logging
import os
from pathlib import Path, PurePosixPath
from typing import Any

from dpro.errors import DproInputError, brief, one_line
from dpro.gtrace.schema import (
    CATEGORIES,
    FORMAT_NAME,
    FORMAT_VERSION,
    ROLES,
    SCHEMES,
    SUB_OPS,
    Event,
    GTrace,
    Manifest,
    NodeInfo,
    NodeTrace,
    Op,
    Tensor,
)
from dpro.jsonio import check_writable_dir, dump_json, read_json, regular_file_problem, write_dir_atomically

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
#: names of the per-node files of a gTrace directory (docs/gtrace.md)
_NODE_FILE_SUFFIXES = (".events.json", ".events.json.gz", ".dfg.json", ".dfg.json.gz")


def is_gtrace(path: Path) -> bool:
    """True when ``path`` is a directory holding a gTrace manifest (of any file type: a
    manifest that is a FIFO or a broken link is then reported as such, not ignored)."""
    return path.is_dir() and os.path.lexists(path / MANIFEST)


#: integers in a gTrace must fit a signed 64-bit integer
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _is_int64(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and INT64_MIN <= x <= INT64_MAX


def _req(d: Any, key: str, typ: type | tuple[type, ...], where: Path, what: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise DproInputError(where, f"{what}: missing field '{key}'")
    v = d[key]
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise DproInputError(where, f"{what}: field '{key}' has the wrong type ({type(v).__name__})")
    if typ is int and not _is_int64(v):
        raise DproInputError(where, f"{what}: field '{key}' does not fit a 64-bit integer")
    return v


def _int_list(d: Any, key: str, where: Path, what: str) -> list[int]:
    v = _req(d, key, list, where, what)
    if not all(_is_int64(x) for x in v):
        raise DproInputError(where, f"{what}: field '{key}' must be a list of 64-bit integers")
    return v


def _safe_name(name: str) -> bool:
    """A relative file name that stays inside the gTrace directory."""
    p = PurePosixPath(name)
    return (bool(name) and not p.is_absolute() and ".." not in p.parts and "\\" not in name
            and name.isprintable())


def _file_name(n: Any, key: str, where: Path, what: str) -> str:
    v = _req(n, key, str, where, what)
    if not v:
        raise DproInputError(where, f"{what}: field '{key}' is empty")
    if not _safe_name(v):
        raise DproInputError(where, f"{what}: field '{key}' ('{v}') must name a file inside the trace directory")
    return v


def _node_name(n: Any, where: Path, what: str) -> str:
    v = _req(n, "name", str, where, what)
    if not v or not v.isprintable() or "/" in v or "\\" in v or v in (".", ".."):
        raise DproInputError(where, f"{what}: node name '{v}' must be a plain name (no '/', '\\' or control characters)")
    return v


def _parse_manifest(path: Path) -> tuple[Manifest, list[str]]:
    """The manifest, and the import's notes it carries (``notes``, optional)."""
    m = read_json(path)
    if not isinstance(m, dict) or m.get("format") != FORMAT_NAME:
        raise DproInputError(path, f"not a gTrace manifest (expected \"format\": \"{FORMAT_NAME}\")")
    version = _req(m, "version", int, path, "manifest")
    if version > FORMAT_VERSION:
        raise DproInputError(path, f"gTrace version {version} is newer than this dpro supports ({FORMAT_VERSION})")
    scheme = _req(m, "scheme", str, path, "manifest")
    if scheme not in SCHEMES:
        raise DproInputError(path, f"unknown scheme '{scheme}' (expected one of {', '.join(SCHEMES)})")
    nodes = []
    for i, n in enumerate(_req(m, "nodes", list, path, "manifest")):
        what = f"nodes[{i}]"
        role = _req(n, "role", str, path, what)
        if role not in ROLES:
            raise DproInputError(path, f"{what}: unknown role '{role}'")
        nodes.append(
            NodeInfo(
                name=_node_name(n, path, what),
                role=role,
                rank=_req(n, "rank", int, path, what),
                host=_req(n, "host", str, path, what),
                events=_file_name(n, "events", path, what),
                dfg=_file_name(n, "dfg", path, what),
            )
        )
    if not nodes:
        raise DproInputError(path, "manifest lists no nodes")
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        dup = next(x for x in names if names.count(x) > 1)
        raise DproInputError(path, f"manifest lists node '{dup}' twice")
    owner: dict[str, str] = {}
    for n in nodes:
        for f in (n.events, n.dfg):
            other = owner.setdefault(str(PurePosixPath(f)), n.name)
            if other != n.name or (f == n.events and n.events == n.dfg):
                raise DproInputError(path, f"nodes '{other}' and '{n.name}' share the file '{f}'")
    world_size = _req(m, "world_size", int, path, "manifest")
    if world_size < 1:
        raise DproInputError(path, f"manifest: world_size {world_size} must be at least 1")
    seen: dict[tuple[str, int], str] = {}
    for n in nodes:
        if n.rank < 0:
            raise DproInputError(path, f"node '{n.name}': negative rank {n.rank}")
        if n.role == "worker" and n.rank >= world_size:
            raise DproInputError(path, f"node '{n.name}': rank {n.rank} is outside world_size {world_size}")
        if (n.role, n.rank) in seen:
            raise DproInputError(path, f"nodes '{seen[n.role, n.rank]}' and '{n.name}' are both {n.role} rank {n.rank}")
        seen[n.role, n.rank] = n.name
    meta = m.get("meta") or {}
    if not isinstance(meta, dict):
        raise DproInputError(path, f"manifest: field 'meta' has the wrong type ({type(meta).__name__})")
    notes = m.get("notes") or []
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise DproInputError(path, "manifest: field 'notes' must be a list of strings")
    return Manifest(
        framework=_req(m, "framework", str, path, "manifest"),
        scheme=scheme,
        library=_req(m, "library", str, path, "manifest"),
        world_size=world_size,
        nodes=nodes,
        steps=_int_list(m, "steps", path, "manifest"),
        version=version,
        meta=meta,
    ), notes


def _parse_op(d: Any, path: Path, i: int) -> Op:
    what = f"ops[{i}]"
    cat = _req(d, "cat", str, path, what)
    if cat not in CATEGORIES:
        raise DproInputError(path, f"{what}: unknown category '{cat}' (expected one of {', '.join(CATEGORIES)})")
    op = Op(
        id=_req(d, "id", str, path, what),
        name=_req(d, "name", str, path, what),
        cat=cat,
        device=_req(d, "device", str, path, what),
    )
    if d.get("layer") is not None:
        op.layer = _req(d, "layer", str, path, what)
    if cat == "COMM":
        op.sub_op = _req(d, "sub_op", str, path, what)
        if op.sub_op not in SUB_OPS:
            raise DproInputError(path, f"{what}: unknown sub_op '{op.sub_op}'")
        op.tensor = _req(d, "tensor", str, path, what)
        op.bytes = _req(d, "bytes", int, path, what)
        if op.bytes < 0:
            raise DproInputError(path, f"{what} ({op.id}): negative bytes")
        op.txn = _req(d, "txn", str, path, what)
        if d.get("peer") is not None:
            op.peer = _req(d, "peer", int, path, what)
        if d.get("group") is not None:
            op.group = tuple(_int_list(d, "group", path, what))
    return op


def _parse_dfg(path: Path, node: NodeTrace) -> None:
    d = read_json(path)
    ops = _req(d, "ops", list, path, "DFG")
    for i, o in enumerate(ops):
        op = _parse_op(o, path, i)
        if op.id in node.ops:
            raise DproInputError(path, f"op '{op.id}' defined twice")
        node.ops[op.id] = op
    for i, e in enumerate(_req(d, "edges", list, path, "DFG")):
        if not (isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e)):
            raise DproInputError(path, f"edges[{i}]: expected [from_op, to_op]")
        for x in e:
            if x not in node.ops:
                raise DproInputError(path, f"edges[{i}]: unknown op '{x}'")
        node.edges.append((e[0], e[1]))
    for i, t in enumerate(d.get("tensors") or []):
        what = f"tensors[{i}]"
        ten = Tensor(
            name=_req(t, "name", str, path, what),
            bytes=_req(t, "bytes", int, path, what),
            shape=tuple(_int_list(t, "shape", path, what)) if t.get("shape") is not None else (),
            dtype=str(t.get("dtype", "float32")),
            producer=t.get("producer"),
            txn=t.get("txn"),
        )
        if ten.bytes < 0:
            raise DproInputError(path, f"{what} ({ten.name}): negative bytes")
        if ten.producer is not None and ten.producer not in node.ops:
            raise DproInputError(path, f"{what} ({ten.name}): producer '{ten.producer}' is not in the DFG")
        node.tensors.append(ten)
    if isinstance(d.get("meta"), dict):
        node.meta = d["meta"]


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _parse_events(path: Path, node: NodeTrace) -> None:
    d = read_json(path)
    evs = d.get("traceEvents") if isinstance(d, dict) else d
    if not isinstance(evs, list):
        raise DproInputError(path, "no 'traceEvents' list")
    for i, e in enumerate(evs):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        if not isinstance(args, dict):
            raise DproInputError(path, f"traceEvents[{i}]: 'args' is not an object")
        ts, dur = e.get("ts"), e.get("dur")
        if not _is_num(ts) or not _is_num(dur):
            raise DproInputError(path, f"traceEvents[{i}]: 'ts'/'dur' missing or not numbers")
        if dur < 0:
            raise DproInputError(path, f"traceEvents[{i}] ({brief(e.get('name'))}): negative duration {brief(dur)}")
        step = args.get("step", -1)
        if not _is_int64(step):
            raise DproInputError(path, f"traceEvents[{i}]: args.step {brief(step)} is not a 64-bit integer")
        if e.get("cat") == "STEP":
            node.steps[step] = (float(ts), float(dur))
            continue
        op = args.get("op")
        if op is None:
            continue
        if not isinstance(op, str) or op not in node.ops:
            raise DproInputError(path, f"traceEvents[{i}]: op {brief(op)} is not in the node's DFG")
        node.events.append(Event(op=op, step=step, ts=float(ts), dur=float(dur)))
    if not node.events:
        raise DproInputError(path, "empty trace: no op events")


def load_gtrace(root: str | Path) -> GTrace:
    """Load and validate a gTrace directory."""
    from dpro.gtrace.validate import validate

    root = Path(root)
    if not root.exists():
        raise DproInputError(root, "no such file or directory")
    if not is_gtrace(root):
        raise DproInputError(root, f"not a gTrace directory (no {MANIFEST})")
    manifest, notes = _parse_manifest(root / MANIFEST)
    nodes: dict[str, NodeTrace] = {}
    inside = root.resolve()
    for info in manifest.nodes:
        nt = NodeTrace(info=info)
        for fname, parse in ((info.dfg, _parse_dfg), (info.events, _parse_events)):
            f = root / fname
            problem = regular_file_problem(f)
            if problem:
                raise DproInputError(f, f"{problem} ({MANIFEST} lists it for node '{info.name}')")
            if not f.resolve().is_relative_to(inside):
                raise DproInputError(f, f"links outside the trace directory ({MANIFEST} lists it for node '{info.name}')")
            parse(f, nt)
        nodes[info.name] = nt
    listed = {str(PurePosixPath(n.events)) for n in manifest.nodes} | {str(PurePosixPath(n.dfg)) for n in manifest.nodes}
    try:
        unlisted = sorted(p.name for p in root.iterdir() if p.name.endswith(_NODE_FILE_SUFFIXES) and p.name not in listed)
    except OSError:
        unlisted = []
    for name in unlisted:  # a node file the manifest does not list: said, not silently dropped
        log.warning("%s", one_line(f"{root / name}: not listed in {MANIFEST}; ignored"))
    gt = GTrace(manifest=manifest, nodes=nodes, source=str(root), notes=notes)
    validate(gt)
    return gt


def node_events_json(nt: NodeTrace, pid: int) -> dict:
    """A node's events as a Chrome trace that opens as-is in Perfetto."""
    devices = sorted({op.device for op in nt.ops.values()})
    tid = {d: i + 1 for i, d in enumerate(devices)}
    out: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": nt.info.name}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "steps"}},
    ]
    out += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": d}} for d, t in tid.items()]
    for step, (ts, dur) in sorted(nt.steps.items()):
        out.append({"ph": "X", "cat": "STEP", "name": f"step {step}", "pid": pid, "tid": 0, "ts": ts, "dur": dur, "args": {"step": step}})
    for ev in nt.events:
        op = nt.ops[ev.op]
        args: dict = {"op": op.id, "step": ev.step}
        if op.cat == "COMM":
            args.update(sub_op=op.sub_op, tensor=op.tensor, bytes=op.bytes, txn=op.txn)
            if op.peer is not None:
                args["peer"] = op.peer
        out.append({"ph": "X", "cat": op.cat, "name": op.name, "pid": pid, "tid": tid[op.device], "ts": ev.ts, "dur": ev.dur, "args": args})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_gtrace(gt: GTrace, root: str | Path, *, force: bool = False, check: bool = True) -> Path:
    """Write ``gt`` as a gTrace directory.

    Refuses to overwrite an existing non-empty directory unless ``force`` (and never
    replaces a file); writes into a temporary sibling first and swaps it in, so a failure
    never leaves half a trace and, with ``force``, keeps the old directory on failure.
    With ``check`` (the default) the trace is validated first, so nothing is written that
    ``load_gtrace`` would reject. File-system problems become a DproInputError naming
    ``root``.
    """
    from dpro.gtrace.validate import validate

    root = Path(root)
    check_writable_dir(root, force)
    if check:
        validate(gt)
    for info in gt.manifest.nodes:
        if info.name not in gt.nodes:
            raise DproInputError(root, f"manifest lists node '{info.name}' but the trace has no data for it")

    def fill(tmp: Path) -> None:
        used: set[str] = {MANIFEST}
        for pid, info in enumerate(gt.manifest.nodes):
            nt = gt.nodes[info.name]
            base = info.name if _safe_name(info.name) and "/" not in info.name else f"node{pid}"
            if not _safe_name(info.events) or info.events in used:
                info.events = f"{base}.events.json.gz"
            if not _safe_name(info.dfg) or info.dfg in used:
                info.dfg = f"{base}.dfg.json.gz"
            used |= {info.events, info.dfg}
            dump_json(tmp / info.events, node_events_json(nt, pid))
            dfg = {"ops": [o.to_json() for o in nt.ops.values()], "edges": [list(e) for e in nt.edges]}
            if nt.tensors:
                dfg["tensors"] = [t.to_json() for t in nt.tensors]
            if nt.meta:
                dfg["meta"] = nt.meta
            dump_json(tmp / info.dfg, dfg)
        # the import's notes (which steps, what was left out and why) travel with the trace
        dump_json(tmp / MANIFEST, {**gt.manifest.to_json(), **({"notes": list(gt.notes)} if gt.notes else {})})

    write_dir_atomically(root, fill)
    return root
