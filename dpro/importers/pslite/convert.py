"""ps-lite message records -> a gTrace: exchanges, slots and steps, ops, local DFG edges,
devices and step windows (the rules are the package docstring)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from dpro.errors import DproInputError
from dpro.gtrace.schema import Event, GTrace, Manifest, NodeInfo, NodeTrace, Op
from dpro.importers.pslite.read import DATA_KINDS, ProcessTrace, Record, read_trace_dir

#: ps-lite message -> (sub-op of its send, sub-op of its receive, op-name stem)
MESSAGE_OPS = {
    "push_req": ("PUSH_REQ", "PUSH_RES", "push_request"),
    "push_res": ("PULL_REQ", "PULL_RES", "push_response"),
    "pull_req": ("PUSH_REQ", "PUSH_RES", "pull_request"),
    "pull_res": ("PULL_REQ", "PULL_RES", "pull_response"),
}


@dataclass
class Exchange:
    """A request and its response: the four records, when their processes were traced."""

    worker: int
    server: int
    app: int
    customer: int | None
    msg_ts: int | None
    push: bool
    req_send: Record | None = None
    req_recv: Record | None = None
    res_send: Record | None = None
    res_recv: Record | None = None
    step: int | None = None

    @property
    def request(self) -> str:
        return "push_req" if self.push else "pull_req"

    @property
    def response(self) -> str:
        return "push_res" if self.push else "pull_res"


def exchanges(procs: list[ProcessTrace]) -> list[Exchange]:
    """Join every traced data message into its exchange; each end recorded at most once."""
    ex: dict[tuple, Exchange] = {}
    for p in procs:
        for r in p.records:
            if r.kind not in DATA_KINDS:
                continue
            is_req = r.kind.endswith("_req")
            worker, server = (r.sender, r.recver) if is_req else (r.recver, r.sender)
            key = (worker, server, r.app, r.customer, r.msg_ts, r.kind.startswith("push"))
            e = ex.get(key)
            if e is None:
                e = ex[key] = Exchange(*key)
            end = ("req_" if is_req else "res_") + r.dir
            if getattr(e, end) is not None:
                raise DproInputError(p.path, f"line {r.line}: message {r.mid} recorded twice (also line {getattr(e, end).line})")
            setattr(e, end, r)
    return list(ex.values())


# --------------------------------------------------------------------------- gTrace


def _tensor(keys: tuple[int, ...], nkeys: int, app: int, customer: int) -> str:
    base = f"key{keys[0]}" if nkeys == 1 else f"keys{keys[0]}-{keys[-1]}x{nkeys}" if keys else "nokeys"
    return base if (app, customer) == (0, 0) else f"a{app}.c{customer}.{base}"


def _assign_steps(slot: list[Exchange]) -> int:
    """Number the steps of one worker's slot (see the module doc); returns the count."""
    slot.sort(key=lambda e: (e.req_send.ts, e.req_send.seq))  # seq: the order within one µs
    pulls = [e for e in slot if not e.push]
    if not pulls:
        for i, e in enumerate(slot):
            e.step = i
        return len(slot)
    n, last_push = 0, None
    for e in slot:
        if e.push:
            last_push = e
            continue
        e.step = n
        if last_push is not None:
            last_push.step = n
        last_push = None
        n += 1
    return n


