"""What a capped server port really delivers to N ps-lite workers, without dpro (issue #28).

MXNet ``dist_sync`` / ``dist_async`` kvstores with N = 1, 2, 4 workers and 1 or 2 servers,
each process in its own network namespace behind a tbf cap on both directions of its link,
as benchmarks/whatif/ps.py runs the jobs (benchmarks/fidelity/ps_netns.py's placement,
benchmarks/jobenv.py's ``threads1pin``). The workers do no computation: they only push and
pull the keys of ``examples/mxnet/train_ps.py --model mlp`` (same shapes, same order and
priorities as gluon's Trainer: ``pushpull(i, grad, out=weight, priority=-i)``, the servers
running the same SGD with momentum), then ``waitall()``: one round. Each worker records the
wall clock of every round (one host: one clock).

Reported per case: the round (sync: the median over the rounds of the workers' mean; async: a
worker's mean round, from the rounds per second of all), the payload bytes a
round moves through the busiest server port per direction (MXNet's key placement), and

* ``port MB/s``: that port's payload rate, ``N * bytes / round`` (async: the workers' rounds
  per second, each moving its bytes);
* ``% cap``: that rate against the cap's payload rate (TCP over a 1500-byte MTU:
  1448/1514 of the line rate);
* ``wire in/out %``: the bytes the busiest server's veth really carried in each direction
  (``/sys/class/net/.../statistics``, headers included) over the window in which every
  worker was in its timed rounds, against the cap;
* the whole machine's CPU over that window (``/proc/stat``: user, system, softirq, idle,
  and ``nice``, which is the other sessions' niced work), in % of all cores.

Nothing here reads a trace or calls dpro. Root (namespaces, tc); run it alone
(``benchmarks/measure.sh``):

    benchmarks/measure.sh .venv-mx/bin/python benchmarks/whatif/ps_port_probe.py --cap-mbit 1000 \\
        [--workers 1,2,4] [--servers 1,2] [--kvstores dist_sync,dist_async] [--rounds 12] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
#: examples/mxnet/train_ps.py --model mlp's parameters, in gluon's order (weight, bias per layer)
MLP_SHAPES = [(1024, 784), (1024,), (1024, 1024), (1024,), (512, 1024), (512,), (10, 512), (10,)]
#: MXNet's default MXNET_KVSTORE_BIGARRAY_BOUND (elements): larger arrays are split over the servers
BOUND = 1_000_000
#: payload bytes per line byte (TCP, 1500-byte MTU, timestamps), as dpro.whatif.scaleout
TCP_PAYLOAD_SHARE = 1448 / 1514
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


# -- a worker ------------------------------------------------------------------------------
def worker_main(kvstore: str, warmup: int, rounds: int, out: Path) -> None:
    import mxnet as mx

    kv = mx.kv.create(kvstore)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.01, momentum=0.9))  # as gluon's Trainer on a dist kvstore
    weights = [mx.nd.ones(s) for s in MLP_SHAPES]
    grads = [mx.nd.ones(s) * 1e-3 for s in MLP_SHAPES]
    for i, w in enumerate(weights):
        kv.init(i, w)
    mx.nd.waitall()
    rows = []
    for r in range(warmup + rounds):
        t0 = time.time()
        for i in range(len(weights)):
            kv.pushpull(i, grads[i], out=weights[i], priority=-i)
        mx.nd.waitall()
        t1 = time.time()
        if r >= warmup:
            rows.append({"start_s": t0, "end_s": t1})
    out.with_name(out.name.format(rank=kv.rank)).write_text(json.dumps({"rank": kv.rank, "rows": rows}))


# -- the launcher --------------------------------------------------------------------------
def server_bytes(servers: int) -> list[int]:
    """Payload bytes one worker's round pushes into (and pulls out of) each server."""
    out = [0] * servers
    for key, shape in enumerate(MLP_SHAPES):
        n = 1
        for d in shape:
            n *= d
        if n >= BOUND and servers > 1:
            for s in range(servers):
                out[s] += 4 * n // servers
        else:
            out[(key * 9973) % servers] += 4 * n
    return out


