"""Fidelity on real parameter-server jobs: MXNet 1.9.1 dist_sync over ps-lite.

For each job (model x workers x servers [x bandwidth cap]): ``--profiled`` runs under
`dpro profile` (each replayed by `dpro replay --json`; medians) and ``--truth`` runs with
the recorder switched off (``DPRO_DISABLE=1``, so MXNet keeps its default bulked
execution), interleaved, timed by the training script itself (examples/mxnet/train_ps.py:
wall clock per step, ending in ``waitall``). Measured = median over runs of the per-run
median step (mean over workers), steps after the warm-up. Prints predicted vs measured,
predicted vs the trace's own steps, and the profiling overhead (trace vs measured); then,
apart, the overhead the recorder measured itself (its step walls: the warm-up and the
calls after the window vs the window, dpro.graph.overhead) and the prediction with it
removed (``predicted_unprofiled_iteration_us``).

Jobs ``*-capR`` put every server and worker in its own network namespace behind an R
Mbit/s tbf cap on its link (benchmarks/fidelity/ps_netns.py; needs root); the others run
on loopback.

``--variants`` profiles each job with several recorder settings in the same rounds (one
profiled run of each per round, against the same unprofiled runs; the order within a
round alternates), e.g. MXNet's op bulking kept vs off in the window:
``--variants 'bulked=,unbulked=DPRO_MXNET_UNBULK=1'``. ``--settings`` runs every process,
profiled or not, with one of benchmarks/jobenv.py's settings (``none``: as launched).

    .venv/bin/python benchmarks/fidelity/ps_jobs.py [--truth 2] [--profiled 1] [--jobs mlp-2w1s,conv-4w2s] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import jobenv  # noqa: E402

MX = REPO / ".venv-mx" / "bin"
#: (model, workers, servers, bandwidth cap in Mbit/s per direction of every process's link, or None: loopback)
JOBS = [(m, w, s, None) for m in ("mlp", "conv") for w in (2, 4) for s in (1, 2)] + \
    [("mlp", 2, 1, 1000.0), ("mlp", 2, 2, 1000.0), ("conv", 2, 1, 200.0), ("mlp", 4, 2, 1000.0)]
PS_NETNS = Path(__file__).resolve().parent / "ps_netns.py"
WARMUP, STEPS, AFTER = 12, 8, 20  # calls after the window: the settled unprofiled pace (overhead)


def name(m: str, w: int, s: int, cap: float | None = None) -> str:
    return f"{m}-{w}w{s}s" + (f"-cap{cap:g}" if cap else "")


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: int = 400) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd[:6])} ...: exit {r.returncode}: {(r.stdout + r.stderr)[-1500:]}")
    return r


def job_cmd(m: str, w: int, s: int, timing: Path, steps: int, cap: float | None = None) -> list[str]:
    """Loopback: launch_local.py. Capped: each server and worker in its own network
    namespace behind a tbf cap (ps_netns.py, root)."""
    launcher = [str(PS_NETNS), "--rate-mbit", f"{cap:g}"] if cap else ["examples/mxnet/launch_local.py"]
    return [str(MX / "python"), *launcher, "-n", str(w), "-s", str(s), "--timeout", "300",
            "--", "examples/mxnet/train_ps.py", "--model", m, "--steps", str(steps), "--timing-out", str(timing)]


def measured_us(timing: Path, skip: int) -> float:
    per = [json.loads(p.read_text())["step_us"][skip:] for p in sorted(timing.glob("timing_rank*.json"))]
    return statistics.median(statistics.mean(v) for v in zip(*per))


@contextlib.contextmanager
def work_dir(keep: Path | None, prefix: str) -> Iterator[str]:
    """Where the runs go: ``keep`` (created, kept) or a temporary directory."""
    if keep is None:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            yield tmp
    else:
        keep.mkdir(parents=True, exist_ok=True)
        yield str(keep)


def fidelity_row(job: str, pred: float, trace: float, meas: float, **extra: object) -> dict:
    """One table row: predicted vs measured (unprofiled) and vs the trace, profiling overhead."""
    return {"job": job, "predicted_us": pred, "trace_us": trace, "measured_us": meas,
            "error_pct": 100 * (pred - meas) / meas, "vs_trace_pct": 100 * (pred - trace) / trace,
            "overhead_pct": 100 * (trace - meas) / meas, **extra}


def one(m: str, w: int, s: int, cap: float | None, truth: int, profiled: int, tmp: Path,
        variants: dict[str, dict[str, str]] | None = None,
        settings: jobenv.JobSettings = jobenv.SETTINGS["none"]) -> list[dict]:
    """One row per variant (``{name: extra environment}`` of the profiled runs; default one
    plain variant), each against the same unprofiled runs, interleaved: even rounds run the
    variants' profiled runs first, odd rounds the unprofiled run first (the machine's pace
    drifts, and what one run leaves to the next should not favour one side)."""
    variants = variants or {"default": {}}
    d = tmp / name(m, w, s, cap)
    got: dict[str, dict[str, list]] = {v: {"preds": [], "traces": [], "unprof": [], "ovs": []} for v in variants}
    truths: list[float] = []
    base = {**os.environ, **settings.env()}
    for i in range(max(truth, profiled)):
        order = [*variants, None] if i % 2 == 0 else [None, *reversed(list(variants))]
        for v in order:
            if v is None:
                if i < truth:
                    run(settings.apply(job_cmd(m, w, s, d / f"timing_{i}", WARMUP + 15, cap)),
                        env={**base, "DPRO_DISABLE": "1"})
                    truths.append(measured_us(d / f"timing_{i}", WARMUP))
                continue
            if i >= profiled:
                continue
            g, tr = got[v], d / f"trace_{v}{i}"
            run([str(MX / "dpro"), "profile", "-o", str(tr), "--warmup", str(WARMUP), "--steps", str(STEPS), "--",
                 *settings.apply(job_cmd(m, w, s, d / f"timing_prof_{v}{i}", WARMUP + STEPS + AFTER, cap))],
                env={**base, **variants[v]})
            rep = json.loads(run([str(MX / "dpro"), "replay", str(tr), "--json"]).stdout)
            g["preds"].append(rep["predicted_iteration_us"])
            g["traces"].append(rep["measured_iteration_us"])
            # the recorder's own overhead taken off (the plain prediction when it measured none)
            g["unprof"].append(rep.get("predicted_unprofiled_iteration_us") or rep["predicted_iteration_us"])
            g["ovs"].append((rep.get("profiling_overhead") or {}).get("overhead_pct"))
    meas = statistics.median(truths)
    rows = []
    for v, g in got.items():
        pu = statistics.median(g["unprof"])
        known = [o for o in g["ovs"] if o is not None]
        rows.append(fidelity_row(name(m, w, s, cap), statistics.median(g["preds"]), statistics.median(g["traces"]),
                                 meas, variant=v, truth_runs_us=truths, predicted_runs_us=g["preds"],
                                 trace_runs_us=g["traces"], unprofiled_predicted_runs_us=g["unprof"],
                                 recorder_overhead_pct=statistics.median(known) if known else None,
                                 predicted_overhead_removed_us=pu, error_unprofiled_pct=100 * (pu - meas) / meas))
    return rows


def _pct(x: float | None) -> str:
    return "   n/a" if x is None else f"{x:+5.1f}%"


def _ms(x: float | None) -> str:
    return "    n/a" if x is None else f"{x / 1e3:7.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--truth", type=int, default=2, help="unprofiled runs per job")
    ap.add_argument("--profiled", type=int, default=1, help="profiled runs per job and variant (medians)")
    ap.add_argument("--jobs", default=None,
                    help="comma-separated job names, e.g. mlp-2w1s,mlp-2w1s-cap1000 (default: all; capped jobs need root)")
    ap.add_argument("--variants", default="default=",
                    help="profiled variants: name=ENV=V+ENV2=V2,... (each with these variables added), "
                         "e.g. 'bulked=,unbulked=DPRO_MXNET_UNBULK=1'")
    ap.add_argument("--settings", default="none", choices=list(jobenv.SETTINGS),
                    help="job settings of every run, profiled or not (benchmarks/jobenv.py); none: as launched")
    ap.add_argument("--keep", type=Path, default=None, help="keep the traces, timings and results.json in this directory")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    want = set(a.jobs.split(",")) if a.jobs else None
    variants = jobenv.parse_variants(a.variants)
    rows = []
    with work_dir(a.keep, "dpro-psfid-") as tmp:
        for m, w, s, cap in JOBS:
            if want and name(m, w, s, cap) not in want:
                continue
            new = one(m, w, s, cap, a.truth, a.profiled, Path(tmp), variants, jobenv.SETTINGS[a.settings])
            rows += new
            if a.keep is not None:  # what is done so far survives an interrupted run
                (a.keep / "results.json").write_text(json.dumps(rows, indent=1))
            if not a.json:
                for r in new:
                    print(f"{r['job']:<18} {r['variant']:<9} measured {r['measured_us'] / 1e3:7.2f} ms  "
                          f"trace {r['trace_us'] / 1e3:7.2f} ms  "
                          f"predicted {r['predicted_us'] / 1e3:7.2f} ms  error {r['error_pct']:+6.1f}%  "
                          f"vs trace {r['vs_trace_pct']:+6.1f}%  overhead {r['overhead_pct']:+6.1f}%  "
                          f"| recorder's overhead {_pct(r['recorder_overhead_pct'])}  "
                          f"predicted w/o it {_ms(r['predicted_overhead_removed_us'])} "
                          f"error {r['error_unprofiled_pct']:+6.1f}%", flush=True)
    summary = {}
    for v in variants:
        vr = [r for r in rows if r["variant"] == v]
        summary[v] = {"median_abs_error_pct": statistics.median(abs(r["error_pct"]) for r in vr),
                      "median_abs_vs_trace_pct": statistics.median(abs(r["vs_trace_pct"]) for r in vr),
                      "median_abs_error_unprofiled_pct": statistics.median(abs(r["error_unprofiled_pct"]) for r in vr)}
    if a.json:
        only = summary[next(iter(variants))] if len(variants) == 1 else {}
        print(json.dumps({"rows": rows, **only, "variants": summary, "settings": a.settings}, indent=1))
    else:
        for v, f in summary.items():
            print(f"{v}: median |error| vs measured {f['median_abs_error_pct']:.1f}% "
                  f"(overhead removed: {f['median_abs_error_unprofiled_pct']:.1f}%), "
                  f"vs trace {f['median_abs_vs_trace_pct']:.1f}%")


if __name__ == "__main__":
    main()