def to_gtrace(procs: list[ProcessTrace], *, framework: str = "ps-lite", source: str | None = None) -> GTrace:
    """Build the gTrace of a traced ps-lite job (see the module doc)."""
    by_id = {p.node_id: p for p in procs if p.node_id is not None}
    workers = sorted((p for p in by_id.values() if p.role == "worker"), key=lambda p: p.rank)
    servers = sorted((p for p in by_id.values() if p.role == "server"), key=lambda p: p.rank)
    where = source or (str(procs[0].path.parent) if procs else None)
    if not workers:
        raise DproInputError(where, "no worker exchanged data messages: nothing to import")
    notes: list[str] = []
    ex = exchanges(procs)
    # Every process that exchanged data must be traced (gTrace's PS pairs need both ends).
    for e in ex:
        for nid in (e.worker, e.server):
            if nid not in by_id:
                have = next(r for r in (e.req_send, e.req_recv, e.res_send, e.res_recv) if r is not None)
                raise DproInputError(where, f"no trace file of ps-lite node {nid}, which exchanged message {have.mid}: "
                                            "every worker's and server's file is needed")
    # Every end must be there.
    for e in ex:
        for end, node in (("req_send", e.worker), ("res_recv", e.worker), ("req_recv", e.server), ("res_send", e.server)):
            if getattr(e, end) is None:
                have = next(r for r in (e.req_send, e.req_recv, e.res_send, e.res_recv) if r is not None)
                kind = e.request if end.startswith("req") else e.response
                raise DproInputError(
                    by_id[node].path,
                    f"{'no record of' if end.endswith('recv') else 'no send of'} the {kind} of exchange "
                    f"{e.worker}<->{e.server} ts {e.msg_ts} (message {have.mid} is in the trace): "
                    f"an unanswered request or a process that did not flush (killed?)",
                )
    # Steps, per worker slot.
    slots: dict[tuple, list[Exchange]] = defaultdict(list)
    for e in ex:
        r = e.req_send
        slots[(e.worker, e.server, e.app, e.customer, r.keys, r.nkeys)].append(e)
    counts = {k: _assign_steps(v) for k, v in slots.items()}
    n_steps = min(counts.values())
    if n_steps == 0:
        raise DproInputError(where, "no complete step: some worker slot has no pull (or push) at all")
    if max(counts.values()) > n_steps:
        notes.append(f"ps-lite: slots have {n_steps} to {max(counts.values())} steps; steps >= {n_steps} are left out")
    unassigned = sum(1 for e in ex if e.step is None or e.step >= n_steps)
    if unassigned:
        notes.append(f"ps-lite: {unassigned} exchange(s) (e.g. initialisation pushes) belong to no profiled step")
    steps = list(range(n_steps))

    nodes: dict[str, NodeTrace] = {}
    for p in workers + servers:
        nodes[p.name] = NodeTrace(NodeInfo(p.name, p.role, p.rank, p.host, f"{p.name}.events.json.gz", f"{p.name}.dfg.json.gz"))
    skewed = 0
    window: dict[tuple[str, str], dict[int, tuple[float, float]]] = defaultdict(dict)

    def add(nt: NodeTrace, op_id: str, kind: str, is_send: bool, tensor: str, txn: str, peer: int, nbytes: int, device: str) -> None:
        if op_id not in nt.ops:
            sub_send, sub_recv, stem = MESSAGE_OPS[kind]
            nt.ops[op_id] = Op(op_id, f"ps-lite:{stem}.{'send' if is_send else 'recv'}", "COMM", device,
                               sub_op=sub_send if is_send else sub_recv, tensor=tensor, bytes=nbytes, txn=txn, peer=peer)

    def event(nt: NodeTrace, op_id: str, step: int, send: Record, recv: Record, is_send: bool) -> None:
        nonlocal skewed
        sent = send.ts + send.dur_us  # the Van handed it to the transport
        if is_send:
            nt.events.append(Event(op_id, step, send.ts, send.dur_us))
        elif recv.ts >= sent:
            nt.events.append(Event(op_id, step, sent, recv.ts - sent))
        else:
            skewed += 1
            nt.events.append(Event(op_id, step, recv.ts, 0.0))

    for (wid, sid, app, cust, keys, nkeys), slot in slots.items():
        w = by_id[wid]
        s = by_id[sid]
        tensor = _tensor(keys, nkeys, app, cust)
        wname, sname = w.name, s.name
        for e in slot:
            if e.step is None or e.step >= n_steps:
                continue
            if e.res_recv is not None:  # the step's window, as the worker sees it
                for key in ((wname, wname), (sname, wname)):
                    lo, hi = window[key].get(e.step, (e.req_send.ts, e.res_recv.ts))
                    window[key][e.step] = (min(lo, e.req_send.ts), max(hi, e.res_recv.ts))
            for kind, send, recv in ((e.request, e.req_send, e.req_recv), (e.response, e.res_send, e.res_recv)):
                txn = f"{tensor}/{wname}/{kind}"
                nbytes = send.data_bytes
                to_server = kind.endswith("_req")
                # worker side
                wop = f"{tensor}@{sname}/{kind}.{'send' if to_server else 'recv'}"
                add(nodes[wname], wop, kind, to_server, tensor, txn, s.rank, nbytes,
                    "app" if to_server else f"from:{sname}")
                event(nodes[wname], wop, e.step, send, recv, to_server)
                # server side
                sop = f"{tensor}@{wname}/{kind}.{'recv' if to_server else 'send'}"
                add(nodes[sname], sop, kind, not to_server, tensor, txn, w.rank, nbytes,
                    f"from:{wname}" if to_server else f"to:{wname}:{tensor}")
                event(nodes[sname], sop, e.step, send, recv, not to_server)
    if skewed:
        notes.append(f"ps-lite: {skewed} receive(s) arrived before they were sent by the sender's clock "
                     "(hosts' clocks differ): kept as instants at arrival")
    _edges(nodes, workers, servers, steps, notes)
    for name, nt in nodes.items():
        spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for (node, _), win in window.items():
            if node == name:
                for st, se in win.items():
                    spans[st].append(se)
        nt.steps = {st: (min(lo for lo, _ in v), sum(hi - lo for lo, hi in v) / len(v)) for st, v in sorted(spans.items())}
    for name, nt in nodes.items():
        if not nt.events:
            raise DproInputError(by_id[next(i for i, p in by_id.items() if p.name == name)].path, "no data message in any profiled step")
    infos = [nt.info for nt in nodes.values()]
    meta = {
        "importer": "pslite",
        "source": where,
        "files": {p.name: str(p.path) for p in workers + servers},
        "step_rule": "step n of a (worker, server, keys) slot = its n-th pull and the last push before it",
        "exchanges": len(ex),
        "unassigned_exchanges": unassigned,
    }
    m = Manifest(framework, "ps", "ps-lite", len(workers), infos, steps, meta=meta)
    return GTrace(manifest=m, nodes=nodes, source=None, notes=notes)


