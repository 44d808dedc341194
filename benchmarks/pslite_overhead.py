"""Overhead of dpro's ps-lite message trace (native/pslite_patch).

Two measurements, printed as one JSON object (and a summary on stderr):

* ``hook``: the trace hook alone (native/pslite_patch/bench_trace.cc): ns per message
  with PS_TRACE_DIR unset (the branch) and set (clock reads, formatting, buffering,
  writing), single-threaded;
* ``job``: ps-lite's tests/test_benchmark (PUSH_PULL, a scheduler, 2 servers and 2 workers
  on loopback), run ``--repeats`` times alternately without and with tracing: the time
  per round the program itself reports (its "Application goodput" line over all rounds),
  median per setting, their ratio, and the difference per message a worker records.

Usage: python benchmarks/pslite_overhead.py [--rounds 200] [--repeats 5] [--bytes 4096]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PATCH = REPO / "native" / "pslite_patch"
GOODPUT = re.compile(rb"Application goodput: ([0-9.eE+-]+) Gbps")


def build() -> Path:
    r = subprocess.run(["bash", str(PATCH / "build.sh"), sys.executable], capture_output=True, text=True, check=True)
    return Path(r.stdout.strip().splitlines()[-1].split("=", 1)[1])


def hook_bench(psl: Path, n: int) -> dict:
    src = PATCH / "bench_trace.cc"
    tag = hashlib.sha256(src.read_bytes() + (PATCH / "dpro_trace.h").read_bytes()).hexdigest()[:12]
    exe = psl.parent / f"bench_trace-{tag}"
    zmq = psl.parents[1] / "zmq-4.1.4" / "lib"
    if not exe.exists():
        subprocess.run(["nice", "-n", "10", "g++", "-std=c++14", "-O2", f"-I{psl / 'include'}", f"-I{PATCH}", str(src),
                        str(psl / "build" / "libps.a"), f"-L{zmq}", f"-Wl,-rpath,{zmq}", "-lzmq", "-pthread", "-o", str(exe)],
                       check=True, capture_output=True)
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for key, env in (("off_ns", {}), ("on_ns", {"PS_TRACE_DIR": d})):
            r = subprocess.run([str(exe), str(n)], env={**os.environ, **env}, capture_output=True, text=True, check=True)
            out[key] = json.loads(r.stdout)["ns_per_message"]
    return out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(psl: Path, trace_dir: str | None, rounds: int, nbytes: int, keys_per_server: int) -> float:
    """µs per round (mean over the 2 workers), as test_benchmark reports it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_"))}
    env.update(DMLC_NUM_SERVER="2", DMLC_NUM_WORKER="2", DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(_port()),
               DMLC_NODE_HOST="127.0.0.1", DMLC_INTERFACE="lo", NUM_KEY_PER_SERVER=str(keys_per_server),
               LOG_DURATION=str(rounds))
    if trace_dir:
        env["PS_TRACE_DIR"] = trace_dir
    exe = str(psl / "tests" / "test_benchmark")
    roles = ["scheduler", "server", "server", "worker", "worker"]
    procs = [subprocess.Popen([exe, str(nbytes), str(rounds), "1"], env={**env, "DMLC_ROLE": r},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in roles]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"test_benchmark failed: {outs[-1][-2000:].decode(errors='replace')}")
    total_keys = 2 * keys_per_server
    per_round = []
    for out in outs[3:]:
        m = GOODPUT.findall(out)
        if not m:
            raise RuntimeError("test_benchmark printed no goodput line")
        gbps = float(m[-1])  # 8 * bytes * keys * rounds / ns
        per_round.append(8.0 * nbytes * total_keys / gbps / 1000.0)
    return statistics.mean(per_round)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bytes", type=int, default=4096)
    ap.add_argument("--keys-per-server", type=int, default=3)
    ap.add_argument("--hook-messages", type=int, default=1_000_000)
    a = ap.parse_args()
    psl = build()
    hook = hook_bench(psl, a.hook_messages)
    off, on = [], []
    with tempfile.TemporaryDirectory() as d:
        for i in range(a.repeats):
            off.append(run_job(psl, None, a.rounds, a.bytes, a.keys_per_server))
            on.append(run_job(psl, str(Path(d) / f"run{i}"), a.rounds, a.bytes, a.keys_per_server))
    # per round a worker records 4 messages per key (push and pull request sent, responses received)
    msgs = 4 * 2 * a.keys_per_server
    m_off, m_on = statistics.median(off), statistics.median(on)
    res = {
        "hook": hook,
        "job": {"rounds": a.rounds, "bytes": a.bytes, "keys": 2 * a.keys_per_server, "repeats": a.repeats,
                "round_us_off": off, "round_us_on": on, "median_round_us_off": m_off, "median_round_us_on": m_on,
                "ratio": m_on / m_off, "worker_messages_per_round": msgs,
                "delta_us_per_message": (m_on - m_off) / msgs},
    }
    print(json.dumps(res))
    print(f"hook: {hook['off_ns']:.1f} ns/message off, {hook['on_ns']:.0f} ns/message on; "
          f"job: {m_off:.0f} us/round off, {m_on:.0f} us/round on, ratio {m_on / m_off:.3f} "
          f"({(m_on - m_off) / msgs:+.1f} us per worker message)", file=sys.stderr)


if __name__ == "__main__":
    main()
