"""Where a P3 (or plain) MXNet PS step's time goes, measured without dpro (issue #28, P3 128 KiB).

Runs ``examples/mxnet/train_ps.py`` once, unprofiled, as benchmarks/whatif/p3.py runs it
(2 workers + 1 server, each in a namespace behind ``--cap-mbit``, jobenv's threads1pin),
with ``DPRO_P3_STAMPS=1`` (the workers' per-step stamps: backward end, slices issued, pulls
of three slices landed) and
samples, every 0.5 s from outside: the CPU time of every thread of the job's processes
(``/proc/PID/task/TID/stat``) and the tbf qdiscs' counters (sent, dropped, overlimits,
backlog) of every rank link. Reports, over the steps after the warm-up: the step, its
forward+backward part (includes waiting for the pulls of the weights) and its issuing
part, per role and thread the CPU used (in cores, over the same window), the qdiscs'
drops and peak backlog. ``--engine-threads N`` overrides ``MXNET_CPU_WORKER_NTHREADS``.

    benchmarks/measure.sh .venv-mx/bin/python benchmarks/whatif/p3_probe.py --cap-mbit 1000 --slice-bytes 131072 --out /tmp/p3s26/probe128
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

import sys  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from scriptload import load_script  # noqa: E402

import jobenv  # noqa: E402

FIDELITY = REPO / "benchmarks" / "fidelity"

_TC = re.compile(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+) requeues \d+\)\s+backlog (\d+)b")
_CLK = os.sysconf("SC_CLK_TCK")


def _threads() -> dict[str, dict]:
    """``{pid/tid: {role, comm#j, cpu_s}}`` of every thread of the job's worker and server
    processes (``j``: the thread's index in its process, by thread id)."""
    out: dict[str, dict] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if (b"train_ps.py" not in cmd and b"run_ps_node" not in cmd) or b"launch" in cmd or b"ps_netns" in cmd:
                continue
            env = dict(kv.split(b"=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in kv)
            role = env.get(b"DMLC_ROLE", b"?").decode() + env.get(b"PINNED_INDEX", b"").decode()
            for j, tid in enumerate(sorted(os.listdir(f"/proc/{pid}/task"), key=int)):
                st = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                comm = st[st.index("(") + 1:st.rindex(")")]
                f = st[st.rindex(")") + 2:].split()
                out[f"{pid}/{tid}"] = {"role": role, "comm": f"{comm}#{j}", "cpu_s": (int(f[11]) + int(f[12])) / _CLK}
        except (OSError, ValueError):
            continue
    return out


def _qdiscs(nn, n: int) -> dict[str, list[int]]:
    """tbf counters ``[bytes, pkts, dropped, overlimits, backlog]`` of every rank's two directions
    (``nn``: benchmarks/fidelity/netns.py, which names the links)."""
    out = {}
    for r in range(n):
        for side, cmd in (("to", ["tc", "-s", "qdisc", "show", "dev", nn.host_veth(r)]),
                          ("from", ["ip", "netns", "exec", nn.ns_name(r), "tc", "-s", "qdisc", "show", "dev",
                                    nn.ns_veth(r)])):
            m = _TC.search(subprocess.run(cmd, capture_output=True, text=True).stdout.replace("\n", " "))
            if m:
                out[f"{side}{r}"] = [int(x) for x in m.groups()]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slice-bytes", type=int, default=0, help="P3 slice size (0: the plain job)")
    ap.add_argument("--cap-mbit", type=float, default=1000.0)
    ap.add_argument("--engine-threads", type=int, default=None)
    ap.add_argument("--steps", type=int, default=15, help="steps after the warm-up")
    ap.add_argument("--out", type=Path, required=True)
    o = ap.parse_args()
    pj = load_script("ps_jobs", FIDELITY / "ps_jobs.py", add_dir=True)
    nn = load_script("netns", FIDELITY / "netns.py", add_dir=True)
    js = jobenv.default_for("mx")
    env = {**os.environ, "PYTHONPATH": str(REPO), "DPRO_DISABLE": "1", "DPRO_P3_STAMPS": "1"}
    cmd = js.apply(pj.job_cmd(o.model, o.workers, 1, o.out, pj.WARMUP + o.steps, o.cap_mbit))
    if o.engine_threads is not None:
        cmd = [a if not a.startswith("MXNET_CPU_WORKER_NTHREADS=") else f"MXNET_CPU_WORKER_NTHREADS={o.engine_threads}"
               for a in cmd]
    if o.slice_bytes:
        cmd += ["--p3", "--slice-bytes", str(o.slice_bytes)]
    samples: list[tuple[float, dict, dict]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.perf_counter() * 1e6, _threads(), _qdiscs(nn, o.workers + 1)))
            time.sleep(0.5)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    done.set()
    th.join()
    ranks = [json.loads(p.read_text()) for p in sorted(o.out.glob("timing_rank*.json"))]
    w = pj.WARMUP
    res: dict = {"slice_bytes": o.slice_bytes, "cap_mbit": o.cap_mbit, "engine_threads": o.engine_threads,
                 "load_avg_1m": os.getloadavg()[0], "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    t_lo = max(r["p3_stamps"][w][0] if "p3_stamps" in r else 0.0 for r in ranks)
    t_hi = t_lo
    for r in ranks:
        st = r["step_us"][w:]
        row = {"step_ms": statistics.median(st) / 1e3, "step_min_ms": min(st) / 1e3, "step_max_ms": max(st) / 1e3}
        if "p3_stamps" in r:
            s = r["p3_stamps"][w:]
            row["fwbw_ms"] = statistics.median(b - t for t, b, _ in s) / 1e3
            row["issue_ms"] = statistics.median(i - b for _, b, i in s) / 1e3
            row["issue_cpu_ms"] = statistics.median(r["p3_issue_cpu_us"][w:]) / 1e3
            row["steps_ms"] = [round(x / 1e3, 1) for x in st]
            row["fwbw_each_ms"] = [round((b - t) / 1e3, 1) for t, b, _ in s]
            t_hi = max(t_hi, s[-1][2])
            # per step, from its backward's end: slice 0, the first layer's last slice and the
            # last slice: pull answer landed, copied into the weight (train_ps.py P3._watcher);
            # then the next backward's end after the last copy (the step's part after the wire)
            names = ("recv0", "copied0", "recv_layer0", "copied_layer0", "recv_last", "copied_last")
            land = r["p3_landed"]
            rel = [[x - s_[1] for x in land[w + j]] for j, s_ in enumerate(s) if land[w + j]]
            row["from_bw_end_ms"] = {n: round(statistics.median(v[i] for v in rel) / 1e3, 1)
                                     for i, n in enumerate(names)}
            nxt = [r["p3_stamps"][w + j + 1][1] - land[w + j][5] for j in range(len(s) - 1) if land[w + j]]
            row["last_copy_to_next_bw_end_ms"] = round(statistics.median(nxt) / 1e3, 1)
        res[f"worker{r['rank']}"] = row
    # CPU and qdiscs over [t_lo, t_hi] (P3: the measured steps; plain: the last 60 % of the samples)
    if t_hi <= t_lo:
        t_lo, t_hi = samples[int(len(samples) * 0.4)][0], samples[-3][0]
    a = min(samples, key=lambda x: abs(x[0] - t_lo))
    b = min(samples, key=lambda x: abs(x[0] - t_hi))
    span = (b[0] - a[0]) / 1e6
    per: dict[str, float] = {}
    for k, v in b[1].items():
        if k in a[1]:
            name = f"{v['role']}:{v['comm']}"
            per[name] = per.get(name, 0.0) + (v["cpu_s"] - a[1][k]["cpu_s"]) / span
    res["window_s"] = span
    res["cpu_cores"] = {k: round(v, 3) for k, v in sorted(per.items()) if v > 0.005}
    roles: dict[str, float] = {}
    for k, v in per.items():
        roles[k.split(":")[0]] = roles.get(k.split(":")[0], 0.0) + v
    res["cpu_cores_per_role"] = {k: round(v, 3) for k, v in sorted(roles.items())}
    q = {}
    for link, end in b[2].items():
        start = a[2].get(link, [0] * 5)
        q[link] = {"MB_per_s": round((end[0] - start[0]) / span / 1e6, 1), "dropped": end[2] - start[2],
                   "overlimits": end[3] - start[3],
                   "backlog_max_B": max(s[2].get(link, [0] * 5)[4] for s in samples if a[0] <= s[0] <= b[0])}
    res["qdiscs"] = q
    (o.out / "probe.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items()}, indent=1))


if __name__ == "__main__":
    from boost import boosted  # noqa: E402

    with boosted() as on:
        main()
