"""Write constructed BytePS traces in BytePS 0.2.5's own formats (see docs/byteps.md).

The BytePS worker needs CUDA, so real traces cannot be recorded on a CPU-only machine;
this writes what a job would write, from a simple timing model, so that the importer can
be tested end to end:

* ``<out>/worker<m>/<local_rank>/comm.json`` — as BytePSGlobal::EmitTrace/OutputTraces
  write it (pretty-printed, integer µs since the epoch, ``tid`` "total" or the key);
* ``<out>/worker<m>/<local_rank>/byteps.log`` — the DEBUG lines giving partition sizes;
* ``<out>/server<i>/server_profile.json`` — as ps-lite's server profiling writes it
  (``push-<sender>``/``pull-<sender>`` B/E pairs, pid = tid = the server-side key), left
  unterminated as a running server leaves it.

Timing model, per partition and step: every GPU of a machine enqueues the tensor when its
gradient is ready; REDUCE (one per machine, serial) once all have; COPYD2H per GPU (its
slice, serial); the root's PUSH crosses the network (latency + bytes/bandwidth, one
partition never waits for another), the server sums it (serially per key) and acks;
the root's PULL request waits at the server until every worker's push of the key is
summed, then the answer crosses the network; COPYH2D per GPU, BROADCAST per machine.
``truth.json`` holds the mean communication span of a step (the iteration the importer's
step markers measure) and the profiled steps.

Usage: python make_traces.py OUT [--machines 2] [--gpus 2] [--servers 2] [--steps 4]
       [--start-step 3] [--skew-us 0] [--seed 0] [--no-server]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

STAGES_PUSH_ROOT = ("REDUCE", "COPYD2H", "PUSH")
K_MAX = 2**64 - 1
T0 = 1_700_000_000_000_000  # µs since the epoch


def _ev(tensor: str, stage: str | None, tid: str, ts: float, dur: float) -> str:
    pid = f"Comm.{tensor}"
    name = pid if stage is None else f"{pid}.{stage}"
    return json.dumps({"ph": "X", "args": {"name": pid}, "pid": pid, "name": name,
                       "ts": int(round(ts)), "dur": int(round(dur)), "tid": tid, "cat": "Comm"}, indent=4)


def generate(out: Path, machines: int = 2, gpus: int = 2, servers: int = 2, steps: int = 4, start_step: int = 3,
             skew_us: float = 0.0, seed: int = 0, with_server: bool = True) -> dict:
    rng = random.Random(seed)
    bound = 4096000  # BYTEPS_PARTITION_BYTES default, already a multiple of gpus * 4096 here
    sizes = [9_437_184, 2_359_296, 4_718_592, 589_824, 1_048_576, 16_384]  # gradient bytes, last layer first
    tensors = [f"Gradient.layer{len(sizes) - i}.weight" for i in range(len(sizes))]
    parts = {t: [bound] * (-(-b // bound) - 1) + [b - bound * (-(-b // bound) - 1)] for t, b in zip(tensors, sizes)}
    keys = {t: [(ti << 16) + p for p in range(len(parts[t]))] for ti, t in enumerate(tensors)}
    net_bw, nv_bw, pcie_bw, sum_bw = 1250.0, 20000.0, 10000.0, 8000.0  # bytes/µs
    lat, coord = 25.0, 4.0
    root = gpus - 1  # BytePS's default root: the largest local rank
    skew = {f"worker{m}": rng.uniform(-skew_us, skew_us) for m in range(machines)}
    skew.update({f"server{s}": rng.uniform(-skew_us, skew_us) for s in range(servers)})
    total_syncs = start_step + steps + 1  # the server profiles every sync; the workers steps start..end
    comm: dict[tuple[int, int], list[str]] = {(m, g): [] for m in range(machines) for g in range(gpus)}
    srv: dict[int, list[tuple[float, str]]] = {s: [] for s in range(servers)}
    spans: list[float] = []
    t_step = float(T0)
    for sync in range(1, total_syncs + 1):
        profiled = start_step <= sync < start_step + steps
        ready = {(m, g): t_step + rng.uniform(0, 300) for m in range(machines) for g in range(gpus)}
        reduce_free = {m: 0.0 for m in range(machines)}
        copy_free = {(m, g): 0.0 for m in range(machines) for g in range(gpus)}
        bcast_free = {m: 0.0 for m in range(machines)}
        h2d_free = dict(copy_free)
        key_free: dict[int, float] = {}
        events: list[tuple[int, int, str, str | None, str, float, float]] = []
        first, last = {}, {}
        pull_done: list[tuple[float, int, str, int, int]] = []
        for ti, t in enumerate(tensors):
            grad = {mg: ready[mg] + 900.0 * ti * (1 + 0.05 * rng.random()) for mg in ready}
            for p, key in enumerate(keys[t]):
                nb = parts[t][p]
                s_idx = (ti + p) % servers
                skey = (K_MAX // servers) * s_idx + key
                push_end, pull_req, push_sum = {}, {}, []
                after_d2h: dict[int, float] = {}
                for m in range(machines):
                    red_s = max(max(grad[(m, g)] for g in range(gpus)), reduce_free[m])
                    red_e = red_s + 10 + nb / nv_bw
                    reduce_free[m] = red_e
                    d2h_end = []
                    for g in range(gpus):
                        if g != root:
                            events.append((m, g, t, "COORDINATE_REDUCE", str(key), grad[(m, g)], coord))
                        events.append((m, g, t, "REDUCE", str(key), red_s + rng.uniform(0, 3), red_e - red_s))
                        c_s = max(red_e, copy_free[(m, g)])
                        c_e = c_s + 5 + nb / gpus / pcie_bw
                        copy_free[(m, g)] = c_e
                        events.append((m, g, t, "COPYD2H", str(key), c_s, c_e - c_s))
                        if g != root:
                            events.append((m, g, t, "COORDINATE_PUSH", str(key), c_e, coord))
                        d2h_end.append(c_e + (coord if g != root else 0))
                    after_d2h[m] = max(d2h_end)
                for m in range(machines):
                    arrive = after_d2h[m] + lat + nb / net_bw * (1 + 0.1 * rng.random())
                    push_sum.append((arrive, m))
                handled = {}
                for arrive, m in sorted(push_sum):
                    start = max(arrive, key_free.get(key, 0.0))
                    handled[m] = (arrive, start + 8 + nb / sum_bw)
                    key_free[key] = handled[m][1]
                all_summed = max(e for _, e in handled.values())
                for m in range(machines):
                    push_end[m] = handled[m][1] + lat
                    events.append((m, root, t, "PUSH", str(key), after_d2h[m], push_end[m] - after_d2h[m]))
                    pull_req[m] = push_end[m] + lat
                    answered = max(pull_req[m], all_summed) + 6
                    pull_end = answered + lat + nb / net_bw * (1 + 0.1 * rng.random())
                    events.append((m, root, t, "PULL", str(key), push_end[m], pull_end - push_end[m]))
                    sender = 9 + 2 * m
                    ds = skew[f"server{s_idx}"]
                    srv[s_idx] += [(handled[m][0] + ds, json.dumps({"name": f"push-{sender}", "ph": "B", "pid": skey, "tid": skey, "ts": int(handled[m][0] + ds)})),
                                   (handled[m][1] + ds, json.dumps({"name": f"push-{sender}", "ph": "E", "pid": skey, "tid": skey, "ts": int(handled[m][1] + ds)})),
                                   (pull_req[m] + ds, json.dumps({"name": f"pull-{sender}", "ph": "B", "pid": skey, "tid": skey, "ts": int(pull_req[m] + ds)})),
                                   (answered + ds, json.dumps({"name": f"pull-{sender}", "ph": "E", "pid": skey, "tid": skey, "ts": int(answered + ds)}))]
                    pull_done.append((pull_end, m, t, key, nb))
            for mg in ready:
                first[mg + (t,)] = grad[mg]
        for pull_end, m, t, key, nb in sorted(pull_done):  # the pull side runs in the order pulls finish
            for g in range(gpus):
                h_s = max(pull_end + (coord if g != root else 0), h2d_free[(m, g)])
                h_e = h_s + 5 + nb / gpus / pcie_bw
                h2d_free[(m, g)] = h_e
                events.append((m, g, t, "COPYH2D", str(key), h_s, h_e - h_s))
                if g != root:
                    events.append((m, g, t, "COORDINATE_BROADCAST", str(key), h_e, coord))
            b_s = max(max(h2d_free[(m, g)] for g in range(gpus)) + coord, bcast_free[m])
            b_e = b_s + 10 + nb / nv_bw
            bcast_free[m] = b_e
            for g in range(gpus):
                events.append((m, g, t, "BROADCAST", str(key), b_s + rng.uniform(0, 3), b_e - b_s))
                last[(m, g, t)] = max(last.get((m, g, t), 0.0), b_e)
        if profiled:
            for m, g, t, stage, tid, ts, dur in events:
                comm[(m, g)].append(_ev(t, stage, tid, ts + skew[f"worker{m}"], dur))
            for (m, g, t), end in last.items():
                s0 = first[(m, g, t)]
                comm[(m, g)].append(_ev(t, None, "total", s0 + skew[f"worker{m}"], end - s0))
            for m in range(machines):
                for g in range(gpus):
                    evs = [(ts, ts + d) for mm, gg, *_rest, ts, d in events if (mm, gg) == (m, g)]
                    evs += [(first[(m, g, t)], last[(m, g, t)]) for t in tensors]
                    spans.append(max(e for _, e in evs) - min(s for s, _ in evs))
        t_step = max(last.values()) + 20_000.0  # forward of the next step
    for (m, g), evs in comm.items():
        d = out / f"worker{m}" / str(g)
        d.mkdir(parents=True, exist_ok=True)
        (d / "comm.json").write_text("{\n    \"traceEvents\": [\n" + ",\n".join(evs) + "\n\n    ],\n    \"displayTimeUnit\": \"ms\"\n}\n")
        lines = [f"[2026-11-22 08:00:00.000001: DEBUG byteps/common/global.cc:143] Partition size round up to {bound} (bytes)"]
        lines += [f"[2026-11-22 08:00:00.000002: DEBUG byteps/common/operations.cc:312] {t} partitioned to {len(parts[t])} part(s), "
                  f"total_len={b}, key_range=[{keys[t][0]}, {keys[t][-1]}] rank={g}" for t, b in zip(tensors, sizes)]
        (d / "byteps.log").write_text("\n".join(lines) + "\n")
    if with_server:
        for s, evs in srv.items():
            d = out / f"server{s}"
            d.mkdir(parents=True, exist_ok=True)
            body = ",\n".join("\t\t" + line for _, line in sorted(evs, key=lambda x: x[0]))
            (d / "server_profile.json").write_text("{\n\t\"traceEvents\": [\n" + body)  # still running: unterminated
    truth = {"comm_span_us": sum(spans) / len(spans), "steps": list(range(start_step, start_step + steps)),
             "machines": machines, "gpus": gpus, "servers": servers, "partitions": sum(len(k) for k in keys.values()),
             "partition_bytes": {str(k): parts[t][i] for t in tensors for i, k in enumerate(keys[t])}}
    (out / "truth.json").write_text(json.dumps(truth, indent=1))
    return truth


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--machines", type=int, default=2)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--start-step", type=int, default=3)
    ap.add_argument("--skew-us", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-server", action="store_true")
    a = ap.parse_args()
    generate(a.out, a.machines, a.gpus, a.servers, a.steps, a.start_step, a.skew_us, a.seed, not a.no_server)


if __name__ == "__main__":
    main()
