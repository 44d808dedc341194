"""BytePS traces -> a gTrace: one worker node per GPU process, one server node per server
profile, the stage ops and their pairing (docs/byteps.md, "Mapping into gTrace")."""

from __future__ import annotations

import logging
import statistics
from collections import defaultdict
from pathlib import Path

from dpro.errors import DproInputError
from dpro.gtrace.schema import Event, GTrace, Manifest, NodeInfo, NodeTrace, Op
from dpro.importers.byteps.read import (
    STAGES,
    Interval,
    RankComm,
    ServerProfile,
    discover,
    read_comm_json,
    read_server_profile,
    read_sizes,
)

log = logging.getLogger(__name__)

#: local stages before PUSH move the gradient into the PS topology (IN); the other local
#: stages (after PULL) move it out of it (OUT)
IN_STAGES = frozenset(STAGES[: STAGES.index("PUSH")]) - {"REDUCE"}
#: ps-lite's key space (uint64 max); server i owns [i*(K//n), (i+1)*(K//n)) of n servers
K_MAX = 2**64 - 1


def _server_rank(sp: ServerProfile, worker_keys: set[int]) -> tuple[int, dict[int, int]]:
    """(server index, server key -> worker key): the smallest server count n under which
    every key of the file maps into one server's range onto a key the workers traced."""
    keys = {k for k, _, _ in sp.reqs}
    for n in range(1, 1025):
        size = K_MAX // n
        idx = {k // size for k in keys}
        if len(idx) == 1 and all(k % size in worker_keys for k in keys):
            return idx.pop(), {k: k % size for k in keys}
    raise DproInputError(sp.path, "its keys match no partition key of the worker traces (a server of another job?)")


def _steps_of(rc: RankComm, notes: list[str], node: str) -> int:
    """Profiled synchronisations in one comm.json (the i-th event of each sequence is step i)."""
    counts = {len(v) for v in rc.stages.values()} | {len(v) for v in rc.totals.values()}
    n = min(counts)
    if len(counts) > 1:
        notes.append(f"{node}: sequences hold {min(counts)}..{max(counts)} syncs; the first {n} are used")
    return n


def _match_offset(sp_list: list[ServerProfile], skey: dict[int, dict[int, int]], pushes: dict[tuple[int, int], list[Interval]], n: int) -> int:
    """Index of the server instance that matches the first profiled step, by time."""
    best: dict[int, float] = defaultdict(float)
    for si, sp in enumerate(sp_list):
        for (k, sender, kind), reqs in sp.reqs.items():
            w = pushes.get((skey[si][k], (sender - 9) // 2))
            if kind != "push" or w is None or len(reqs) < n:
                continue
            for o in range(len(reqs) - n + 1):
                best[o] += sum(abs(reqs[o + i][0] - w[i][0]) for i in range(n))
    if not best:
        return 0
    return min(best, key=lambda o: (best[o], o))


def _add_ready_ops(nt: NodeTrace, rc: RankComm, chains: dict[tuple[str, int], list[tuple[int, str]]], steps: list[int]) -> None:
    """One ``Ready.<tensor>`` op per tensor on device ``framework``: the time between the
    previous gradient and this one being handed to BytePS (the start of its ``total``
    event), i.e. the backward computation as BytePS sees it.  Each partition's first stage
    waits for it, so a stage's own start is not mistaken for host time on its queue."""
    n = len(steps)
    ready: dict[str, list[float]] = {}  # tensor -> per step, when BytePS got its gradient
    for (tensor, key), chain in chains.items():
        tot = rc.totals.get(tensor, [])
        first = rc.stages[(tensor, key, STAGES[chain[0][0]])]
        t_ready = [t for t, _ in (tot if len(tot) >= n else first)[:n]]
        ready[tensor] = [min(a, b) for a, b in zip(ready.get(tensor, t_ready), t_ready)]
    step0 = [min(r[i] for r in ready.values()) for i in range(n)]
    order = sorted(ready, key=lambda t: (statistics.median(ready[t][i] - step0[i] for i in range(n)), t))
    prev: str | None = None
    for tensor in order:
        oid = f"Ready.{tensor}"
        nt.ops[oid] = Op(oid, oid, "BW", "framework")
        if prev is not None:
            nt.edges.append((f"Ready.{prev}", oid))
        for i, s in enumerate(steps):
            end = ready[tensor][i]
            ts = min(end, step0[i] if prev is None else ready[prev][i])
            nt.events.append(Event(oid, s, ts, end - ts))
        prev = tensor
    for (tensor, _key), chain in chains.items():
        nt.edges.append((f"Ready.{tensor}", chain[0][1]))


def _link_to_root(root: NodeTrace, local: NodeTrace, lr: int, machine: str) -> None:
    """Signals between a machine's root GPU and another of its GPUs, as SEND/RECV pairs.

    The non-root's COORDINATE_PUSH tells the root its slice is in host memory (the root's
    PUSH waits for it); the root's finished PULL lets the non-root copy back (COPYH2D).
    Both are zero-duration messages: a RECV at the moment the waiting stage started."""
    first: dict[str, dict[int, tuple[float, float]]] = {}  # op -> step -> (ts, end)
    for nt in (root, local):
        for e in nt.events:
            first.setdefault(e.op, {})[e.step] = (e.ts, e.ts + e.dur)
    for oid, op in list(local.ops.items()):
        tensor, key = op.tensor, oid.rsplit("#", 1)[-1]
        stage = op.name.rsplit(".", 1)[-1]
        if stage == "COORDINATE_PUSH" and f"Comm.{tensor}.PUSH#{key}" in root.ops:
            push = f"Comm.{tensor}.PUSH#{key}"
            op.sub_op, op.txn, op.peer = "SEND", f"coordinate_push:{key}@{machine}:{lr}", root.info.rank
            rid = f"Comm.{tensor}.COORDINATE_PUSH<-{lr}#{key}"
            root.ops[rid] = Op(rid, f"Comm.{tensor}.COORDINATE_PUSH", "COMM", f"signal#{key}", sub_op="RECV",
                               tensor=tensor, txn=op.txn, peer=local.info.rank)
            root.edges.append((rid, push))
            root.events += [Event(rid, s, ts, 0.0) for s, (ts, _) in first[push].items()]
        elif stage == "COPYH2D" and f"Comm.{tensor}.PULL#{key}" in root.ops:
            pull = f"Comm.{tensor}.PULL#{key}"
            txn = f"pull_done:{key}@{machine}:{lr}"
            sid, rid = f"Comm.{tensor}.PULL->{lr}#{key}", f"Comm.{tensor}.PULL<-root#{key}"
            root.ops[sid] = Op(sid, f"Comm.{tensor}.PULL", "COMM", f"signal#{key}", sub_op="SEND", tensor=tensor,
                               txn=txn, peer=local.info.rank)
            local.ops[rid] = Op(rid, f"Comm.{tensor}.PULL", "COMM", f"signal#{key}", sub_op="RECV", tensor=tensor,
                                txn=txn, peer=root.info.rank)
            root.edges.append((pull, sid))
            local.edges.append((rid, oid))
            root.events += [Event(sid, s, end, 0.0) for s, (_, end) in first[pull].items()]
            local.events += [Event(rid, s, ts, 0.0) for s, (ts, _) in first[oid].items()]


def import_byteps(
    path: str | Path, *, start_step: int | None = None, framework: str = "unknown") -> GTrace:
    """Read a BytePS trace directory into a gTrace (scheme ``ps``, library ``byteps``).

    ``start_step`` is ``BYTEPS_TRACE_START_STEP`` of the run: steps are then numbered as
    BytePS counts them and server requests are matched to steps by count; without it
    steps are inferred from the server profile by time, or numbered from 0.
    """
    root = Path(path)
    if start_step is not None and start_step < 1:
        raise DproInputError(root, f"start_step {start_step}: BYTEPS_TRACE_START_STEP is at least 1")
    notes: list[str] = []
    machines, server_files = discover(root)
    comm = {(m, lr): read_comm_json(p) for m, (_, rs) in machines.items() for lr, p in rs.items()}
    local_size = 1 + max(lr for _, lr in comm)
    worker_id = {m: wid for m, (wid, _) in machines.items()}
    rank_of = {(m, lr): worker_id[m] * local_size + lr for m, lr in comm}
    world = (1 + max(worker_id.values())) * local_size
    name_of = {ml: f"worker{r}" for ml, r in rank_of.items()}
    n_steps = min(_steps_of(rc, notes, name_of[ml]) for ml, rc in comm.items())
    if n_steps == 0:
        raise DproInputError(root, "no complete profiled step in the comm.json files")
    roots = {m: lr for (m, lr), rc in comm.items() if rc.is_root()}
    sizes = read_sizes(root, notes)
    if not sizes:
        notes.append("no BytePS DEBUG log (*.log) with partition sizes: COMM ops carry 0 bytes")
    tensor_of: dict[int, str] = {}
    for rc in comm.values():
        tensor_of.update(rc.keys())

    def nbytes(tensor: str, key: int) -> int:
        s = sizes.get(tensor)
        if s is None:
            return 0
        parts, first = s
        i = key - first
        return parts[i] if 0 <= i < len(parts) else 0

    # Servers: their requests per (worker key, worker id), matched to worker steps.
    servers = [read_server_profile(p) for p in server_files]
    skey: dict[int, dict[int, int]] = {}
    srank: dict[int, int] = {}
    for si, sp in enumerate(servers):
        if sp.truncated:
            notes.append(f"{sp.path.name}: unterminated (the server was still running); complete requests are used")
        srank[si], skey[si] = _server_rank(sp, set(tensor_of))
    if len(set(srank.values())) != len(srank):
        raise DproInputError(root, "two server profiles hold the keys of the same server")
    root_push = {(k, worker_id[m]): comm[(m, lr)].stages[(t, k, "PUSH")]
                 for m, lr in roots.items() for (t, k, s) in comm[(m, lr)].stages if s == "PUSH"}
    offset = 0
    if servers:
        if start_step is not None:
            offset = start_step - 1
        else:
            offset = _match_offset(servers, skey, root_push, n_steps)
            notes.append(f"server requests matched to worker steps by time (first profiled sync = #{offset + 1}); "
                         "pass start_step (BYTEPS_TRACE_START_STEP) to match by count")
    first_step = start_step if start_step is not None else (offset + 1 if servers else 0)
    steps = [first_step + i for i in range(n_steps)]
    # (worker key, worker id) -> server index, push and pull (B, E) per profiled step
    srv_req: dict[tuple[int, int], tuple[int, list[tuple[float, float]], list[tuple[float, float]]]] = {}
    for si, sp in enumerate(servers):
        for (k, sender, kind), reqs in sp.reqs.items():
            if kind == "push":
                pulls = sp.reqs.get((k, sender, "pull"), [])
                if len(reqs) >= offset + n_steps and len(pulls) >= offset + n_steps:
                    srv_req[(skey[si][k], (sender - 9) // 2)] = (
                        si, reqs[offset:offset + n_steps], pulls[offset:offset + n_steps])
    present_roots = {worker_id[m] for m in roots}
    root_keys = {k for (k, _w) in root_push}
    paired = {k for k in root_keys if all((k, w) in srv_req for w in present_roots)}
    if servers and paired != root_keys:
        notes.append(f"{len(root_keys - paired)} partition(s) lack server requests for all profiled steps: "
                     "their push/pull keep measured times without server")
    if not servers and roots:
        notes.append("no server profile: push/pull keep their measured times (no cross-worker dependency through the servers)")

    nodes: dict[str, NodeTrace] = {}
    infos: list[NodeInfo] = []
    files: dict[str, str] = {}
    for (m, lr), rc in sorted(comm.items(), key=lambda x: rank_of[x[0]]):
        r, name, wid = rank_of[(m, lr)], name_of[(m, lr)], worker_id[m]
        info = NodeInfo(name, "worker", r, m, f"{name}.events.json.gz", f"{name}.dfg.json.gz")
        nt = NodeTrace(info=info)
        group = tuple(range(wid * local_size, (wid + 1) * local_size))
        root_group = tuple(sorted(rank_of[(mm, rl)] for mm, rl in roots.items()))
        chains: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
        for (tensor, key, stage), ivs in rc.stages.items():
            oid = f"Comm.{tensor}.{stage}#{key}"
            op = Op(oid, f"Comm.{tensor}.{stage}", "COMM", f"byteps:{stage}", tensor=tensor, bytes=nbytes(tensor, key))
            if stage == "REDUCE":
                op.sub_op, op.txn, op.group = "REDUCESCATTER", f"reduce:{key}@{m}", group
            elif stage == "BROADCAST":
                op.sub_op, op.txn, op.group = "ALLGATHER", f"broadcast:{key}@{m}", group
            elif stage in ("PUSH", "PULL"):
                op.device = f"net:{stage}#{key}"  # requests are asynchronous: one queue per partition
                if key in paired:
                    op.sub_op = "PUSH_REQ" if stage == "PUSH" else "PULL_RES"
                    op.txn = f"{stage.lower()}:{key}:w{wid}"
                else:
                    op.sub_op, op.txn, op.group = "SENDRECV", f"{stage.lower()}:{key}", root_group
            else:
                op.sub_op = "IN" if stage in IN_STAGES else "OUT"
                op.txn = f"{stage.lower()}:{key}@{name}"
            nt.ops[oid] = op
            chains[(tensor, key)].append((STAGES.index(stage), oid))
            for i, (ts, dur) in enumerate(ivs[:n_steps]):
                if key in paired and stage in ("PUSH", "PULL"):
                    _, push_be, pull_be = srv_req[(key, wid)]
                    if stage == "PUSH":  # the server's handling is the server op's, the rest (network) this one's
                        dur = max(0.0, dur - (push_be[i][1] - push_be[i][0]))
                    else:
                        own = max(0.0, dur - (pull_be[i][1] - pull_be[i][0]))
                        ts, dur = ts + dur - own, own
                nt.events.append(Event(oid, steps[i], ts, dur))
        for chain in chains.values():
            chain.sort()
            nt.edges += [(a, b) for (_, a), (_, b) in zip(chain, chain[1:])]
        _add_ready_ops(nt, rc, chains, steps)
        for i, s in enumerate(steps):
            ivs = [v[i] for v in rc.stages.values()] + [v[i] for v in rc.totals.values() if len(v) > i]
            t0, t1 = min(t for t, _ in ivs), max(t + d for t, d in ivs)
            nt.steps[s] = (t0, t1 - t0)
        nodes[name] = nt
        infos.append(info)
        files[name] = str(rc.path)

    for m, lr0 in roots.items():
        for (mm, lr), rc in comm.items():
            if mm == m and lr != lr0:
                _link_to_root(nodes[name_of[(m, lr0)]], nodes[name_of[(m, lr)]], lr, m)
    for m in {m for m, _ in comm} - set(roots):
        if any(s == "COPYH2D" for rc in (comm[x] for x in comm if x[0] == m) for _, _, s in rc.stages):
            notes.append(f"machine {m}: the root GPU's trace is missing; waits for it stay as measured gaps")

    for si, sp in enumerate(servers):
        keys = sorted({k for (k, w) in srv_req if srv_req[(k, w)][0] == si and k in paired})
        if not keys:
            continue
        name = f"server{srank[si]}"
        info = NodeInfo(name, "server", srank[si], name, f"{name}.events.json.gz", f"{name}.dfg.json.gz")
        nt = NodeTrace(info=info)
        for k in keys:
            tensor = tensor_of[k]
            for w in sorted(present_roots):
                _, push_be, pull_be = srv_req[(k, w)]
                for kind, sub, be in (("push", "PUSH_RES", push_be), ("pull", "PULL_REQ", pull_be)):
                    oid = f"{kind}#{k}.w{w}"
                    nt.ops[oid] = Op(oid, f"{kind}-{9 + 2 * w}", "COMM", f"{kind}#{k}.w{w}", sub_op=sub,
                                     tensor=tensor, bytes=nbytes(tensor, k), txn=f"{kind}:{k}:w{w}")
                    nt.events += [Event(oid, steps[i], b, e - b) for i, (b, e) in enumerate(be)]
            # a pull is answered once every worker's push of the key was summed
            nt.edges += [(f"push#{k}.w{a}", f"pull#{k}.w{b}") for a in sorted(present_roots) for b in sorted(present_roots)]
        nodes[name] = nt
        infos.append(info)
        files[name] = str(sp.path)

    manifest = Manifest(framework, "ps", "byteps", world, infos, steps,
                        meta={"importer": "byteps", "source": str(root), "files": files,
                              "local_size": local_size, "start_step": start_step})
    gt = GTrace(manifest=manifest, nodes=nodes, notes=notes)
    for n in notes:
        log.info("%s", n)
    return gt
