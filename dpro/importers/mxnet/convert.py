"""Turn an MXNet parameter-server recording into a gTrace (scheme ``ps``, library ``ps-lite``).

Inputs in the recording directory (written by :mod:`dpro.profiler.mxnet`):
``rank<r>.json.gz`` (the worker's ``mx.profiler`` Chrome trace), ``rank<r>.meta.json``
(steps, kvstore keys, hybridized symbol) and ``server<i>.kv.json`` (each server's
per-key update times).

Per worker, key k, server slice s and step: the worker's ``KVStoreDist*PushPull`` engine
op runs from ``a`` (the engine dispatched ZPushPull: gradient ready, request sent) to ``b``
(the response with the new weights arrived); the server updates its slice from ``u0``
(every worker's push arrived: the updater was called) to ``u1`` (new weights ready, the
responses go out). These become

* worker ``PUSH_REQ`` [a, a + up] with ``up = u0 - max_w a_w`` (the last push's way to
  the server, incl. merging it), paired with the server's ``PUSH_RES`` [a + up, +0];
* server ``UPDATE`` op [u0, u1] waiting for every worker's ``PUSH_RES`` of the key;
* server ``PULL_REQ`` [u1, b] (the response's way back), paired with the worker's
  ``PULL_RES`` [b, +0], then the worker's copy of the pulled weights into the parameter
  (device ``cpu:copy``: its wait for the busy compute thread is its measured gap).

The profiler does not name the key of a push/pull op: a step's push/pull ops are matched
to its keys by a linear assignment (see :func:`_match`); an op must have started before
its key's update and ended after it (violations, which should not happen, become a note).
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from dpro.contracts.recording import RANK_META_GLOB, SERVER_GLOB, MetaKey, rank_meta_name
from dpro.errors import DproInputError
from dpro.gtrace.schema import Event, GTrace, Manifest, NodeInfo, NodeTrace, Op, Tensor
from dpro.importers.mxnet.memory import attach_counter
from dpro.importers.mxnet.read import Interval, ServerRaw, WorkerRaw, read_server, read_worker
from dpro.progress import progress_bar

log = logging.getLogger(__name__)

KV_OP = re.compile(r"^KVStoreDist\w*(PushPull|Push|Pull)$")
COPY = "CopyCPU2CPU"
STEP_END = "STEP_END@cpu:main"
FLOAT_DEV = "cpu:float"
BULK = "ImperativeBulk"  # one op per bulked segment of a hybridized block


@dataclass
class _StepView:
    compute: list[Interval]
    kv: list[Interval]


def _split_step(w: WorkerRaw, step: int) -> _StepView:
    t0, dur = w.steps[step]
    inside = sorted((o for o in w.ops if t0 <= o.ts <= t0 + dur), key=lambda o: (o.ts, o.end))
    return _StepView([o for o in inside if not KV_OP.match(o.name)], [o for o in inside if KV_OP.match(o.name)])


def _layers(symbol: dict | None) -> tuple[dict[str, list[str]], dict[str, str]]:
    """op type -> layer names in graph order; parameter name -> the layer consuming it."""
    by_type: dict[str, list[str]] = defaultdict(list)
    consumer: dict[str, str] = {}
    if not isinstance(symbol, dict) or not isinstance(symbol.get("nodes"), list):
        return by_type, consumer
    nodes = symbol["nodes"]
    for n in nodes:
        if not isinstance(n, dict) or n.get("op") in (None, "null"):
            continue
        layer = re.sub(r"_fwd$", "", str(n.get("name")))
        by_type[str(n["op"])].append(layer)
        for inp in n.get("inputs", []):
            src = nodes[inp[0]] if isinstance(inp, list) and inp and isinstance(inp[0], int) and inp[0] < len(nodes) else None
            if isinstance(src, dict) and src.get("op") == "null":
                consumer.setdefault(str(src.get("name")), layer)
    return by_type, consumer


def _match(kv: list[Interval], ups: list[dict[int, tuple[float, float, float, int]]]) -> list[Interval]:
    """The push/pull op of each key (``ups[i]``: the key's server updates).

    An op can belong to a key only if it started before the key's update began (its push
    is one the update waited for) and ended after the update ended (it carries the new
    weights back). Among such assignments, the one with the least squared waiting on both
    sides (op start -> update start, update end -> op end) wins (a linear assignment).
    """
    import numpy as np
    from scipy.optimize import linear_sum_assignment

    u0 = np.array([min(v[0] for v in u.values()) for u in ups])
    u1 = np.array([max(v[2] for v in u.values()) for u in ups])
    a = np.array([o.ts for o in kv])[:, None]
    b = np.array([o.end for o in kv])[:, None]
    cost = (u0[None, :] - a) ** 2 + (b - u1[None, :]) ** 2
    cost = cost + np.where((a <= u0[None, :] + 1.0) & (b >= u1[None, :] - 1.0), 0.0, 1e15)
    rows, cols = linear_sum_assignment(cost)
    out: list[Interval] = [kv[0]] * len(ups)
    for r, c in zip(rows, cols):
        out[c] = kv[r]
    return out


def collect_mxnet(raw: Path, *, progress: bool | None = None) -> GTrace:
    """Build the gTrace of an MXNet PS job from its recording directory."""
    raw = Path(raw)
    metas = sorted(raw.glob(RANK_META_GLOB))
    if not metas:
        raise DproInputError(raw, f"no worker recorded anything ({RANK_META_GLOB})")
    servers_f = sorted(raw.glob(SERVER_GLOB))
    if not servers_f:
        raise DproInputError(raw, f"no server timing ({SERVER_GLOB}): were the servers started with "
                                  "dpro.profiler.mxnet.server.run_ps_node, and is the update on the kvstore?")
    with progress_bar(len(metas) + len(servers_f), "reading MXNet traces", enabled=progress) as tick:
        workers = []
        for m in metas:
            tick(m.name)
            workers.append(read_worker(m))
        servers = []
        for f in servers_f:
            tick(f.name)
            servers.append(read_server(f))
    if len({w.rank for w in workers}) != len(workers):
        raise DproInputError(raw, "two workers recorded the same rank")
    if len({s.rank for s in servers}) != len(servers):
        raise DproInputError(raw, "two servers wrote the same server rank")
    return _build(raw, workers, servers)


def _build(raw: Path, workers: list[WorkerRaw], servers: list[ServerRaw]) -> GTrace:
    notes: list[str] = []
    steps = sorted(set.intersection(*(set(w.steps) for w in workers)))
    if not steps:
        raise DproInputError(raw, "the workers have no profiled step in common")
    keys = workers[0].keys
    for w in workers[1:]:
        if {k: v["bytes"] for k, v in w.keys.items()} != {k: v["bytes"] for k, v in keys.items()}:
            raise DproInputError(w.path.with_name(rank_meta_name(w.rank)), "its kvstore keys differ from rank "
                                 f"{workers[0].rank}'s")
    if not keys:
        raise DproInputError(workers[0].path.with_name(rank_meta_name(workers[0].rank)),
                             "no kvstore push/pull was seen in the profiled steps")
    # (key, step) -> {server rank: (u0, merged, u1, bytes)}
    upd: dict[tuple[int, int], dict[int, tuple[float, float, float, int]]] = defaultdict(dict)
    for s in servers:
        for (k, call), v in s.updates.items():
            upd[(k, call)][s.rank] = v
    slices: dict[int, dict[int, int]] = {}
    for k in keys:
        got = upd.get((k, steps[0]))
        if not got:
            raise DproInputError(servers[0].path, f"no server updated key {k} ({keys[k]['name']}) in step {steps[0]}: "
                                 "server update counts do not line up with the workers' steps")
        slices[k] = {srv: v[3] for srv, v in got.items()}
        total = sum(slices[k].values())
        if total != keys[k]["bytes"]:
            notes.append(f"key {k} ({keys[k]['name']}): the servers hold {total} bytes, the worker sent {keys[k]['bytes']}")
    split = [k for k, sl in slices.items() if len(sl) > 1]
    if split:
        notes.append(f"{len(split)} key(s) split across servers (MXNET_KVSTORE_BIGARRAY_BOUND): "
                     + ", ".join(keys[k]["name"] for k in split[:5]))
    by_type, consumer = _layers(workers[0].meta.get(MetaKey.SYMBOL))

    nodes: dict[str, NodeTrace] = {}
    # pushpull op of (worker, key, step) -> (a, b)
    kvt: dict[tuple[int, int, int], tuple[float, float]] = {}
    views = {(w.rank, s): _split_step(w, s) for w in workers for s in steps}
    mismatched = 0
    last_push: dict[tuple[int, int], float] = {}
    for w in workers:
        for s in steps:
            kv = sorted(views[(w.rank, s)].kv, key=lambda o: o.end)
            present = [k for k in keys if all((k, s) in upd and srv in upd[(k, s)] for srv in slices[k])]
            if len(present) != len(keys):
                raise DproInputError(servers[0].path, f"step {s}: the servers updated {len(present)} of {len(keys)} keys")
            order = sorted(keys)
            if len(kv) != len(order):
                raise DproInputError(w.path, f"step {s}: {len(kv)} kvstore push/pull ops but {len(order)} keys")
            for k, o in zip(order, _match(kv, [upd[(k, s)] for k in order])):
                kvt[(w.rank, k, s)] = (o.ts, o.end)
                last_push[(k, s)] = max(last_push.get((k, s), o.ts), o.ts)
                u = upd[(k, s)]
                if o.ts > min(v[0] for v in u.values()) + 1.0 or o.end < max(v[2] for v in u.values()) - 1.0:
                    mismatched += 1
    if mismatched:
        notes.append(f"{mismatched} push/pull op(s) could not be matched to their key consistently "
                     "(started after or ended before the key's server update)")

    for w in workers:
        nodes[f"worker{w.rank}"] = _worker_node(w, steps, keys, slices, upd, kvt, last_push, views, by_type, consumer, notes)
    for srv in servers:
        nodes[f"server{srv.rank}"] = _server_node(srv, workers, steps, keys, slices, upd, kvt)
    host = str(workers[0].meta.get(MetaKey.HOST) or "host0")
    infos = [nt.info for nt in nodes.values()]
    m0 = workers[0].meta
    manifest = Manifest(
        framework="mxnet", scheme="ps", library="ps-lite",
        world_size=max(int(m0.get(MetaKey.WORLD_SIZE) or 0), max(w.rank for w in workers) + 1),
        nodes=infos, steps=steps,
        meta={"recorder": "dpro", "framework_version": m0.get(MetaKey.FRAMEWORK_VERSION),
              "kvstore": m0.get(MetaKey.KVSTORE), "num_servers": len(servers),
              "bigarray_bound": m0.get(MetaKey.BIGARRAY_BOUND), "host": host},
    )
    missing = sorted(set(range(manifest.world_size)) - {w.rank for w in workers})
    if missing:
        raise DproInputError(raw, f"workers {missing} recorded nothing: a PS trace needs every worker "
                                  "(the server's update waits for all of them)")
    return GTrace(manifest, nodes, notes=notes)


def _worker_node(w: WorkerRaw, steps: list[int], keys: dict[int, dict], slices: dict[int, dict[int, int]],
                 upd: dict, kvt: dict, last_push: dict, views: dict, by_type: dict[str, list[str]], consumer: dict[str, str],
                 notes: list[str]) -> NodeTrace:
    name = f"worker{w.rank}"
    nt = NodeTrace(NodeInfo(name, "worker", w.rank, str(w.meta.get(MetaKey.HOST) or "host0")))
    main_tid = max({o.tid for o in w.ops}, key=lambda t: sum(o.tid == t for o in w.ops))
    dev_of = {main_tid: "cpu:main"}
    edges: set[tuple[str, str]] = set()
    first = True
    dropped = 0
    key_by_name = {v["name"]: k for k, v in keys.items()}
    producer: dict[int, str] = {}
    floating = _floating_ops([[o for o in views[(w.rank, s)].compute if o.tid == main_tid and o.name != COPY]
                              for s in steps])
    if floating:
        notes.append(f"{name}: op(s) whose place in the compute order changes from step to step run on their own "
                     f"queue (cpu:float): " + ", ".join(f"{a}#{b}" for a, b in sorted(floating)))
    for s in steps:
        v = views[(w.rank, s)]
        # pulled-weight copies: a copy that starts after a push/pull op ended belongs to it (FIFO)
        ends = sorted(((kvt[(w.rank, k, s)][1], k) for k in keys), key=lambda x: x[0])
        copy_key: dict[int, int] = {}
        taken: set[int] = set()
        for i, o in enumerate(v.compute):
            if o.name != COPY:
                continue
            cand = [k for e, k in ends if e <= o.ts and k not in taken]
            if cand:
                copy_key[i] = cand[0]
                taken.add(cand[0])
        seq = [(i, o) for i, o in enumerate(v.compute) if i not in copy_key]
        bw_idx = [j for j, (_, o) in enumerate(seq) if o.name.startswith("_backward")]
        bulk_bw = set() if bw_idx else _bulked_backward(seq, main_tid, {f for f, _ in floating})
        last_bw = bw_idx[-1] if bw_idx else max(bulk_bw, default=-1)
        count: dict[tuple[str, str], int] = defaultdict(int)
        ids: list[str] = []
        for j, (i, o) in enumerate(seq):
            dev = dev_of.setdefault(o.tid, f"cpu:{len(dev_of)}")
            n = count[(o.name, dev)]
            count[(o.name, dev)] += 1
            if o.tid == main_tid and (o.name, n) in floating:
                dev = FLOAT_DEV
            oid = f"{o.name}@{dev}#{n}"
            ids.append(oid)
            if oid not in nt.ops:
                if not first:
                    dropped += 1
                    continue
                # between the first and the last backward op, internal ops (``_zeros``, ...)
                # belong to the backward pass; named ones (the loss's ``mean``) run late
                if o.name.startswith("_backward") or j in bulk_bw or (bw_idx and bw_idx[0] < j < last_bw
                                                      and (o.name.startswith("_") or o.name == BULK)):
                    cat = "BW"
                    layers = list(reversed(by_type.get(o.name[len("_backward_"):], [])))
                elif j < last_bw or last_bw < 0:
                    cat = "FW"
                    layers = by_type.get(o.name, [])
                else:
                    cat = "UPDATE" if o.name.endswith("_update") else "OTHER"
                    layers = []
                layer = layers[n] if n < len(layers) else None
                nt.ops[oid] = Op(oid, o.name, cat, dev, layer=layer)
            nt.events.append(Event(oid, s, o.ts, o.end - o.ts))
        if first:
            prev: dict[str, str] = {}
            for oid in ids:
                d = nt.ops[oid].device
                if d in prev:
                    edges.add((prev[d], oid))
                prev[d] = oid
            bw_ops = [oid for oid in ids if nt.ops[oid].cat == "BW"]
            for pname, layer in consumer.items():
                if pname in key_by_name:
                    cands = [oid for oid in bw_ops if nt.ops[oid].layer == layer]
                    if cands:
                        producer[key_by_name[pname]] = cands[-1]
            for k in keys:
                if k not in producer:
                    producer[k] = bw_ops[-1] if bw_ops else ids[-1]
            last_ops = list(prev.values())
        for i, k in copy_key.items():
            o = v.compute[i]
            oid = f"copy:{keys[k]['name']}@cpu:copy"
            if oid not in nt.ops:
                # Its own queue: it waits for the compute thread, and that wait is in its gap
                # (on cpu:main the replay would charge the wait twice).
                nt.ops[oid] = Op(oid, COPY, "OTHER", "cpu:copy", layer=None)
                edges.add((oid, STEP_END))
            nt.events.append(Event(oid, s, o.ts, o.end - o.ts))
        first = False
        for k in keys:
            a, b = kvt[(w.rank, k, s)]
            a_last = last_push[(k, s)]
            for srv in slices[k]:
                u0 = upd[(k, s)][srv][0]
                up = max(0.0, u0 - a_last)
                pid, rid = f"push:{keys[k]['name']}@s{srv}", f"pull:{keys[k]['name']}@s{srv}"
                nt.events.append(Event(pid, s, a, up))
                nt.events.append(Event(rid, s, b, 0.0))
    if dropped:
        notes.append(f"{name}: {dropped} op execution(s) not in the first profiled step's op sequence were left out")
    for k, info in keys.items():
        for srv, nbytes in slices[k].items():
            tensor = info["name"] if len(slices[k]) == 1 else f"{info['name']}[s{srv}]"
            pid, rid = f"push:{info['name']}@s{srv}", f"pull:{info['name']}@s{srv}"
            nt.ops[pid] = Op(pid, "push", "COMM", f"push:{info['name']}:s{srv}", sub_op="PUSH_REQ", tensor=tensor,
                             bytes=nbytes, txn=f"push.{k}.s{srv}.w{w.rank}", peer=None)
            nt.ops[rid] = Op(rid, "pull", "COMM", f"pull:{info['name']}:s{srv}", sub_op="PULL_RES", tensor=tensor,
                             bytes=nbytes, txn=f"pull.{k}.s{srv}.w{w.rank}", peer=None)
            edges.update({(producer[k], pid), (pid, rid), (rid, STEP_END)})
            cp = f"copy:{info['name']}@cpu:copy"
            if cp in nt.ops:
                edges.add((rid, cp))
        nt.tensors.append(Tensor(info["name"], int(info["bytes"]), tuple(int(x) for x in info.get("shape", [])),
                                 str(info.get("dtype", "float32")), producer=producer.get(k),
                                 txn=f"push.{k}.s{min(slices[k])}.w{w.rank}"))
    nt.ops[STEP_END] = Op(STEP_END, "STEP_END", "OTHER", "cpu:main")
    edges.update((oid, STEP_END) for oid in last_ops)
    for s in steps:
        t0, dur = w.steps[s]
        nt.steps[s] = (t0, dur)
        nt.events.append(Event(STEP_END, s, t0 + dur, 0.0))
    nt.edges = sorted(edges)
    nt.meta = {"framework_version": w.meta.get(MetaKey.FRAMEWORK_VERSION), "kvstore": w.meta.get(MetaKey.KVSTORE),
               "keys": {str(k): v["name"] for k, v in keys.items()},
               # the recorder's step walls and the recorded step numbers: the profiling overhead
               # (dpro.graph.overhead), as for the torch backend
               "steps": sorted(w.steps)}
    for k in (MetaKey.STEP_WALL_US, MetaKey.STEP_WALL_AFTER_US):
        if isinstance(w.meta.get(k), list):
            nt.meta[k] = [float(x) for x in w.meta[k]]
    if isinstance(w.meta.get(MetaKey.WINDOW_CHANGES_JOB), str):
        nt.meta[MetaKey.WINDOW_CHANGES_JOB] = w.meta[MetaKey.WINDOW_CHANGES_JOB]
    attach_counter(nt, w.counters, w.meta.get(MetaKey.MEMORY))
    return nt


def _server_node(srv: ServerRaw, workers: list[WorkerRaw], steps: list[int], keys: dict[int, dict],
                 slices: dict[int, dict[int, int]], upd: dict, kvt: dict) -> NodeTrace:
    name = f"server{srv.rank}"
    nt = NodeTrace(NodeInfo(name, "server", srv.rank, srv.host))
    mine = [k for k in keys if srv.rank in slices[k]]
    for k in mine:
        pname, nbytes = keys[k]["name"], slices[k][srv.rank]
        tensor = pname if len(slices[k]) == 1 else f"{pname}[s{srv.rank}]"
        agg = f"update:{pname}"
        nt.ops[agg] = Op(agg, "aggregate+update", "UPDATE", "cpu:server")
        for w in workers:
            r = w.rank
            a, b = f"push:{pname}@w{r}", f"pull:{pname}@w{r}"
            nt.ops[a] = Op(a, "push", "COMM", f"recv:{pname}:w{r}", sub_op="PUSH_RES", tensor=tensor, bytes=nbytes,
                           txn=f"push.{k}.s{srv.rank}.w{r}", peer=r)
            nt.ops[b] = Op(b, "pull", "COMM", f"send:{pname}:w{r}", sub_op="PULL_REQ", tensor=tensor, bytes=nbytes,
                           txn=f"pull.{k}.s{srv.rank}.w{r}", peer=r)
            nt.edges += [(a, agg), (agg, b)]
        for s in steps:
            u0, _, u1, _ = upd[(k, s)][srv.rank]
            a_last = max(kvt[(w.rank, k, s)][0] for w in workers)
            up = max(0.0, u0 - a_last)
            nt.events.append(Event(agg, s, u0, u1 - u0))
            for w in workers:
                a, b = kvt[(w.rank, k, s)]
                # received at a + up; it waits there for the step's last push of the key
                # (the server merges and updates only then)
                wait = _push_wait(u0, a + up, w.steps[s][0], [x.steps[s][0] for x in workers])
                nt.events.append(Event(f"push:{pname}@w{w.rank}", s, a + up, wait))
                nt.events.append(Event(f"pull:{pname}@w{w.rank}", s, u1, max(0.0, b - u1)))
    # the updates run one at a time on the server's main thread: one device, no order edges
    # (the order changes from step to step with the order the pushes complete in)
    return nt


def _bulked_backward(seq: list[tuple[int, Interval]], main_tid: int, floating: set[str]) -> set[int]:
    """Indices in ``seq`` of the backward pass of a step recorded with operator bulking on
    (the default: no ``_backward_*`` op is visible, a bulked segment is one ``BULK`` op).

    The backward is the trailing run of bulks on the compute thread, after the last op that
    is not a bulk (the loss, run imperatively outside the hybridized block).  Where every
    op of the step is a bulk (the loss inside the block), only the last one is taken: the
    forward and the backward cannot be told apart any better from the trace.  Ops that
    move around the order (``floating``, e.g. ``SetValueOp``) are not looked at."""
    main = [(j, o) for j, (_, o) in enumerate(seq) if o.tid == main_tid and o.name not in floating]
    run: list[int] = []
    for j, o in reversed(main):
        if o.name != BULK:
            break
        run.append(j)
    if not run:
        return set()
    if len(run) == len(main):
        return {run[0]} if len(run) > 1 else set()
    return set(run)


def _floating_ops(seqs: list[list[Interval]], rounds: int = 4) -> set[tuple[str, int]]:
    """Ops of the compute thread whose place in the order changes between steps.

    The local DFG chains the compute thread's ops in the first step's order and charges
    each op's wait after its chain predecessor (its gap).  MXNet runs some ops that no
    graph op depends on (``SetValueOp``: in our traces after ``Convolution#0`` in 4 of 8
    steps, elsewhere in the others) wherever the engine picks them; chained at one place,
    their mean gap would hold the chain up by work that ran before them.  Up to ``rounds``
    ops are taken out, one at a time: the one whose removal leaves the fewest ops with a
    changing predecessor (ties: the shortest), until every op keeps its predecessor.
    """
    ids: list[list[tuple[str, int]]] = []
    busy: dict[tuple[str, int], float] = defaultdict(float)
    for seq in seqs:
        cnt: dict[str, int] = defaultdict(int)
        row = []
        for o in seq:
            x = (o.name, cnt[o.name])
            cnt[o.name] += 1
            row.append(x)
            busy[x] += o.end - o.ts
        ids.append(row)

    def unstable(out: set) -> set[tuple[str, int]]:
        preds: dict[tuple[str, int], set] = defaultdict(set)
        for row in ids:
            kept = [x for x in row if x not in out]
            for a, b in zip([None] + kept, kept):
                preds[b].add(a)
        bad = {b for b, ps in preds.items() if len(ps) > 1}
        return bad | {a for b in bad for a in preds[b] if a is not None}

    out: set[tuple[str, int]] = set()
    for _ in range(rounds):
        cands = unstable(out)
        if not cands:
            break
        out.add(min(cands, key=lambda x: (len(unstable(out | {x})), busy[x], x)))
    return out if not unstable(out) else set()


def _push_wait(u0: float, arrived: float, start: float, starts: list[float]) -> float:
    """How long a push waits at the server for its key's update (µs, >= 0).

    The replay starts every worker's step at one time, the workers' mean step start; in
    the trace they start staggered (each when its own last pull returned) and in each step
    a different worker pushes last.  So the push is placed where its worker's own step
    puts it (``arrived - start``) and waits until the update's start as seen from the
    mean step start: replayed, the update waits for the latest of these, which is the
    mean update start rather than the latest worker's mean push.  Never past ``u0`` on the
    trace's own clock (the update's own time is measured from its last push's arrival).
    """
    return max(0.0, min(u0 - arrived, (u0 - sum(starts) / len(starts)) - (arrived - start)))
