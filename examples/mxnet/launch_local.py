"""Run an MXNet parameter-server job on this machine: scheduler, servers, workers.

    python examples/mxnet/launch_local.py -n 2 -s 1 -- examples/mxnet/train_ps.py --model mlp

Every process gets the ps-lite environment (``DMLC_ROLE``, ``DMLC_PS_ROOT_URI`` =
127.0.0.1, ``DMLC_PS_ROOT_PORT`` = a free port, ``DMLC_NUM_SERVER``, ``DMLC_NUM_WORKER``)
on top of the inherited one, so under ``dpro profile`` the workers see ``DPRO_TRACE_DIR``
and friends. Workers run the training script; the scheduler and servers run
``dpro.profiler.mxnet.server.run_ps_node`` (MXNet's own server loop, with dpro's
per-key timing of the server's updates when ``DPRO_TRACE_DIR`` is set). Exits with the
first non-zero worker exit code; servers and the scheduler are stopped when workers end.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: where a process runs: (command prefix, extra environment) for (role, index)
Place = Callable[[str, int], tuple[list[str], dict[str, str]]]


def loopback(role: str, i: int) -> tuple[list[str], dict[str, str]]:
    """Every process on this host's loopback."""
    return [], {"DMLC_NODE_HOST": "127.0.0.1"}


def launch(script: list[str], workers: int, servers: int, *, timeout: float = 600.0, port: int = 0,
           root_uri: str = "127.0.0.1", place: Place = loopback) -> int:
    """Start the scheduler, servers and workers, wait for the workers, stop the rest.
    ``place`` puts each process somewhere (e.g. a network namespace). Returns the first
    non-zero worker exit code (124 on timeout), else 0."""
    env = dict(os.environ)
    env.update({
        "DMLC_PS_ROOT_URI": root_uri,
        "DMLC_PS_ROOT_PORT": str(port or free_port()),
        "DMLC_NUM_SERVER": str(servers),
        "DMLC_NUM_WORKER": str(workers),
        "PS_VERBOSE": env.get("PS_VERBOSE", "0"),
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
    })
    node = [sys.executable, "-c", "from dpro.profiler.mxnet.server import run_ps_node; run_ps_node()"]
    procs: list[tuple[str, subprocess.Popen]] = []

    def start(role: str, cmd: list[str], i: int) -> None:
        prefix, extra = place(role, i)
        # PINNED_INDEX: the worker's launch index (benchmarks/pinned.py binds worker i to a core by it)
        idx = {"PINNED_INDEX": str(i)} if role == "worker" else {}
        procs.append((f"{role}{i}", subprocess.Popen([*prefix, *cmd], env={**env, **extra, **idx, "DMLC_ROLE": role})))

    start("scheduler", node, 0)
    for i in range(servers):
        start("server", node, i)
    cmd = [sys.executable, *script] if script[0].endswith(".py") else script
    for i in range(workers):
        start("worker", cmd, i)
    workers_p = [p for n, p in procs if n.startswith("worker")]
    deadline = time.monotonic() + timeout
    rc = 0
    try:
        while any(p.poll() is None for p in workers_p):
            bad = [p.returncode for p in workers_p if p.returncode not in (None, 0)]
            if bad or time.monotonic() > deadline:
                rc = bad[0] if bad else 124
                break
            time.sleep(0.1)
        rc = rc or next((p.returncode for p in workers_p if p.returncode), 0)
        # servers and the scheduler end by themselves once every worker has left
        for _, p in procs:
            try:
                p.wait(timeout=30 if rc == 0 else 1)
            except subprocess.TimeoutExpired:
                pass
    finally:
        alive = [p for _, p in procs if p.poll() is None]
        for p in alive:
            p.terminate()
        end = time.monotonic() + 3.0
        for p in alive:
            try:
                p.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--workers", type=int, default=2)
    ap.add_argument("-s", "--servers", type=int, default=1)
    ap.add_argument("--port", type=int, default=0, help="scheduler port (default: a free one)")
    ap.add_argument("--timeout", type=float, default=600.0, help="kill the job after this many seconds")
    ap.add_argument("script", nargs=argparse.REMAINDER, help="-- train.py [args]")
    a = ap.parse_args()
    script = a.script[1:] if a.script[:1] == ["--"] else a.script
    if not script:
        ap.error("no training script given")
    return launch(script, a.workers, a.servers, timeout=a.timeout, port=a.port)


if __name__ == "__main__":
    sys.exit(main())
