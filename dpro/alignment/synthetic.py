"""Synthetic multi-node traces with a known clock per node (tests, benchmarks).

:func:`ring_job` simulates ring AllReduce as fine-grained SEND/RECV ops: at ring step j
rank r posts a SEND to r+1 and a RECV from r-1; the chunk flows once both sides have
posted (rendezvous) and takes ``chunk_us`` plus jitter; the next step starts after the
chunk arrived and a small reduction.  :func:`collective_job` records each collective as
one coarse ALLREDUCE op per rank (as gloo/NCCL traces do): it starts when the rank joins,
the ring runs once the last rank joined, and every rank finishes at the ring's end plus a
small per-rank jitter.  Times are simulated on one true clock; node n records them on its
own clock, ``true + skew_us[n]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpro.gtrace.schema import Event, GTrace, Manifest, NodeInfo, NodeTrace, Op

T0 = 1_000_000.0


@dataclass
class JobSpec:
    nodes: int = 4
    #: host of every node (default: one host per node)
    hosts: list[str] | None = None
    steps: int = 10
    #: gradient tensors (or buckets) synchronised per step, bytes each
    tensor_bytes: list[int] | None = None
    #: compute time per tensor in backward (µs), and its per-rank jitter (std, µs)
    compute_us: float = 400.0
    compute_jitter_us: float = 60.0
    #: time of one ring step for a 1 MB chunk (µs) and fixed latency (µs)
    us_per_mb: float = 80.0
    latency_us: float = 20.0
    #: jitter of every transfer / finish (std, µs)
    comm_jitter_us: float = 5.0
    #: clock of every node: recorded = true + skew (µs)
    skew_us: dict[str, float] | None = None
    seed: int = 0


def _node_names(n: int) -> list[str]:
    return [f"worker{r}" for r in range(n)]


def _base(spec: JobSpec) -> tuple[list[str], list[str], dict[str, float], list[int]]:
    names = _node_names(spec.nodes)
    hosts = spec.hosts or [f"host{r}" for r in range(spec.nodes)]
    if len(hosts) != spec.nodes:
        raise ValueError("one host per node")
    skew = {n: 0.0 for n in names}
    skew.update(spec.skew_us or {})
    tb = spec.tensor_bytes or [4 << 20] * 5
    return names, hosts, skew, tb


def _trace(names, hosts, nodes: dict[str, NodeTrace], steps: list[int], meta: dict) -> GTrace:
    infos = [NodeInfo(n, "worker", r, hosts[r], f"{n}.events.json.gz", f"{n}.dfg.json.gz") for r, n in enumerate(names)]
    for r, n in enumerate(names):
        nodes[n].info = infos[r]
    m = Manifest("pytorch", "allreduce", "synthetic", len(names), infos, steps, meta=meta)
    return GTrace(m, nodes)


def ring_job(spec: JobSpec) -> GTrace:
    """Fine-grained ring AllReduce (SEND/RECV per chunk and ring step)."""
    names, hosts, skew, tb = _base(spec)
    rng = np.random.default_rng(spec.seed)
    N, S = spec.nodes, spec.steps
    J = 2 * (N - 1)
    nodes = {n: NodeTrace(NodeInfo(n, "worker", r, hosts[r])) for r, n in enumerate(names)}
    for r, n in enumerate(names):
        nt = nodes[n]
        prev = None
        for t in range(len(tb)):
            bw = f"bw{t}"
            nt.ops[bw] = Op(bw, f"backward{t}", "BW", "cpu:main")
            if prev:
                nt.edges.append((prev, bw))
            prev_comm = bw
            for j in range(J):
                s_id, r_id = f"send{t}.{j}", f"recv{t}.{j}"
                nt.ops[s_id] = Op(s_id, "send", "COMM", "comm", sub_op="SEND", tensor=f"t{t}",
                                  bytes=tb[t] // N, txn=f"t{t}.j{j}.{r}->{(r + 1) % N}", peer=(r + 1) % N)
                nt.ops[r_id] = Op(r_id, "recv", "COMM", "comm", sub_op="RECV", tensor=f"t{t}",
                                  bytes=tb[t] // N, txn=f"t{t}.j{j}.{(r - 1) % N}->{r}", peer=(r - 1) % N)
                nt.edges.append((prev_comm, s_id))
                nt.edges.append((prev_comm, r_id))
                prev_comm = r_id
            prev = bw
    step_len = len(tb) * spec.compute_us + 2000.0 + J * len(tb) * (spec.latency_us + spec.us_per_mb * max(tb) / N / 2**20) * 1.5
    for si in range(S):
        start = T0 + si * step_len
        t_cpu = np.full(N, start)
        t_comm = np.full(N, start)
        ends = np.full(N, start)
        for t in range(len(tb)):
            t_cpu = t_cpu + spec.compute_us + rng.normal(0, spec.compute_jitter_us, N).clip(-spec.compute_us / 2)
            for r, n in enumerate(names):
                nodes[n].events.append(Event(f"bw{t}", si, t_cpu[r] - spec.compute_us + skew[n], spec.compute_us))
            chunk = spec.latency_us + spec.us_per_mb * tb[t] / N / 2**20
            post = np.maximum(t_cpu, t_comm)
            for j in range(J):
                src = np.roll(np.arange(N), 1)  # rank r receives from r-1
                flow = np.maximum(post, post[src])
                rend = flow + chunk + np.abs(rng.normal(0, spec.comm_jitter_us, N))
                send_end = np.roll(rend, -1)  # r's send ends when r+1 received it
                for r, n in enumerate(names):
                    nodes[n].events.append(Event(f"send{t}.{j}", si, post[r] + skew[n], send_end[r] - post[r]))
                    nodes[n].events.append(Event(f"recv{t}.{j}", si, post[r] + skew[n], rend[r] - post[r]))
                post = np.maximum(rend, send_end) + 2.0
            t_comm = post
            ends = np.maximum(ends, post)
        for r, n in enumerate(names):
            nodes[n].steps[si] = (start + skew[n], float(max(ends[r], t_cpu[r])) - start + 50.0)
    return _trace(names, hosts, nodes, list(range(S)), {"generator": "dpro.alignment.synthetic.ring_job"})


def collective_job(spec: JobSpec) -> GTrace:
    """Coarse collectives: one ALLREDUCE op per rank per tensor."""
    names, hosts, skew, tb = _base(spec)
    rng = np.random.default_rng(spec.seed)
    N, S, T = spec.nodes, spec.steps, len(tb)
    J = 2 * (N - 1)
    nodes = {n: NodeTrace(NodeInfo(n, "worker", r, hosts[r])) for r, n in enumerate(names)}
    for r, n in enumerate(names):
        nt = nodes[n]
        for t in range(T):
            bw, ar = f"bw{t}", f"allreduce{t}"
            nt.ops[bw] = Op(bw, f"backward{t}", "BW", "cpu:main")
            nt.ops[ar] = Op(ar, "all_reduce", "COMM", "comm", sub_op="ALLREDUCE", tensor=f"t{t}", bytes=tb[t],
                            txn=f"allreduce.{t}", group=tuple(range(N)))
            nt.edges.append((bw, ar))
            if t:
                nt.edges.append((f"bw{t - 1}", bw))
                nt.edges.append((f"allreduce{t - 1}", ar))
    dur = np.array([J * (spec.latency_us + spec.us_per_mb * b / N / 2**20) for b in tb])
    step_len = T * spec.compute_us + float(dur.sum()) + 5000.0
    ts_all = np.empty((S, T, N))
    te_all = np.empty((S, T, N))
    bw_all = np.empty((S, T, N))
    for si in range(S):
        start = T0 + si * step_len
        cpu = start + np.cumsum(spec.compute_us + rng.normal(0, spec.compute_jitter_us, (T, N)).clip(-spec.compute_us / 2), axis=0)
        free = np.full(N, start)
        for t in range(T):
            join = np.maximum(cpu[t], free)
            end = join.max() + dur[t] + np.abs(rng.normal(0, spec.comm_jitter_us, N))
            ts_all[si, t], te_all[si, t], bw_all[si, t] = join, end, cpu[t]
            free = end
    for r, n in enumerate(names):
        nt = nodes[n]
        d = skew[n]
        ev = nt.events
        for si in range(S):
            for t in range(T):
                ev.append(Event(f"bw{t}", si, float(bw_all[si, t, r] - spec.compute_us + d), spec.compute_us))
                ev.append(Event(f"allreduce{t}", si, float(ts_all[si, t, r] + d), float(te_all[si, t, r] - ts_all[si, t, r])))
            start = T0 + si * step_len
            nt.steps[si] = (start + d, float(te_all[si, -1, r] - start) + 50.0)
    return _trace(names, hosts, nodes, list(range(S)), {"generator": "dpro.alignment.synthetic.collective_job"})


def ps_job(spec: JobSpec) -> GTrace:
    """Parameter server: ``spec.nodes`` workers and one server (node ``server0``).

    Worker w pushes tensor t (PUSH_REQ) once its gradient is ready; the server's receive
    (PUSH_RES) is posted at about the same moment, sometimes before, sometimes after; once
    every push of t arrived the server aggregates and answers each worker (PULL_REQ), whose
    receive (PULL_RES) is posted around then.  Each transfer flows once both sides posted.
    ``spec.hosts`` names the workers' hosts; the server gets host ``ps-host``.
    """
    names, hosts, _, tb = _base(spec)
    skew = {n: 0.0 for n in names + ["server0"]}
    skew.update(spec.skew_us or {})
    rng = np.random.default_rng(spec.seed)
    W, S, T = spec.nodes, spec.steps, len(tb)
    nodes = {n: NodeTrace(NodeInfo(n, "worker", r, hosts[r])) for r, n in enumerate(names)}
    srv = NodeTrace(NodeInfo("server0", "server", 0, "ps-host"))
    for w, n in enumerate(names):
        nt = nodes[n]
        for t in range(T):
            nt.ops[f"bw{t}"] = Op(f"bw{t}", f"backward{t}", "BW", "cpu:main")
            nt.ops[f"push{t}"] = Op(f"push{t}", "push", "COMM", "comm", sub_op="PUSH_REQ", tensor=f"t{t}", bytes=tb[t], txn=f"push.{t}.{w}")
            nt.ops[f"pull{t}"] = Op(f"pull{t}", "pull", "COMM", "comm", sub_op="PULL_RES", tensor=f"t{t}", bytes=tb[t], txn=f"pull.{t}.{w}")
            nt.edges += [(f"bw{t}", f"push{t}"), (f"push{t}", f"pull{t}")]
            if t:
                nt.edges.append((f"bw{t - 1}", f"bw{t}"))
        for t in range(T):
            a, b = f"push_res{t}.{w}", f"pull_req{t}.{w}"
            srv.ops[a] = Op(a, "push_res", "COMM", "comm", sub_op="PUSH_RES", tensor=f"t{t}", bytes=tb[t], txn=f"push.{t}.{w}")
            srv.ops[b] = Op(b, "pull_req", "COMM", "comm", sub_op="PULL_REQ", tensor=f"t{t}", bytes=tb[t], txn=f"pull.{t}.{w}")
            for w2 in range(W):
                srv.edges.append((a, f"pull_req{t}.{w2}"))
    xfer = np.array([spec.latency_us + spec.us_per_mb * b / 2**20 for b in tb])
    step_len = T * spec.compute_us + 4 * float(xfer.sum()) + 5000.0
    steps = list(range(S))
    for si in steps:
        start = T0 + si * step_len
        cpu = start + np.cumsum(spec.compute_us + rng.normal(0, spec.compute_jitter_us, (T, W)).clip(-spec.compute_us / 2), axis=0)
        last = np.full(W, start)
        for t in range(T):
            g = cpu[t]
            q = g + rng.normal(0, 3 * spec.compute_jitter_us, W)  # server posts its receive
            arrive = np.maximum(g, q) + xfer[t] + np.abs(rng.normal(0, spec.comm_jitter_us, W))
            agg = arrive.max() + 20.0
            h = agg + rng.normal(0, 3 * spec.compute_jitter_us, W)  # worker posts its receive
            send = agg + 5.0 * np.arange(W)
            back = np.maximum(send, h) + xfer[t] + np.abs(rng.normal(0, spec.comm_jitter_us, W))
            for w, n in enumerate(names):
                d, ds = skew[n], skew["server0"]
                ev = nodes[n].events
                ev.append(Event(f"bw{t}", si, float(g[w] - spec.compute_us + d), spec.compute_us))
                ev.append(Event(f"push{t}", si, float(g[w] + d), float(arrive[w] - g[w])))
                ev.append(Event(f"pull{t}", si, float(h[w] + d), float(back[w] - h[w])))
                srv.events.append(Event(f"push_res{t}.{w}", si, float(q[w] + ds), float(arrive[w] - q[w])))
                srv.events.append(Event(f"pull_req{t}.{w}", si, float(send[w] + ds), float(back[w] - send[w])))
            last = np.maximum(last, back)
        for w, n in enumerate(names):
            nodes[n].steps[si] = (start + skew[n], float(last[w] - start) + 50.0)
        srv.steps[si] = (start + skew["server0"], float(last.max() - start) + 50.0)
    infos = [NodeInfo(n, "worker", r, hosts[r], f"{n}.events.json.gz", f"{n}.dfg.json.gz") for r, n in enumerate(names)]
    infos.append(NodeInfo("server0", "server", 0, "ps-host", "server0.events.json.gz", "server0.dfg.json.gz"))
    for info in infos:
        (nodes.get(info.name) or srv).info = info
    nodes["server0"] = srv
    m = Manifest("pytorch", "ps", "synthetic", W, infos, steps, meta={"generator": "dpro.alignment.synthetic.ps_job"})
    return GTrace(m, nodes)
