"""How far the same unprofiled job repeats from run to run, under different job settings.

Runs one job of ``benchmarks/overhead.py`` (path x model x workers x network) with dpro OFF,
``--repeat`` times per setting, the settings interleaved (A, B, A, B, ...), each run timed
by the job's own clock (its ``--timing-out`` file; per step the mean over the ranks).
Per setting it prints, over the runs:

* the run-to-run spread of three statistics of a run: the median of the profiling
  window's steps (what benchmarks/overhead.py compares), the median of all steps after the
  warm-up, and their mean; as the coefficient of variation (stdev / mean) and as
  overhead.py's noise floor (each run against the next: median of |a/b - 1|);
* the within-run spread (stdev / mean of the steps after the warm-up, median over runs);
* per run: the CPU time other processes took (``/proc/stat`` less our children) and the
  VM's steal time, as % of the run's wall time x cores.

Settings are benchmarks/jobenv.py's (``--settings`` names: see ``jobenv.SETTINGS``).

    benchmarks/measure.sh .venv/bin/python benchmarks/noise.py --path ddp --repeat 8 --settings none,threads1pin
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import jobenv  # noqa: E402
import overhead as oh  # noqa: E402

sys.path.insert(0, str(HERE / "whatif"))
from boost import boosted  # noqa: E402


def _stat_cpu() -> tuple[float, float]:
    """(busy user+nice+system, steal) CPU seconds of the whole machine."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    hz = os.sysconf("SC_CLK_TCK")
    return (v[0] + v[1] + v[2]) / hz, v[7] / hz


def _children_s() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def speed_probe() -> tuple[float, float]:
    """This machine's pace now: (ms of a fixed pure-Python loop, ms of copying 64 MB with numpy),
    the best of 3 each; a drift of the VM's speed shows in both."""
    import numpy as np

    def best(fn) -> float:
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return min(ts)

    src, dst = np.ones(8 << 20), np.empty(8 << 20)
    return best(lambda: sum(i * i for i in range(300_000))), best(lambda: np.copyto(dst, src))


def _floor(xs: list[float]) -> float:
    """overhead.py's noise floor: each run against the next, median of the sizes (%)."""
    return statistics.median(abs(100 * (b / a - 1)) for a, b in zip(xs, xs[1:])) if len(xs) > 1 else float("nan")


def _cv(xs: list[float]) -> float:
    return 100 * statistics.stdev(xs) / statistics.mean(xs) if len(xs) > 1 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", default="ddp", choices=oh.PATHS)
    ap.add_argument("--model", default=None, help="default: overhead.py's model of the path")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--net", default="lo", choices=("lo", "cap"))
    ap.add_argument("--repeat", type=int, default=8, help="runs per setting")
    ap.add_argument("--settings", default="none,threads1pin", help=f"comma-separated, of {', '.join(jobenv.SETTINGS)}")
    ap.add_argument("--json-out", type=Path, default=None)
    a = ap.parse_args()
    job = oh.Job(a.path, a.model or oh.DEFAULT_MODEL[a.path], a.workers, a.net)
    names = [s for s in a.settings.split(",") if s]
    ports = oh.fid.PortAllocator(29900)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    print(f"# {job.name}, dpro off, {a.repeat} runs per setting, interleaved; {os.cpu_count()} CPUs", flush=True)
    with boosted() as on, oh.ps_jobs.work_dir(None, "dpro-noise-") as tmp:
        print(f"# boosted: {'yes' if on else 'no'}", flush=True)
        net = oh.NetnsCluster(job.workers, job.cap).__enter__() if job.net == "cap" and job.path in ("ddp", "hvd") else None
        try:
            for i in range(a.repeat):
                for n in names:
                    cpu_ms, mem_ms = speed_probe()
                    busy0, steal0, own0, t0 = *_stat_cpu(), _children_s(), time.monotonic()
                    r = oh.launch(job, Path(tmp) / f"{n}{i}", "off", {}, net, ports, lambda _s: None,
                                  settings=jobenv.SETTINGS[n])
                    busy1, steal1, own1, wall = *_stat_cpu(), _children_s(), time.monotonic() - t0
                    cap = wall * (os.cpu_count() or 1) / 100
                    rec = {"ok": r.ok, "error": r.error, "steps_us": r.steps_us, "wall_s": wall,
                           "foreign_pct": (busy1 - busy0 - (own1 - own0)) / cap, "steal_pct": (steal1 - steal0) / cap,
                           "probe_cpu_ms": cpu_ms, "probe_mem_ms": mem_ms}
                    runs[n].append(rec)
                    if r.ok:
                        w = oh.window_median(job, r.steps_us) / 1e3
                        print(f"  {n:<12} run {i}: window {w:8.1f} ms  after warm-up median "
                              f"{statistics.median(r.steps_us[oh.WINDOW[job.path][0]:]) / 1e3:8.1f} ms  "
                              f"foreign {rec['foreign_pct']:4.1f}%  steal {rec['steal_pct']:4.1f}%  "
                              f"probe {cpu_ms:5.1f} / {mem_ms:5.1f} ms", flush=True)
                    else:
                        print(f"  {n:<12} run {i}: FAILED {(r.error or '')[:300]}", flush=True)
        finally:
            if net is not None:
                net.__exit__(None, None, None)
    warm = oh.WINDOW[job.path][0]
    summary = {}
    print(f"# {job.name}: run-to-run spread (CV = stdev/mean; floor = overhead.py's noise floor, "
          "each run vs the next) of three per-run statistics; within-run CV of the steps", flush=True)
    for n in names:
        ok = [r for r in runs[n] if r["ok"]]
        if len(ok) < 2:
            print(f"  {n:<12} fewer than 2 runs ok", flush=True)
            continue
        win = [oh.window_median(job, r["steps_us"]) for r in ok]
        med = [statistics.median(r["steps_us"][warm:]) for r in ok]
        mean = [statistics.mean(r["steps_us"][warm:]) for r in ok]
        within = statistics.median(_cv(r["steps_us"][warm:]) for r in ok)
        s = {"runs": len(ok), "window_ms": statistics.median(win) / 1e3,
             "window_cv": _cv(win), "window_floor": _floor(win), "median_cv": _cv(med), "median_floor": _floor(med),
             "mean_cv": _cv(mean), "mean_floor": _floor(mean), "within_cv": within,
             "range_pct": 100 * (max(win) / min(win) - 1)}
        summary[n] = s
        print(f"  {n:<12} n={s['runs']} window {s['window_ms']:7.1f} ms  window CV {s['window_cv']:5.1f}% "
              f"floor {s['window_floor']:5.1f}% (max/min {s['range_pct']:+.0f}%)  | median-after-warm-up CV "
              f"{s['median_cv']:5.1f}% floor {s['median_floor']:5.1f}%  | mean CV {s['mean_cv']:5.1f}% floor "
              f"{s['mean_floor']:5.1f}%  | within-run CV {within:5.1f}%", flush=True)
    if a.json_out:
        a.json_out.write_text(json.dumps({"job": job.name, "runs": runs, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
