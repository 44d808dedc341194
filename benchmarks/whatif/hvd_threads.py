"""Where a CPU Horovod job's CPU goes, per thread: unprofiled Horovod (gloo, loopback) runs of
``examples/pytorch/hvd_recorder.py`` at N ranks, each rank's threads' CPU time (user +
system, ``/proc/PID/task/TID/stat``, sampled every 0.2 s) over the second half of the run
(past the start-up: imports, ``hvd.init``), summed over the ranks, as a share of a core and
as CPU ms per rank and step (share x the median step the script measures itself).

    .venv/bin/python benchmarks/whatif/hvd_threads.py [--ranks 1,2,3,4] [--steps 25] [--out DIR]

The main thread computes; Horovod's background thread negotiates and runs the collectives
(gloo), gloo's own threads move the bytes. What the non-main threads burn per step is CPU the
``--host-cores`` oversubscription model must count when ranks share cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """tid -> (thread name, CPU seconds) of a process's threads."""
    out = {}
    for t in Path(f"/proc/{pid}/task").glob("*"):
        try:
            st = (t / "stat").read_text()
        except OSError:
            continue
        name = st[st.index("(") + 1:st.rindex(")")]
        f = st[st.rindex(")") + 2:].split()
        out[int(t.name)] = (name, (int(f[11]) + int(f[12])) / TICK)
    return out


def run(n: int, steps: int, skip: int, out: Path) -> dict:
    import run as wr
    from boost import descendants

    fid = wr._fidelity()
    series: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)  # (pid, tid) -> (t, cpu s)
    names: dict[tuple[int, int], str] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            now = time.monotonic()
            for pid in descendants(os.getpid()):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"hvd_recorder.py" in cmd and b"horovodrun" not in cmd:
                    for tid, (name, cpu) in thread_cpu(pid).items():
                        series[(pid, tid)].append((now, cpu))
                        names[(pid, tid)] = "main" if tid == pid else name

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0 = time.monotonic()
    wr.hvd_launch(n, ["--model", "mlp", "--steps", str(steps), "--timing-skip", str(skip),
                      "--timing-out", str(out / "t{rank}.json")], None, fid, out / "logs")
    wall = time.monotonic() - t0
    stop.set()
    th.join()
    # the ranks are the processes whose main thread computes (python wrappers have one thread)
    pids = {pid for (pid, tid) in series if tid != pid}
    first = min(v[0][0] for k, v in series.items() if k[0] in pids)
    last = max(v[-1][0] for k, v in series.items() if k[0] in pids)
    mid = (first + last) / 2
    used: dict[int, list[tuple[float, str]]] = defaultdict(list)  # pid -> (cores, thread name)
    for k, v in series.items():
        a = next(((t, c) for t, c in v if t >= mid), None)
        if k[0] in pids and a is not None and v[-1][0] > a[0]:
            used[k[0]].append(((v[-1][1] - a[1]) / (last - mid), names[k] if k[0] != k[1] else "main"))
    # the threads other than the main one have no telling names (Horovod's background thread
    # and gloo's are "python"): labelled by their rank within their process, busiest first
    share: dict[str, float] = defaultdict(float)
    for pid, ts in used.items():
        others = sorted((x for x in ts if x[1] != "main"), reverse=True)
        share["main"] += sum(c for c, nm in ts if nm == "main")
        for i, (c, nm) in enumerate(others):
            share[f"other {i + 1} ({nm})" if i < 3 else "others"] += c
    per_rank = [json.loads((out / f"t{r}.json").read_text())["step_us"] for r in range(n)]
    step_us = statistics.median(sum(v) / len(v) for v in zip(*per_rank))
    return {"ranks": n, "rank_processes": len(pids), "wall_s": wall, "window_s": last - mid, "step_us": step_us,
            "core_share_by_thread": dict(sorted(share.items(), key=lambda kv: -kv[1]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="1,2,3,4")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--skip", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("/tmp/dpro-hvd-threads"))
    o = ap.parse_args()
    rows = []
    for n in [int(x) for x in o.ranks.split(",")]:
        d = o.out / f"n{n}"
        d.mkdir(parents=True, exist_ok=True)
        r = run(n, o.steps, o.skip, d)
        rows.append(r)
        tot = sum(r["core_share_by_thread"].values())
        print(f"N{n}: step {r['step_us'] / 1e3:.1f} ms (median), {r['rank_processes']} rank processes, "
              f"{tot:.2f} cores busy over the last {r['window_s']:.1f} s")
        for name, sh in r["core_share_by_thread"].items():
            if sh >= 0.005:
                print(f"   {name:20} {sh:6.3f} cores  {sh * r['step_us'] / 1e3 / n:8.1f} ms CPU per rank-step")
    (o.out / "threads.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    from boost import boosted

    with boosted() as on:
        print(f"# measured jobs boosted: {'yes' if on else 'no'}", file=sys.stderr, flush=True)
        main()
