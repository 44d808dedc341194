"""How this machine's own speed moves, without dpro: the noise under every timed harness.

Three probes (numpy only; nothing of dpro is imported):

* ``series``: one process per core copies a 64 MiB array back to back and prints the copy
  bandwidth of every second (and a summary: median, 5th / 95th percentile, the seconds
  more than 10 % away from the median). On a shared VM the memory bandwidth of both vCPUs
  moves together, in phases, with other tenants' load: no setting inside the VM changes it.
* ``touch``: the first touch of 64 MiB freshly allocated, after idle gaps of 0 to 5 s. With
  the balloon's free page reporting (``virtio_balloon`` feature bit 5), memory freed more
  than about a second ago has been handed back to the host, and touching it again costs a
  fault on the host as well: several times the fault of a page the guest still holds.
* ``beside -- CMD``: runs CMD while a light probe (a 16 MiB copy every ``--every`` seconds,
  under 1 % of a core) records the bandwidth with wall-clock stamps. With ``--timing`` (the
  ``--timing-out`` files of examples/pytorch/train_ddp.py, which carry
  ``first_step_unix_s``) it bins the job's steps (mean over ranks) next to the probe and
  prints their correlation: whether the job's slow phases are the machine's.

    .venv/bin/python benchmarks/machine_drift.py series --seconds 60
    .venv/bin/python benchmarks/machine_drift.py touch
    .venv/bin/python benchmarks/machine_drift.py beside --timing '/tmp/t{rank}.json' --ranks 2 -- \\
        .venv/bin/torchrun --nproc_per_node 2 examples/pytorch/train_ddp.py --steps 600 --timing-out '/tmp/t{rank}.json'

Figures measured with it: docs/fidelity.md "The machine's own drift".
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

MIB = 1 << 20


def copy_rate(a: np.ndarray, b: np.ndarray, seconds: float) -> float:
    """GB/s (bytes read + written) of back-to-back copies of ``a`` into ``b`` for ``seconds``."""
    n, t0 = 0, time.perf_counter()
    while True:
        np.copyto(b, a)
        n += 1
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return 2 * a.nbytes * n / dt / 1e9


def _series_worker(core: int, seconds: int, q: mp.Queue) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    a = np.ones(64 * MIB // 8)
    b = np.empty_like(a)
    q.put((core, [copy_rate(a, b, 1.0) for _ in range(seconds)]))


def summary(xs: list[float]) -> str:
    v = np.asarray(xs)
    med = float(np.median(v))
    off = int(np.sum(np.abs(v / med - 1) > 0.10))
    return (f"median {med:.1f} GB/s, p5 {np.percentile(v, 5):.1f}, p95 {np.percentile(v, 95):.1f}, "
            f"max/min {v.max() / v.min():.2f}, {off} of {len(v)} s more than 10 % from the median")


def cmd_series(o: argparse.Namespace) -> None:
    cores = [int(c) for c in o.cores.split(",")] if o.cores else list(range(os.cpu_count() or 1))
    q: mp.Queue = mp.Queue()
    procs = [mp.Process(target=_series_worker, args=(c, o.seconds, q)) for c in cores]
    for p in procs:
        p.start()
    res = dict(q.get() for _ in procs)
    for p in procs:
        p.join()
    for c in sorted(res):
        print(f"core {c}: {summary(res[c])}")
        print("  per second:", " ".join(f"{x:.1f}" for x in res[c]))
    if o.json_out:
        Path(o.json_out).write_text(json.dumps({"cores": {str(c): res[c] for c in res}}))


def cmd_touch(o: argparse.Namespace) -> None:
    n = 64 * MIB // 8
    out = {}
    for gap in (0.0, 0.5, 1.0, 2.0, 5.0):
        ts = []
        for _ in range(o.tries):
            time.sleep(gap)
            t0 = time.perf_counter()
            a = np.ones(n)  # fresh pages (above glibc's mmap threshold): every one first-touched
            ts.append((time.perf_counter() - t0) * 1e3)
            del a
        out[gap] = ts
        print(f"after {gap:3.1f} s idle: 64 MiB first touch, ms: " + " ".join(f"{t:.1f}" for t in ts)
              + f"   (median {np.median(ts):.1f}, {np.median(ts) * 1e3 / (64 * MIB / 4096):.2f} us a page)")
    if o.json_out:
        Path(o.json_out).write_text(json.dumps({str(k): v for k, v in out.items()}))


def _light_probe(every: float, stop: threading.Event, samples: list[tuple[float, float]]) -> None:
    a = np.ones(16 * MIB // 8)
    b = np.empty_like(a)
    while not stop.wait(every):
        t0 = time.perf_counter()
        np.copyto(b, a)
        np.copyto(b, a)
        samples.append((time.time(), 2 * 2 * a.nbytes / (time.perf_counter() - t0) / 1e9))


def job_steps(pattern: str, ranks: int) -> list[tuple[float, float]]:
    """(wall-clock end, µs) of every timed step, the mean over the ranks."""
    recs = [json.loads(Path(pattern.replace("{rank}", str(r))).read_text()) for r in range(ranks)]
    steps = np.mean([r["step_us"] for r in recs], axis=0)
    t = recs[0]["first_step_unix_s"] + np.cumsum(steps) / 1e6
    return list(zip(t.tolist(), steps.tolist()))


def binned(steps: list[tuple[float, float]], samples: list[tuple[float, float]], width: float
           ) -> list[tuple[float, float, float]]:
    """(bin start, mean step µs, mean probe GB/s) for every ``width``-second bin holding both."""
    t0 = min(t for t, _ in steps)
    rows = []
    for k in range(int((max(t for t, _ in steps) - t0) // width) + 1):
        lo, hi = t0 + k * width, t0 + (k + 1) * width
        s = [us for t, us in steps if lo <= t < hi]
        p = [g for t, g in samples if lo <= t < hi]
        if s and p:
            rows.append((lo - t0, float(np.mean(s)), float(np.mean(p))))
    return rows


def cmd_beside(o: argparse.Namespace) -> None:
    samples: list[tuple[float, float]] = []
    stop = threading.Event()
    th = threading.Thread(target=_light_probe, args=(o.every, stop, samples), daemon=True)
    th.start()
    rc = subprocess.call(o.cmd)
    stop.set()
    th.join()
    print(f"job rc {rc}; probe: {summary([g for _, g in samples])}")
    result: dict = {"probe": samples}
    if o.timing:
        rows = binned(job_steps(o.timing, o.ranks), samples, o.bin)
        for t, us, g in rows:
            print(f"  t {t:6.1f} s   step {us / 1e3:7.2f} ms   probe {g:5.1f} GB/s")
        if len(rows) > 2:
            r = float(np.corrcoef([x[1] for x in rows], [x[2] for x in rows])[0, 1])
            print(f"correlation of the step time with the probe's bandwidth over {len(rows)} bins: {r:+.2f}")
            result["correlation"] = r
        result["bins"] = rows
    if o.json_out:
        Path(o.json_out).write_text(json.dumps(result))
    sys.exit(rc)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("series", help="copy bandwidth per core, every second")
    s.add_argument("--seconds", type=int, default=60)
    s.add_argument("--cores", default="", help="e.g. 0,1 (default: every core)")
    t = sub.add_parser("touch", help="first touch of fresh memory after idle gaps")
    t.add_argument("--tries", type=int, default=4)
    b = sub.add_parser("beside", help="a light bandwidth probe beside a command")
    b.add_argument("--every", type=float, default=1.0, help="seconds between probes")
    b.add_argument("--timing", default="", help="the job's --timing-out pattern ({rank})")
    b.add_argument("--ranks", type=int, default=2)
    b.add_argument("--bin", type=float, default=4.0, help="seconds per bin")
    b.add_argument("cmd", nargs=argparse.REMAINDER)
    for p in (s, t, b):
        p.add_argument("--json-out", default="")
    o = ap.parse_args(argv)
    if o.what == "beside":
        o.cmd = o.cmd[1:] if o.cmd[:1] == ["--"] else o.cmd
        if not o.cmd:
            ap.error("beside: give the command after --")
    {"series": cmd_series, "touch": cmd_touch, "beside": cmd_beside}[o.what](o)


if __name__ == "__main__":
    main()