def _ev_index(nt: NodeTrace) -> dict[str, dict[int, tuple[float, float]]]:
    out: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    for ev in nt.events:
        out[ev.op][ev.step] = (ev.ts, ev.ts + ev.dur)
    return out


def _always_after(ev: dict, a: str, b: str, steps: list[int]) -> bool:
    """In every step where both ran, op ``b`` started no earlier than op ``a`` ended."""
    both = [s for s in steps if s in ev[a] and s in ev[b]]
    return bool(both) and all(ev[b][s][0] >= ev[a][s][1] for s in both)


def _link_order(nt: NodeTrace, ev: dict, steps: list[int]) -> list[tuple[str, str]]:
    """Receives from one peer arrive in order (one connection): consecutive ones, in the
    arrival order of the first step, joined where that order held in every step."""
    by_dev: dict[str, list[str]] = defaultdict(list)
    for o, op in nt.ops.items():
        if op.device.startswith("from:") and steps[0] in ev[o]:
            by_dev[op.device].append(o)
    out = []
    for ops in by_dev.values():
        ops.sort(key=lambda o: (ev[o][steps[0]][1], o))
        for a, b in zip(ops, ops[1:]):
            both = [s for s in steps if s in ev[a] and s in ev[b]]
            if all(ev[a][s][1] <= ev[b][s][1] for s in both):
                out.append((a, b))
    return out


def _request_to_response(nt: NodeTrace, o: str, stem: str, request_end: str, response_end: str) -> None:
    """The edge from request op ``o`` to its response's op on this node, if both are here: a
    worker sends the request and receives the response, a server the other way round."""
    for req, res in (("push_req", "push_res"), ("pull_req", "pull_res")):
        if o == f"{stem}/{req}.{request_end}" and f"{stem}/{res}.{response_end}" in nt.ops:
            nt.edges.append((o, f"{stem}/{res}.{response_end}"))


def _edges(nodes: dict[str, NodeTrace], workers, servers, steps: list[int], notes: list[str]) -> None:
    for p in workers:
        nt = nodes[p.name]
        ev = _ev_index(nt)
        first = steps[0]
        sends = sorted((o for o in nt.ops if o.endswith(".send") and first in ev[o]), key=lambda o: ev[o][first][0])
        nt.edges += list(zip(sends, sends[1:]))  # one thread issues them, in this order
        nt.edges += _link_order(nt, ev, steps)
        for o in nt.ops:
            stem = o.rsplit("/", 1)[0]
            _request_to_response(nt, o, stem, "send", "recv")
            if o == f"{stem}/push_res.recv" and f"{stem}/pull_req.send" in nt.ops:
                if _always_after(ev, o, f"{stem}/pull_req.send", steps):
                    nt.edges.append((o, f"{stem}/pull_req.send"))
    for p in servers:
        nt = nodes[p.name]
        ev = _ev_index(nt)
        by_tensor: dict[str, list[str]] = defaultdict(list)
        nt.edges += _link_order(nt, ev, steps)
        for o in nt.ops:
            stem = o.rsplit("/", 1)[0]
            _request_to_response(nt, o, stem, "recv", "send")
            by_tensor[nt.ops[o].tensor].append(o)
        aggregated = 0
        for tensor, ops in by_tensor.items():
            pushes = [o for o in ops if o.endswith("/push_req.recv")]
            if len(pushes) < 2:
                continue
            for kind in ("push_res", "pull_res"):
                # every worker's response waited for every worker's push, in every step
                responses = [o for o in ops if o.endswith(f"/{kind}.send")]
                if responses and all(_always_after(ev, q, r, steps) for r in responses for q in pushes):
                    nt.edges += [(q, r) for r in responses for q in pushes]
                    aggregated += len(responses)
        if aggregated:
            notes.append(f"ps-lite: {p.name}: {aggregated} response(s) wait for every worker's push (synchronous aggregation)")
        nt.edges[:] = list(dict.fromkeys(nt.edges))


def import_pslite(root: str | Path, *, framework: str = "ps-lite") -> GTrace:
    """Read a directory of ps-lite trace files and build its gTrace."""
    procs = read_trace_dir(root)
    return to_gtrace(procs, framework=framework, source=str(root))
