"""Load and write gTrace directories (docs/gtrace.md), validating as we go."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from dpro.errors import DproInputError
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
)
from dpro.jsonio import read_json, write_json

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def is_gtrace(path: Path) -> bool:
    """True when ``path`` is a directory holding a gTrace manifest."""
    return path.is_dir() and (path / MANIFEST).is_file()


def _req(d: Any, key: str, typ: type | tuple[type, ...], where: Path, what: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise DproInputError(where, f"{what}: missing field '{key}'")
    v = d[key]
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise DproInputError(where, f"{what}: field '{key}' has the wrong type ({type(v).__name__})")
    return v


def _parse_manifest(path: Path) -> Manifest:
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
                name=_req(n, "name", str, path, what),
                role=role,
                rank=_req(n, "rank", int, path, what),
                host=_req(n, "host", str, path, what),
                events=_req(n, "events", str, path, what),
                dfg=_req(n, "dfg", str, path, what),
            )
        )
    if not nodes:
        raise DproInputError(path, "manifest lists no nodes")
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise DproInputError(path, "manifest lists a node name twice")
    return Manifest(
        framework=_req(m, "framework", str, path, "manifest"),
        scheme=scheme,
        library=_req(m, "library", str, path, "manifest"),
        world_size=_req(m, "world_size", int, path, "manifest"),
        nodes=nodes,
        steps=[int(s) for s in _req(m, "steps", list, path, "manifest")],
        version=version,
        meta=m.get("meta") or {},
    )


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
            op.group = tuple(int(r) for r in _req(d, "group", list, path, what))
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


def _parse_events(path: Path, node: NodeTrace) -> None:
    d = read_json(path)
    evs = d.get("traceEvents") if isinstance(d, dict) else d
    if not isinstance(evs, list):
        raise DproInputError(path, "no 'traceEvents' list")
    for i, e in enumerate(evs):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        ts, dur = e.get("ts"), e.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            raise DproInputError(path, f"traceEvents[{i}]: 'ts'/'dur' missing or not numbers")
        if dur < 0:
            raise DproInputError(path, f"traceEvents[{i}] ({e.get('name')}): negative duration {dur}")
        if e.get("cat") == "STEP":
            node.steps[int(args.get("step", -1))] = (float(ts), float(dur))
            continue
        op = args.get("op")
        if op is None:
            continue
        if op not in node.ops:
            raise DproInputError(path, f"traceEvents[{i}]: op '{op}' is not in the node's DFG")
        node.events.append(Event(op=op, step=int(args.get("step", -1)), ts=float(ts), dur=float(dur)))
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
    manifest = _parse_manifest(root / MANIFEST)
    nodes: dict[str, NodeTrace] = {}
    for info in manifest.nodes:
        nt = NodeTrace(info=info)
        _parse_dfg(root / info.dfg, nt)
        _parse_events(root / info.events, nt)
        nodes[info.name] = nt
    gt = GTrace(manifest=manifest, nodes=nodes, source=str(root))
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


def write_gtrace(gt: GTrace, root: str | Path, *, force: bool = False) -> Path:
    """Write ``gt`` as a gTrace directory.

    Refuses to overwrite an existing non-empty directory unless ``force``; writes into a
    temporary sibling first and swaps it in, so a failure never leaves half a trace.
    """
    root = Path(root)
    if root.exists() and (not root.is_dir() or any(root.iterdir())) and not force:
        raise DproInputError(root, "already exists and is not empty (use --force to replace it)")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}.tmp"))
    try:
        for pid, info in enumerate(gt.manifest.nodes):
            nt = gt.nodes[info.name]
            info.events = info.events or f"{info.name}.events.json.gz"
            info.dfg = info.dfg or f"{info.name}.dfg.json.gz"
            write_json(tmp / info.events, node_events_json(nt, pid))
            write_json(tmp / info.dfg, {"ops": [o.to_json() for o in nt.ops.values()], "edges": [list(e) for e in nt.edges]})
        write_json(tmp / MANIFEST, gt.manifest.to_json())
        if root.exists():
            shutil.rmtree(root)
        tmp.rename(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root