def _stat() -> dict[str, int]:
    vals = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return dict(zip(STAT_FIELDS, vals))


class Sampler(threading.Thread):
    """Every 50 ms: the wall clock, /proc/stat's CPU line and the byte counters of the
    servers' bridge-side veths (tx: into the server, rx: out of it)."""

    def __init__(self, devs: list[str]) -> None:
        super().__init__(daemon=True)
        self.devs, self.samples, self.stop = devs, [], threading.Event()

    def read(self) -> dict:
        net = {}
        for d in self.devs:
            base = Path("/sys/class/net") / d / "statistics"
            try:
                net[d] = (int((base / "tx_bytes").read_text()), int((base / "rx_bytes").read_text()))
            except OSError:
                net[d] = (0, 0)
        return {"t": time.time(), "cpu": _stat(), "net": net}

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append(self.read())
            time.sleep(0.05)

    def between(self, t0: float, t1: float) -> tuple[dict, dict] | None:
        inside = [s for s in self.samples if t0 <= s["t"] <= t1]
        return (inside[0], inside[-1]) if len(inside) >= 2 else None


def run_case(kvstore: str, n: int, servers: int, cap: float | None, warmup: int, rounds: int, tmp: Path,
             timeout: float) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "benchmarks" / "fidelity"))
    import jobenv
    import netns
    from ps_netns import placer

    sys.path.insert(0, str(ROOT / "examples" / "mxnet"))
    from launch_local import launch

    s = jobenv.default_for("mx")
    os.environ.update({**s.env(), "DPRO_DISABLE": "1", "PYTHONPATH": str(ROOT)})
    outp = tmp / f"{kvstore}_{n}w{servers}s_{{rank}}.json"
    script = [*s.script(HERE), "--worker", kvstore, "--warmup", str(warmup), "--rounds", str(rounds),
              "--worker-out", str(outp)]
    sampler = Sampler([netns.host_veth(i) for i in range(servers)])
    with netns.NetnsCluster(n + servers, rate_mbit=cap):
        sampler.start()
        rc = launch(script, n, servers, timeout=timeout, root_uri=netns.BRIDGE_ADDR, place=placer(servers))
        sampler.stop.set()
        sampler.join()
    if rc:
        raise RuntimeError(f"{kvstore} {n}w{servers}s: a worker exited with {rc}")
    per = [json.loads(Path(str(outp).format(rank=r)).read_text())["rows"] for r in range(n)]
    rounds_us = [1e6 * (x["end_s"] - x["start_s"]) for rows in per for x in rows]
    # the window in which every worker is in its timed rounds
    t0, t1 = max(rows[0]["start_s"] for rows in per), min(rows[-1]["end_s"] for rows in per)
    if kvstore == "dist_sync":  # the workers move together: a round is the mean over them
        rnd = statistics.median(statistics.mean(v) for v in zip(*[[1e6 * (x["end_s"] - x["start_s"]) for x in rows]
                                                                  for rows in per]))
    else:  # every worker at its own pace: the mean round of a worker, from the rounds/s of all
        rate = sum(len(rows) / (rows[-1]["end_s"] - rows[0]["start_s"]) for rows in per)
        rnd = 1e6 * n / rate
    sb = server_bytes(servers)
    busiest = max(range(servers), key=lambda i: sb[i])
    cap_payload = cap * 1e6 / 8 * TCP_PAYLOAD_SHARE if cap else None
    port_rate = n * sb[busiest] / (rnd / 1e6)
    row = {"kvstore": kvstore, "workers": n, "servers": servers, "round_us": rnd,
           "round_min_us": min(rounds_us), "round_max_us": max(rounds_us), "rounds": len(rounds_us),
           "server_bytes": sb, "busiest_port_payload_Bps": port_rate,
           "busiest_port_pct_of_cap": 100 * port_rate / cap_payload if cap_payload else None,
           "window_s": t1 - t0}
    pair = sampler.between(t0, t1)
    if pair:
        a, b = pair
        dt = b["t"] - a["t"]
        # ps-lite numbers the servers in the order they register: the busiest by its bytes
        dev = max(sampler.devs, key=lambda v: b["net"][v][0] - a["net"][v][0])
        tx = (b["net"][dev][0] - a["net"][dev][0]) / dt  # bridge -> server: the pushes
        rx = (b["net"][dev][1] - a["net"][dev][1]) / dt  # server -> bridge: the pulls
        line = cap * 1e6 / 8 if cap else None
        row.update(wire_in_Bps=tx, wire_out_Bps=rx,
                   wire_in_pct=100 * tx / line if line else None, wire_out_pct=100 * rx / line if line else None)
        ticks = {k: b["cpu"][k] - a["cpu"][k] for k in STAT_FIELDS}
        tot = sum(ticks.values()) or 1
        row["cpu_pct"] = {k: 100 * v / tot for k, v in ticks.items()}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cap-mbit", type=float, default=1000.0, help="tbf cap per direction of every link (0: none)")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--servers", default="1,2")
    ap.add_argument("--kvstores", default="dist_sync,dist_async")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--timeout", type=float, default=120.0, help="per case, s")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, default=None, help=argparse.SUPPRESS)
    o = ap.parse_args()
    if o.worker:
        worker_main(o.worker, o.warmup, o.rounds, o.worker_out)
        return
    sys.path.insert(0, str(HERE.parent))
    from boost import boosted

    cap = o.cap_mbit or None
    res = []
    with tempfile.TemporaryDirectory(prefix="dpro-psprobe-") as tmp, boosted() as on:
        print(f"# jobs boosted: {'yes' if on else 'no'}; cap {cap or 'none'} Mbit/s; mlp keys, no compute; "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
        print(f"{'case':16} {'round ms':>9} {'min':>7} {'max':>7} {'port MB':>8} {'port MB/s':>9} {'% cap':>6} "
              f"{'wire in%':>8} {'out%':>5} {'user%':>6} {'sys%':>5} {'sirq%':>6} {'idle%':>6} {'nice%':>6}", flush=True)
        for kv in o.kvstores.split(","):
            for srv in [int(x) for x in o.servers.split(",")]:
                for n in [int(x) for x in o.workers.split(",")]:
                    r = run_case(kv, n, srv, cap, o.warmup, o.rounds, Path(tmp), o.timeout)
                    res.append(r)
                    c = r.get("cpu_pct") or {}

                    def f(x: float | None, w: int) -> str:
                        return f"{x:{w}.1f}" if x is not None else " " * (w - 3) + "n/a"
                    print(f"{kv + ' ' + str(n) + 'w' + str(srv) + 's':16} {r['round_us'] / 1e3:9.1f} "
                          f"{r['round_min_us'] / 1e3:7.1f} {r['round_max_us'] / 1e3:7.1f} "
                          f"{max(r['server_bytes']) / 1e6:8.2f} {r['busiest_port_payload_Bps'] / 1e6:9.1f} "
                          f"{f(r['busiest_port_pct_of_cap'], 6)} {f(r.get('wire_in_pct'), 8)} "
                          f"{f(r.get('wire_out_pct'), 5)} {f(c.get('user'), 6)} {f(c.get('system'), 5)} "
                          f"{f(c.get('softirq'), 6)} {f(c.get('idle'), 6)} {f(c.get('nice'), 6)}", flush=True)
                    if o.json:  # what is done so far survives an interrupted run
                        o.json.write_text(json.dumps({"cap_mbit": cap, "results": res}, indent=1))


if __name__ == "__main__":
    main()
