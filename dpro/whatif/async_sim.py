"""Discrete-event simulation of asynchronous SGD on parameter servers (``dist_async``).

Each worker repeats: compute (a sample of the profiled compute times) -> push its gradients
to the servers -> each server updates what it received -> the worker pulls the weights back
-> next step; no barrier. Every resource is shared fluidly by what uses it at the moment:
each server's port and each worker's link, one per direction at ``1/beta`` bytes/µs,
max-min fair among the flows moving (:func:`~dpro.whatif.fairshare.max_min_rates`, solved
again whenever a flow starts or ends), and, with ``cores``, the host's cores among the
computing workers.

A worker's messages to one server go **one at a time, in the order it sends them**, on its
connection to that server (ps-lite's one connection, as the one-worker profile shows: the
mlp's 3.2 MB push alone ends after its own bytes, 27 ms, and the next ones after theirs);
each message is updated by the server when it has arrived (serial per server), then its pull
joins the server's connection back to the worker, again one at a time in arrival order. A
worker's own pushes and pulls therefore overlap (the pull of its first key while it still
pushes the next), and two workers keep both directions of a port busy: the pipeline MXNet
runs key by key. With one message per server (``messages=None``) a worker pushes all of a
server's bytes, the server updates, then it pulls them all (the earlier, unpipelined model).
"""

from __future__ import annotations

import heapq
import random
from collections import Counter, deque
from collections.abc import Callable, Sequence

from dpro.whatif.fairshare import max_min_rates
from dpro.whatif.models import Transfer


def cpu_rates(computing: dict[int, float], cores: float | None, pinned: bool) -> dict[int, float]:
    """Each computing worker's share of a core: processor sharing of ``cores`` among them,
    or, ``pinned``, of its own core ``w % cores`` among the workers computing on it."""
    if not cores or not computing:
        return dict.fromkeys(computing, 1.0)
    if not pinned:
        return dict.fromkeys(computing, min(1.0, cores / len(computing)))
    c = max(1, int(cores))
    on = Counter(w % c for w in computing)
    return {w: 1.0 / on[w % c] for w in computing}


def simulate_async(workers: int, compute_us: list[float], server_bytes: list[float], server_msgs: list[int],
                   t: Transfer, update_alpha: float, update_beta: float, steps: int, seed: int = 0, *,
                   cores: float | None = None, pinned: bool = False,
                   messages: Sequence[Sequence[float]] | None = None,
                   observe: Callable[[dict[tuple[int, int, int], float], float], None] | None = None) -> float:
    """Throughput (steps/s over all workers) of asynchronous SGD over ``steps`` steps in all.

    A worker step sends, to each server ``s``, ``messages[s]`` (bytes of each message, in
    sending order; ``None``: one message of ``server_bytes[s]`` standing for
    ``server_msgs[s]`` messages). A message costs its bytes plus ``alpha/beta`` bytes of
    overhead per message it stands for on the flow, and an update of ``update_alpha`` per
    message plus ``update_beta`` per byte on its server (serial per server). A push
    crosses its worker's link (out) and its server's port (in), a pull the port (out) and
    the link (in). With ``cores``, the workers computing at the moment share that many
    cores: each computes at ``min(1, cores / computing)`` (the profiled compute time is CPU
    time); ``pinned`` (worker ``w`` bound to core ``w % cores``), at ``1 / computing on its
    core``: a worker waiting on the network lends its core only to the workers pinned to
    the same one. ``observe(rates, dt)``, if given, sees every interval: the rate (bytes/µs)
    of each flow ``(server, direction 0 push / 1 pull, worker)`` moving during its ``dt`` µs."""
    rng = random.Random(seed)
    bw = 1.0 / t.beta if t.beta > 0 else 1e30
    ns = len(server_bytes)
    # per server: (payload bytes, messages it stands for) of each message, in sending order
    if messages is None:
        plan = [[(float(server_bytes[s]), server_msgs[s])] if server_bytes[s] > 0 else [] for s in range(ns)]
    else:
        plan = [[(float(b), 1) for b in messages[s]] for s in range(len(messages))]
        ns = len(plan)
    wire = [[b + n * t.alpha * bw for b, n in p] for p in plan]
    upd = [[update_alpha * n + update_beta * b for b, n in p] for p in plan]
    active = [s for s in range(ns) if plan[s]]
    per_step = sum(len(plan[s]) for s in active)
    caps = {(kind, i, d): bw for kind, n in (("port", ns), ("link", workers)) for i in range(n) for d in (0, 1)}
    now = 0.0
    timers: list[tuple[float, int, int, int, int]] = []  # (time, seq, worker, server, message): updated
    seq = 0
    computing = {w: rng.choice(compute_us) for w in range(workers)}  # worker -> CPU µs left
    # (server, direction 0 in / 1 out, worker) -> [bytes left, message]: one flow per connection
    flows: dict[tuple[int, int, int], list] = {}
    next_push = {}  # (worker, server) -> the next message to push
    pulls: dict[tuple[int, int], deque[int]] = {}  # (worker, server) -> updated messages waiting to be pulled
    left = [0] * workers  # messages a worker still waits for
    upd_free = [0.0] * ns
    done = 0

    def finish_step(w: int) -> None:
        nonlocal done
        done += 1
        computing[w] = rng.choice(compute_us)

    def push(w: int, s: int) -> None:
        i = next_push[(w, s)]
        if i < len(plan[s]):
            next_push[(w, s)] = i + 1
            flows[(s, 0, w)] = [wire[s][i], i]

    def pull(w: int, s: int) -> None:
        q = pulls[(w, s)]
        if q and (s, 1, w) not in flows:
            i = q.popleft()
            flows[(s, 1, w)] = [wire[s][i], i]

    while done < steps:
        # a flow (server, direction, worker) crosses the server's port and the worker's link
        ids = list(flows)
        rate = dict(zip(ids, max_min_rates([(("port", f[0], f[1]), ("link", f[2], f[1])) for f in ids], caps)))
        cpu = cpu_rates(computing, cores, pinned)
        dt = min([v[0] / rate[f] for f, v in flows.items()] + [c / cpu[w] for w, c in computing.items()]
                 + ([timers[0][0] - now] if timers else []), default=float("inf"))
        if dt == float("inf"):
            break
        dt = max(0.0, dt)
        now += dt
        if observe is not None:
            observe(rate, dt)
        ended = []
        for f, v in flows.items():
            v[0] -= rate[f] * dt
            if v[0] <= 1e-9 * max(1.0, wire[f[0]][v[1]]):
                ended.append(f)
        finished = []
        for w in computing:
            computing[w] -= cpu[w] * dt
            if computing[w] <= 1e-9:
                finished.append(w)
        for f in ended:
            srv, direction, w = f
            i = flows.pop(f)[1]
            if direction == 0:  # arrived: the server updates it, the connection sends the next one
                start = max(now, upd_free[srv])
                upd_free[srv] = start + upd[srv][i]
                heapq.heappush(timers, (upd_free[srv], seq, w, srv, i))
                seq += 1
                push(w, srv)
            else:
                left[w] -= 1
                if left[w] == 0:
                    finish_step(w)
                else:
                    pull(w, srv)
        for w in finished:
            del computing[w]
            if not active:
                finish_step(w)
                continue
            left[w] = per_step
            for s in active:
                next_push[(w, s)] = 0
                pulls[(w, s)] = deque()
                push(w, s)
        while timers and timers[0][0] <= now + 1e-9:
            _, _, w, srv, i = heapq.heappop(timers)
            pulls[(w, srv)].append(i)
            pull(w, srv)
    return done * 1e6 / now if now > 0 else 0.0
