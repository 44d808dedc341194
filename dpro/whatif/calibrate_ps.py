"""``dpro calibrate --backend ps-lite``: the CPU cost of MXNet's parameter server (ps-lite).

A real ``dist_sync`` kvstore on this machine: a scheduler, one server and one worker (each
its own process, started with the given MXNet Python; MXNet is imported only in those
processes, never by dpro itself). For each size from 4 KiB to 16 MiB the worker pushes a
float32 array to the server and pulls it back, a few warm-up rounds, then enough timed
rounds to move about 256 MiB (at least ``repeats``), and records per round:

* the wall time (the link cost of the loopback connection, alpha/beta of one message);
* the worker's CPU time (its process, all threads, user + system: MXNet's front end and
  engine, ps-lite's and ZMQ's copies, the kernel's socket work done in its context);
* the server's CPU time (the sum over its threads, ``/proc/PID/task/*/schedstat``):
  receiving, merging (a copy with one worker) and storing the pushed array, sending it back.

One round is two messages (a push and a pull) of ``B`` bytes each way; ``cpu = 2 * (alpha
+ beta * B)`` is fitted by least absolute deviations with alpha, beta >= 0, for the worker
and the server apart (``worker_cpu_*``, ``server_cpu_*``): the CPU a push or a pull of
``B`` bytes takes from the cores the job shares (``dpro whatif --host-cores``). The
server's optimizer update is not in it: the what-if has it from the profile's UPDATE ops.

The **ports** (:func:`measure_port`, :func:`port_efficiency`; optional, e.g. in capped
network namespaces, ``benchmarks/whatif/ps.py --cap-mbit``): N ``dist_async`` workers and S
servers, each worker pushing and pulling a fixed key set (``PORT_SIZES``, or the profile's,
placed by MXNet's rule) round after round, in the job's conditions where they are given: each
round after the job's computation (spent as CPU), the workers pinned as the job's, the servers
running the job's SGD momentum. The busiest server port's time per worker round at the link
cost ``t`` (``alpha * messages + beta * bytes``), N such rounds at a time, over the mean
round of a worker (the rounds per second of all, while all were in their timed rounds; the
median of ``PORT_TRIES`` tries, fresh processes each), is the port's **efficiency** with N
senders: 1.0 when the port moves bytes at the rate one connection gets, less when several
senders into one port get less of it (TCP over a tbf queue, ps-lite's threads waiting, the
server's updates). ``dpro whatif --async`` divides the busiest port's bound by it
(:func:`dpro.whatif.scaleout.async_port_bound`).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dpro.graph.comm_model import lad_link_cost
from dpro.ports import free_port
from dpro.whatif.calibrate import process_cpu_us
from dpro.whatif.platform import FORMAT

DEFAULT_SIZES = [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
#: bytes each size's timed rounds move (at least ``repeats`` rounds, at most 400)
TARGET_BYTES = 256 << 20
ENV_SERVER_PID = "DPRO_CALIBRATE_SERVER_PID"



def proc_cpu_us(pid: int) -> float:
    """CPU time so far of process ``pid``'s live threads (``schedstat``: ns, not ticks), µs."""
    total = 0
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((t / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total / 1e3


def rounds_for(nbytes: int, repeats: int, target: int = TARGET_BYTES) -> int:
    """Timed rounds of a size: about ``target`` bytes, at least ``repeats``, at most 400."""
    return max(repeats, min(400, target // max(1, nbytes)))


def _worker_main(out: str, sizes: list[int], repeats: int, target: int = TARGET_BYTES) -> None:
    """Runs in the worker process (DMLC_ROLE=worker): push/pull each size, write the rows."""
    import mxnet as mx

    server = int(os.environ[ENV_SERVER_PID])
    kv = mx.kv.create("dist_sync")
    rows = []
    for key, nbytes in enumerate(sizes):
        n = max(1, nbytes // 4)
        a, b = mx.nd.ones(n), mx.nd.zeros(n)
        kv.init(key, a)
        for _ in range(3):
            kv.push(key, a)
            kv.pull(key, out=b)
            b.wait_to_read()
        k = rounds_for(nbytes, repeats, target)
        w0, s0, t0 = process_cpu_us(), proc_cpu_us(server), time.perf_counter()
        walls = []
        for _ in range(k):
            t = time.perf_counter()
            kv.push(key, a)
            kv.pull(key, out=b)
            b.wait_to_read()
            walls.append((time.perf_counter() - t) * 1e6)
        wall = (time.perf_counter() - t0) * 1e6
        rows.append({"bytes": n * 4, "rounds": k, "us": statistics.median(walls), "mean_us": wall / k,
                     "worker_cpu_us": (process_cpu_us() - w0) / k, "server_cpu_us": (proc_cpu_us(server) - s0) / k})
    Path(out).write_text(json.dumps(rows))


#: where a process runs: role -> (command prefix, extra environment), e.g. a network namespace
#: (``ip netns exec NS``, which keeps the process id: the worker reads the server's CPU by it)
Place = Callable[[str], tuple[list[str], dict[str, str]]]


def loopback(role: str) -> tuple[list[str], dict[str, str]]:
    return [], {"DMLC_NODE_HOST": "127.0.0.1"}


def _start(python: str, role: str, env: dict[str, str], argv: list[str], place: Place) -> subprocess.Popen:
    """One process of the job; only the worker's stderr is kept (read when it ends)."""
    prefix, extra = place(role)
    try:
        return subprocess.Popen([*prefix, python, *argv], env={**env, **extra, "DMLC_ROLE": role},
                                stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE if role == "worker" else subprocess.DEVNULL)
    except OSError as e:
        raise RuntimeError(f"ps-lite calibration: cannot start {python}: {e.strerror}") from None


def measure(python: str = sys.executable, sizes: list[int] | None = None, repeats: int = 20,
            timeout: float = 300.0, target: int = TARGET_BYTES, *, place: Place = loopback,
            root_uri: str = "127.0.0.1", env: dict[str, str] | None = None) -> list[dict]:
    """Run the scheduler, server and worker with ``python`` (which must have MXNet), return the
    rows (``target``: bytes each size's rounds move, :func:`rounds_for`; ``place``/``root_uri``:
    where the processes run and the scheduler's address, loopback by default; ``env``: the
    processes' environment, default this one's)."""
    sizes = sizes or DEFAULT_SIZES
    env = {**(os.environ if env is None else env), "DMLC_PS_ROOT_URI": root_uri, "DMLC_PS_ROOT_PORT": str(free_port()),
           "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1", "PS_VERBOSE": "0"}
    node = ["-c", "import mxnet"]  # MXNet runs its server / scheduler loop on import, by DMLC_ROLE
    procs = []
    with tempfile.TemporaryDirectory(prefix="dpro-calibrate-ps-") as tmp:
        out = os.path.join(tmp, "rows.json")
        try:
            procs.append(_start(python, "scheduler", env, node, place))
            server = _start(python, "server", env, node, place)
            procs.append(server)
            worker = _start(python, "worker", {**env, ENV_SERVER_PID: str(server.pid)},
                            ["-c", "import sys; from dpro.whatif.calibrate_ps import _worker_main; "
                                   "_worker_main(sys.argv[1], [int(x) for x in sys.argv[2].split(',')], "
                                   "int(sys.argv[3]), int(sys.argv[4]))", out, ",".join(map(str, sizes)), str(repeats),
                             str(target)], place)
            procs.append(worker)
            try:
                _, err = worker.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"ps-lite calibration: the worker did not finish in {timeout:.0f} s") from None
            if worker.returncode or not os.path.exists(out):
                last = (err or b"").decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
                raise RuntimeError(f"ps-lite calibration: the worker failed (exit {worker.returncode}): {last[0]}")
            for p in procs[:2]:  # they end once the worker has left
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    pass
            return json.loads(Path(out).read_text())
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()


def fit(rows: list[dict]) -> dict:
    """The platform file's ``ps`` entry from the rows: per message (a push or a pull of
    ``bytes``), wall and CPU of each side, ``t = alpha + beta * bytes``."""
    A = np.array([[2.0, 2.0 * r["bytes"]] for r in rows])
    out: dict[str, object] = {}
    wall = lad_link_cost(A, np.array([r["us"] for r in rows], dtype=float))
    out.update(alpha_us=wall.alpha, beta_us_per_byte=wall.beta, fit_error=wall.fit_error)
    for side in ("worker", "server"):
        c = lad_link_cost(A, np.array([r[f"{side}_cpu_us"] for r in rows], dtype=float))
        out.update({f"{side}_cpu_alpha_us": c.alpha, f"{side}_cpu_beta_us_per_byte": c.beta,
                    f"{side}_cpu_fit_error": c.fit_error})
    out["model"] = ("per message (a push or a pull of B bytes, loopback): t = alpha + beta * B; "
                    "CPU of the worker and of the server alike")
    return out


#: the key set of the port measurement (bytes, float32): a mix of large and small messages,
#: not any model's
PORT_SIZES = [4 << 20, 4 << 10, 2 << 20, 64 << 10, 1 << 20, 256 << 10, 4 << 20, 16 << 10]


def server_load(sizes: list[int], servers: int, bound: int = 1_000_000) -> tuple[list[int], list[int]]:
    """Bytes and messages per server of one worker's push (or pull) of keys ``0..`` of
    ``sizes`` bytes: MXNet's placement (a key of at least ``bound`` elements split evenly
    over all servers, else on server ``(key * 9973) % servers``)."""
    from dpro.optimizer.ps.layout import mxnet_home

    nbytes, msgs = [0] * servers, [0] * servers
    for key, b in enumerate(sizes):
        if b // 4 >= bound and servers > 1:
            for s in range(servers):
                nbytes[s] += b // servers
                msgs[s] += 1
        else:
            nbytes[mxnet_home(key, servers)] += b
            msgs[mxnet_home(key, servers)] += 1
    return nbytes, msgs


def spin_cpu(us: float) -> None:
    """Spend ``us`` of this thread's CPU time (a computation's demand: preempted, it takes longer)."""
    end = time.thread_time() + us / 1e6
    while time.thread_time() < end:
        pass


def _port_worker_main(out: str, sizes: list[int], warmup: int, rounds: int, compute_us: float = 0.0,
                      core: int = -1, momentum: float = 0.0) -> None:
    """Runs in each worker process of :func:`measure_port`: ``compute_us`` of CPU (the job's
    computation, none by default), then push and pull every key, round after round; pinned to
    ``core`` (an index into this process's cores, modulo their number; -1: not pinned), as the
    jobs' workers are; write the timed rounds' start and each one's end (one host, one clock)."""
    if core >= 0:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[core % len(cores)]})  # before MXNet starts its threads
    import mxnet as mx

    kv = mx.kv.create("dist_async")
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.01, momentum=momentum))  # the servers apply every push
    grads = [mx.nd.ones(max(1, b // 4)) * 1e-3 for b in sizes]
    weights = [mx.nd.ones(max(1, b // 4)) for b in sizes]
    for key, w in enumerate(weights):
        kv.init(key, w)
    mx.nd.waitall()
    t0, ends = 0.0, []
    for r in range(warmup + rounds):
        if r == warmup:
            t0 = time.time()
        if compute_us > 0:
            spin_cpu(compute_us)
        for key in range(len(sizes)):
            kv.pushpull(key, grads[key], out=weights[key], priority=-key)
        mx.nd.waitall()
        if r >= warmup:
            ends.append(time.time())
    Path(out.format(rank=kv.rank)).write_text(json.dumps({"start_s": t0, "end_s": ends[-1], "rounds": rounds,
                                                          "ends_s": ends}))


def rounds_done(start_s: float, ends_s: list[float], t: float) -> float:
    """A worker's timed rounds done by time ``t``, linear within a round (0 before ``start_s``)."""
    if t <= start_s:
        return 0.0
    prev = start_s
    for k, e in enumerate(ends_s):
        if t <= e:
            return k + (t - prev) / (e - prev) if e > prev else float(k + 1)
        prev = e
    return float(len(ends_s))


def common_window_rate(spans: list[dict]) -> tuple[float, float]:
    """The workers' rounds per second (all together) while every one of them was in its timed
    rounds (from the latest start to the earliest end), and that window (s). A worker that
    ends early leaves the others fewer senders: their rounds after it are not counted.
    Without per-round ends, or with no common window: each worker's own rate over its own span."""
    if all(s.get("ends_s") for s in spans):
        a, b = max(s["start_s"] for s in spans), min(s["ends_s"][-1] for s in spans)
        if b > a:
            return sum(rounds_done(s["start_s"], s["ends_s"], b) - rounds_done(s["start_s"], s["ends_s"], a)
                       for s in spans) / (b - a), b - a
    return sum(s["rounds"] / (s["end_s"] - s["start_s"]) for s in spans), 0.0


#: where process ``i`` of a role runs (the port measurement starts several workers)
PlaceIndexed = Callable[[str, int], tuple[list[str], dict[str, str]]]


#: independent tries of the port measurement (fresh processes each); their median is kept
PORT_TRIES = 5


def measure_port(python: str, workers: int, servers: int, *, tries: int = PORT_TRIES, **kw: object) -> dict:
    """:func:`measure_port_once` ``tries`` times (fresh processes each), the row of the try
    with the median round (``tries_round_us``: every try's). One try of 24 rounds (8-9 s at 4
    workers behind a 1000 Mbit/s cap) catches the port in one of two regimes, the workers'
    messages queued one behind the other (the port full) or interleaved (a fifth of it idle),
    and moves by +-8 % from try to try; the median of 5 is steadier."""
    rows = [measure_port_once(python, workers, servers, **kw) for _ in range(max(1, tries))]  # type: ignore[arg-type]
    order = sorted(range(len(rows)), key=lambda i: rows[i]["round_us"])
    mid = rows[order[(len(rows) - 1) // 2]]  # the lower median: a try that was measured
    return {**mid, "tries": len(rows), "tries_round_us": [r["round_us"] for r in rows],
            "tries_spans_s": [r["spans_s"] for r in rows]}


def measure_port_once(python: str, workers: int, servers: int, *, place: PlaceIndexed = lambda r, i: loopback(r),
                      root_uri: str = "127.0.0.1", env: dict[str, str] | None = None, sizes: list[int] | None = None,
                      warmup: int = 3, rounds: int = 24, timeout: float = 180.0, compute_us: float = 0.0,
                      pin: bool = False, momentum: float = 0.0) -> dict:
    """``workers`` asynchronous workers and ``servers`` servers push and pull ``sizes``
    (default ``PORT_SIZES``) round after round, each round after ``compute_us`` of CPU (the
    job's computation), the servers running SGD with ``momentum`` (the job's optimizer), worker
    ``i`` bound to core ``i % cores`` with ``pin`` (as the jobs'); the mean round of a worker
    (µs, from the rounds per second of all while all were in their timed rounds,
    :func:`common_window_rate`) and each server's bytes and messages per worker round."""
    sizes = sizes or PORT_SIZES
    env = {**(os.environ if env is None else env), "DMLC_PS_ROOT_URI": root_uri, "DMLC_PS_ROOT_PORT": str(free_port()),
           "DMLC_NUM_SERVER": str(servers), "DMLC_NUM_WORKER": str(workers), "PS_VERBOSE": "0"}
    node = ["-c", "import mxnet"]
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="dpro-calibrate-port-") as tmp:
        out = os.path.join(tmp, "port_{rank}.json")
        try:
            procs.append(_start(python, "scheduler", env, node, lambda r: place(r, 0)))
            for i in range(servers):
                procs.append(_start(python, "server", env, node, lambda r, i=i: place(r, i)))
            ws = [_start(python, "worker", env,
                         ["-c", "import sys; from dpro.whatif.calibrate_ps import _port_worker_main; "
                                "_port_worker_main(sys.argv[1], [int(x) for x in sys.argv[2].split(',')], "
                                "int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7]))",
                          out, ",".join(map(str, sizes)), str(warmup), str(rounds), str(compute_us), str(i if pin else -1),
                          str(momentum)],
                         lambda r, i=i: place(r, i)) for i in range(workers)]
            procs += ws
            end = time.monotonic() + timeout
            for w in ws:
                try:
                    _, err = w.communicate(timeout=max(1.0, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise RuntimeError(f"ps-lite port calibration: the workers did not finish in {timeout:.0f} s") from None
                if w.returncode:
                    last = (err or b"").decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
                    raise RuntimeError(f"ps-lite port calibration: a worker failed (exit {w.returncode}): {last[0]}")
            spans = [json.loads(Path(out.format(rank=r)).read_text()) for r in range(workers)]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    rate, window = common_window_rate(spans)  # worker rounds per second, all workers
    own = sum(s["rounds"] / (s["end_s"] - s["start_s"]) for s in spans)  # each over its own span (before)
    nbytes, msgs = server_load(sizes, servers)
    return {"workers": workers, "servers": servers, "round_us": 1e6 * workers / rate, "server_bytes": nbytes,
            "server_msgs": msgs, "rounds": rounds, "window_s": window, "own_span_round_us": 1e6 * workers / own,
            "compute_us": compute_us, "pinned": pin, "momentum": momentum,
            "spans_s": _relative_spans(spans)}


def _relative_spans(spans: list[dict]) -> list[dict]:
    """Each worker's timed start and round ends, s after the earliest start (the samples, kept)."""
    t0 = min(s["start_s"] for s in spans)
    return [{"start_s": round(s["start_s"] - t0, 6), "end_s": round(s["end_s"] - t0, 6), "rounds": s["rounds"],
             "ends_s": [round(e - t0, 6) for e in s.get("ends_s", [])]} for s in spans]


def port_efficiency(row: dict, alpha: float, beta: float) -> float:
    """A :func:`measure_port` row's efficiency at the link cost ``alpha + beta * B`` per
    message: the busiest port's time for ``workers`` worker rounds over the measured time
    of a worker's round (1.0: the port moves bytes at the rate one connection gets)."""
    busiest = max(alpha * m + beta * b for b, m in zip(row["server_bytes"], row["server_msgs"]))
    return row["workers"] * busiest / row["round_us"] if row["round_us"] > 0 else 1.0


def calibrate_ps(python: str = sys.executable, sizes: list[int] | None = None, repeats: int = 20,
                 **where: object) -> dict:
    """Measure and fit; the platform file's content (:mod:`dpro.graph.platform`); ``where``:
    :func:`measure`'s ``place``, ``root_uri`` and ``env``."""
    rows = measure(python, sizes, repeats, **where)  # type: ignore[arg-type]
    return {"format": FORMAT, "version": 1, "backend": "ps-lite", "processes": 3, "host": socket.gethostname(),
            "ps": fit(rows), "samples": rows}
