"""Profiling overhead of dpro's recorder on every path, measured by the jobs' own clocks.

For each job (path x workers x network) the same training script runs ``K`` times with
dpro on and ``K`` times with it off, interleaved (on, off, on, off, ...; with
``--variants`` every variant's on-run, then the off-run). Each run times its OWN steps: the
job script's ``time.perf_counter()`` around every call of the step function, written by
the job itself (``--timing-out``), not read from dpro's trace. Per run, each step's time is
the mean over the ranks.

* **in-window overhead** = median step time of the profiled steps (the window, step
  indices ``warmup .. warmup+steps-1``) with dpro on ÷ the median of the same step indices
  with dpro off − 1; medians over the runs. The honest figure: how much the job that dpro
  replays is distorted by being recorded. The window's last step includes the export of
  the trace (it happens inside that call).
* **whole-run overhead** = the sum of all steps of a run (warm-up, window, the calls after
  it) with dpro on ÷ the same with dpro off − 1; medians over the runs.
* a round is one on-run of each variant and one off-run, back to back; each figure is the
  on-run against the off-run of its round (slow drifts of the machine's speed, which reach
  2x over minutes on a shared VM, hit both alike), and the table gives the median over the
  ``K`` rounds and min..max; the off-run comes last in even rounds and first in odd ones
  (``--order alternate``, the default), so that what one run leaves to the next (caches,
  the machine's load) does not favour one side;
* pooled, per phase (warm-up, window, after): the median step over all on-runs ÷ the same
  over all off-runs − 1: a difference that starts before the window is the launch's, not
  the recording's;
* own pace: each run's window (median step) over its own calls after the window, on-run
  against its round's off-run: a run's overall pace, which on this VM can be 20-30 % slower
  for a whole run on either side, cancels; what dpro leaves behind after the window does not
  (it lowers this figure), so it is read beside the in-window one, not instead of it;
* last window call: that call minus the median of the window's other calls (stopping the
  profiler, and writing the trace unless deferred), read within one run;
* noise floor: each off-run against the next one, the same figures, median of their sizes:
  an overhead this machine cannot tell from zero.

dpro on = the job under `dpro profile` (``--warmup``/``--steps`` of the path); on a capped
DDP job, where the ranks are started one per namespace, the environment `dpro profile`
sets. dpro off = the same command without `dpro profile`, with ``DPRO_DISABLE=1`` (the two
lines stay in the script and cost a counter increment per call).

Paths (the launchers are the fidelity harness's, benchmarks/fidelity/):

* ``ddp``: torch DDP (gloo), examples/pytorch/ddp_recorder.py, torchrun / one namespace per rank;
* ``hvd``: Horovod torch (gloo), examples/pytorch/hvd_recorder.py, horovodrun / hvd_netns.py;
* ``tf``: TensorFlow 2 + Horovod, examples/tensorflow/hvd_recorder.py (``call_us``), .venv-tf;
* ``mx``: MXNet 1.9 parameter server (1 server), examples/mxnet/train_ps.py, .venv-mx.

Job settings: every run, on and off, with benchmarks/jobenv.py's ``default_for(path)`` (one
compute thread per process; each rank bound to core ``rank % cores``, DDP's not;
``--settings`` picks one of ``jobenv.SETTINGS`` for all): the settings under which the same
job repeats best on this machine (docs/fidelity.md "Profiling overhead").

Networks: ``lo`` (loopback) and ``cap`` (each rank in its own network namespace behind a
tbf rate cap, benchmarks/fidelity/netns.py; needs root, skipped otherwise).

    .venv/bin/python benchmarks/overhead.py --quick
    .venv/bin/python benchmarks/overhead.py --paths ddp,tf --workers 2 --nets lo -k 4 --json-out o.json
    .venv/bin/python benchmarks/overhead.py --paths ddp --variants 'lean=,full=DPRO_RECORD_SHAPES=1+DPRO_PROFILE_MEMORY=1'
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE / "fidelity"))
sys.path.insert(0, str(HERE))
import jobenv  # noqa: E402
import ps_jobs  # noqa: E402
import run as fid  # noqa: E402
import tf_jobs  # noqa: E402
from netns import NetnsCluster  # noqa: E402

VENV, VENV_TF, VENV_MX = REPO / ".venv" / "bin", REPO / ".venv-tf" / "bin", REPO / ".venv-mx" / "bin"
PATHS = ("ddp", "hvd", "tf", "mx")
#: the model each path runs by default (--models path=model overrides)
DEFAULT_MODEL = {"ddp": "transformer", "hvd": "mlp", "tf": "convnet", "mx": "mlp"}
#: cap per direction of every rank's link (Mbit/s), as in the fidelity tables
CAP_MBIT = {"mlp": 1000.0, "convnet": 200.0, "transformer": 200.0, "conv": 200.0}
#: profiling window (warm-up, profiled steps) and calls after it, per path
WINDOW = {"ddp": (5, 5, 10), "hvd": (5, 5, 10), "tf": (5, 5, 10), "mx": (12, 8, 10)}
RUN_TIMEOUT_S = 900
#: a variant with ``DIRECT=1`` runs the recorder without `dpro profile`: the ranks get
#: DPRO_TRACE_DIR/WARMUP/STEPS but no HOROVOD_TIMELINE (no Horovod timeline, no writer thread)
DIRECT = "DIRECT"


@dataclass(frozen=True)
class Job:
    path: str
    model: str
    workers: int
    net: str  # "lo" or "cap"

    @property
    def name(self) -> str:
        return f"{self.path}-{self.model}-{self.workers}w-{self.net}"

    @property
    def cap(self) -> float | None:
        return CAP_MBIT[self.model] if self.net == "cap" else None


@dataclass
class Run:
    variant: str  # "off" or a variant name
    ok: bool
    steps_us: list[float] = field(default_factory=list)  # per step, mean over ranks
    wall_s: float = 0.0
    error: str | None = None


# ----------------------------------------------------------------------------- commands


def _profile_prefix(job: Job, out: Path) -> list[str]:
    w, s, _ = WINDOW[job.path]
    dpro = {"tf": VENV_TF, "mx": VENV_MX}.get(job.path, VENV)
    return [str(dpro / "python"), "-m", "dpro.cli", "profile", "-o", str(out), "--force",
            "--warmup", str(w), "--steps", str(s), "--"]


def _torch_commands(job: Job, run_dir: Path, on: bool, net: NetnsCluster | None, port: int) -> list[list[str]]:
    """ddp and hvd: one command (torchrun / horovodrun / hvd_netns), or one per namespace (capped DDP)."""
    w, s, a = WINDOW[job.path]
    script = fid.DDP_RECORDER_SCRIPT if job.path == "ddp" else fid.HVD_RECORDER_SCRIPT
    args = ["--model", job.model, "--steps", str(w + s + a), "--timing-skip", "0",
            "--timing-out", str(run_dir / "timing_rank{rank}.json")]
    opts = SimpleNamespace(python=str(VENV / "python"))
    fjob = fid.Job(job.model, job.workers, job.cap, horovod=job.path == "hvd")
    if job.path == "hvd":
        cmd = fid.horovodrun_command(fjob, opts, script, args, net)
        return [_profile_prefix(job, run_dir / "trace") + cmd if on else ["env", "DPRO_DISABLE=1", *cmd]]
    if net is None:
        cmd = fid.torchrun_command(fjob, opts, port, args, script)
        return [_profile_prefix(job, run_dir / "trace") + cmd if on else ["env", "DPRO_DISABLE=1", *cmd]]
    env = ([f"DPRO_TRACE_DIR={run_dir / 'raw'}", f"DPRO_WARMUP={w}", f"DPRO_STEPS={s}"] if on
           else ["DPRO_DISABLE=1"])
    return [net.exec_prefix(r) + ["env", *net.env_assignments(r, port), *env, opts.python, str(script), *args]
            for r in range(net.n)]


def _tf_command(job: Job, run_dir: Path, on: bool) -> list[str]:
    w, s, a = WINDOW["tf"]
    cmd = tf_jobs.job_cmd(job.model, job.workers, run_dir / "timing", job.cap)
    cmd[cmd.index("--steps") + 1] = str(w + s + a)
    return _profile_prefix(job, run_dir / "trace") + cmd if on else ["env", "DPRO_DISABLE=1", *cmd]


def _mx_command(job: Job, run_dir: Path, on: bool) -> list[str]:
    w, s, a = WINDOW["mx"]
    cmd = ps_jobs.job_cmd(job.model, job.workers, 1, run_dir / "timing", w + s + a, job.cap)
    if on:
        return _profile_prefix(job, run_dir / "trace") + cmd
    # train_ps.py reads the window from the environment even when off (its timing file's window)
    return ["env", "DPRO_DISABLE=1", f"DPRO_WARMUP={w}", f"DPRO_STEPS={s}", *cmd]


def _read_steps(job: Job, run_dir: Path) -> list[float]:
    """Per step: the mean over the ranks of the job's own step times (µs)."""
    if job.path == "tf":
        files, key = sorted(run_dir.glob("timing.*.json")), "call_us"
    elif job.path == "mx":
        files, key = sorted((run_dir / "timing").glob("timing_rank*.json")), "step_us"
    else:
        files, key = sorted(run_dir.glob("timing_rank*.json")), "step_us"
    per = [json.loads(f.read_text())[key] for f in files]
    if len(per) != job.workers:
        raise RuntimeError(f"{len(per)} timing files of {job.workers} in {run_dir}")
    return [statistics.mean(v) for v in zip(*per)]


def launch(job: Job, run_dir: Path, variant: str, env_extra: dict[str, str], net: NetnsCluster | None,
           ports: fid.PortAllocator, log, settings: jobenv.JobSettings = jobenv.DEFAULT) -> Run:
    """One run of ``job`` (``variant`` "off": dpro disabled), timed by the job itself, with the
    job ``settings`` (benchmarks/jobenv.py; the same for on- and off-runs)."""
    on = variant != "off"
    env_extra = dict(env_extra)
    direct = env_extra.pop(DIRECT, "") == "1"  # recorder on without `dpro profile`
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    build = on and not direct
    if job.path in ("ddp", "hvd"):
        cmds = _torch_commands(job, run_dir, build, net, ports.take())
    elif job.path == "tf":
        cmds = [_tf_command(job, run_dir, build)]
    else:
        cmds = [_mx_command(job, run_dir, build)]
    if on and direct:  # the environment `dpro profile` sets, less HOROVOD_TIMELINE
        w, s, _ = WINDOW[job.path]
        rec = [f"DPRO_TRACE_DIR={run_dir / 'raw'}", f"DPRO_WARMUP={w}", f"DPRO_STEPS={s}"]
        cmds = [[x for a in c for x in (rec if a == "DPRO_DISABLE=1" else [a])] for c in cmds]
    if on and env_extra:
        cmds = [["env", *[f"{k}={v}" for k, v in env_extra.items()], *c] for c in cmds]
    cmds = [settings.apply(c) for c in cmds]
    t0 = time.monotonic()
    err = fid.run_processes(cmds, run_dir / "logs", RUN_TIMEOUT_S, log)
    r = Run(variant, err is None, wall_s=time.monotonic() - t0, error=err)
    if r.ok:
        try:
            r.steps_us = _read_steps(job, run_dir)
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            r.ok, r.error = False, f"timing files: {e}"
    shutil.rmtree(run_dir / "trace", ignore_errors=True)
    shutil.rmtree(run_dir / "raw", ignore_errors=True)
    return r


# ----------------------------------------------------------------------------- figures


def window_median(job: Job, steps: list[float]) -> float:
    w, s, _ = WINDOW[job.path]
    return statistics.median(steps[w:w + s])


def last_call_extra_us(job: Job, steps: list[float]) -> float:
    """The window's last call minus the median of its other calls: what stopping the
    profiler (and, unless deferred, writing the trace) adds to the call that ends the window.
    Read within one run, so the machine's drift between runs does not enter it."""
    w, s, _ = WINDOW[job.path]
    return steps[w + s - 1] - statistics.median(steps[w:w + s - 1])


def own_pace(job: Job, steps: list[float]) -> float:
    """The window's median step over the same run's median step after the window: the run's
    overall pace taken out (on the 2-core VM a run can settle 20-30 % slower from its warm-up
    to its last call, whether dpro records it or not)."""
    w, s, _ = WINDOW[job.path]
    return window_median(job, steps) / statistics.median(steps[w + s:])


def _pct(on: float, off: float) -> float:
    return 100.0 * (on / off - 1.0)


def _paired(job: Job, ons: list[Run], offs: list[Run]) -> tuple[list[float], list[float], list[float]]:
    """In-window, whole-run and own-pace (:func:`own_pace`) overhead of each on-run against
    the off-run of the same round."""
    win = [_pct(window_median(job, a.steps_us), window_median(job, b.steps_us)) for a, b in zip(ons, offs)]
    whole = [_pct(sum(a.steps_us), sum(b.steps_us)) for a, b in zip(ons, offs)]
    pace = [_pct(own_pace(job, a.steps_us), own_pace(job, b.steps_us)) for a, b in zip(ons, offs)]
    return win, whole, pace


def phase_medians(job: Job, runs: list[Run]) -> dict[str, float]:
    """Pooled over ``runs``: the median step (µs) of each phase: ``warmup`` (its first call,
    the job's own start-up, left out), ``window`` (its last call, the profiler's stop, left
    out) and ``after`` (the calls after the window)."""
    w, s, _ = WINDOW[job.path]
    spans = {"warmup": (1, w), "window": (w, w + s - 1), "after": (w + s, None)}
    return {k: statistics.median(x for r in runs for x in r.steps_us[a:b]) for k, (a, b) in spans.items()}


def figures(job: Job, runs: list[Run]) -> dict:
    """Per variant: the median over rounds of the on-run against the same round's off-run
    (a round is one on-run of each variant and one off-run, back to back, so slow drifts of
    the machine hit both), with min..max; the noise floor: each off-run against the next one;
    ``pooled_pct``: each phase's median step over all on-runs against the same over all
    off-runs (:func:`phase_medians`): whether a difference starts with the window or before it."""
    out: dict = {"job": job.name, **asdict(job), "runs": [asdict(r) for r in runs], "variants": {}}
    rounds: list[dict[str, Run]] = []
    for r in runs:
        if not rounds or r.variant in rounds[-1]:
            rounds.append({})
        rounds[-1][r.variant] = r
    rounds = [rd for rd in rounds if all(x.ok for x in rd.values()) and "off" in rd]
    if not rounds:
        return out
    offs = [rd["off"] for rd in rounds]
    out["off_window_ms"] = statistics.median(window_median(job, r.steps_us) for r in offs) / 1e3
    out["off_run_s"] = statistics.median(sum(r.steps_us) for r in offs) / 1e6
    if len(offs) >= 2:  # off vs off: each off-run against the next
        w, a, p = _paired(job, offs[1:], offs[:-1])
        out["noise_window_pct"] = statistics.median(abs(x) for x in w)
        out["noise_run_pct"] = statistics.median(abs(x) for x in a)
        out["noise_pace_pct"] = statistics.median(abs(x) for x in p)
    for v in [k for k in rounds[0] if k != "off"]:
        ons = [rd[v] for rd in rounds if v in rd]
        win, whole, pace = _paired(job, ons, [rd["off"] for rd in rounds if v in rd])
        pon, poff = phase_medians(job, ons), phase_medians(job, offs)
        out["variants"][v] = {
            "pooled_pct": {k: _pct(pon[k], poff[k]) for k in pon},
            "k": len(ons),
            "last_call_extra_ms": statistics.median(last_call_extra_us(job, r.steps_us) for r in ons) / 1e3,
            "window_pct": statistics.median(win), "window_min_pct": min(win), "window_max_pct": max(win),
            "run_pct": statistics.median(whole), "run_min_pct": min(whole), "run_max_pct": max(whole),
            "pace_pct": statistics.median(pace), "pace_min_pct": min(pace), "pace_max_pct": max(pace),
        }
    return out


def print_row(row: dict) -> None:
    base = (f"{row['job']:<28} off {row.get('off_window_ms', float('nan')):8.1f} ms/step  "
            f"noise (|off vs next off|, median) {row.get('noise_window_pct', float('nan')):4.1f}% / "
            f"{row.get('noise_run_pct', float('nan')):4.1f}%")
    print(base, flush=True)
    for v, f in row["variants"].items():
        print(f"    {v:<10} k={f['k']}  in-window {f['window_pct']:+6.1f}% ({f['window_min_pct']:+.1f}..{f['window_max_pct']:+.1f})"
              f"   whole-run {f['run_pct']:+6.1f}% ({f['run_min_pct']:+.1f}..{f['run_max_pct']:+.1f})"
              f"   last window call +{f['last_call_extra_ms']:.0f} ms", flush=True)
        if "pace_pct" in f:
            print(f"               own pace (window / the same run's calls after it, on vs off) {f['pace_pct']:+.1f}% "
                  f"({f['pace_min_pct']:+.1f}..{f['pace_max_pct']:+.1f}), noise "
                  f"{row.get('noise_pace_pct', float('nan')):.1f}%", flush=True)
        if "pooled_pct" in f:
            print("               pooled steps " + ", ".join(f"{k} {x:+.1f}%" for k, x in f["pooled_pct"].items()),
                  flush=True)
    bad = [r for r in row["runs"] if not r["ok"]]
    for r in bad:
        print(f"    FAILED {r['variant']}: {(r['error'] or '')[:300]}", flush=True)


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paths", default=",".join(PATHS), help="comma-separated: ddp,hvd,tf,mx")
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--nets", default="lo,cap", help="lo (loopback), cap (namespaces + tbf; root only)")
    ap.add_argument("--models", default="", help="path=model overrides, e.g. ddp=mlp,tf=transformer")
    ap.add_argument("-k", type=int, default=3, help="runs per variant and off-runs per job")
    ap.add_argument("--variants", default="default=",
                    help="on-variants: name=ENV=V+ENV2=V2,...; each runs with these variables added")
    ap.add_argument("--settings", default="", choices=["", *jobenv.SETTINGS],
                    help="job settings of every run, on and off (benchmarks/jobenv.py); default: "
                         "jobenv.default_for(path)")
    ap.add_argument("--order", default="alternate", choices=["alternate", "on-first"],
                    help="order of the runs in a round: alternate (on-runs first in even rounds, the "
                         "off-run first in odd ones, so that an order effect cancels in the median) or "
                         "on-first (every round)")
    ap.add_argument("--quick", action="store_true", help="2 workers, loopback, k=2")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="keep the runs' directories here")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.workers, a.nets, a.k = "2", "lo", min(a.k, 2)
    models = {**DEFAULT_MODEL, **dict(p.split("=", 1) for p in a.models.split(",") if p)}
    nets = [n for n in a.nets.split(",") if n]
    if "cap" in nets and os.geteuid() != 0:
        print("# not root: capped jobs skipped", flush=True)
        nets.remove("cap")
    jobs = [Job(p, models[p], int(w), n) for p in a.paths.split(",") if p
            for w in a.workers.split(",") for n in nets]
    variants = jobenv.parse_variants(a.variants)
    log = print if a.verbose else (lambda _s: None)
    ports = fid.PortAllocator(29700)
    rows = []
    def settings_of(job: Job) -> jobenv.JobSettings:
        return jobenv.SETTINGS[a.settings] if a.settings else jobenv.default_for(job.path)

    print(f"# {len(jobs)} jobs, k={a.k}, variants {', '.join(variants)}, job settings "
          f"{', '.join(sorted({f'{j.path}: {settings_of(j).name}' for j in jobs}))}; "
          f"{os.cpu_count()} CPUs; in-window / whole-run overhead vs dpro off (medians over runs)", flush=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent / "whatif"))
    from boost import boosted

    with boosted() as on, ps_jobs.work_dir(a.keep, "dpro-overhead-") as tmp:
        print(f"# measured jobs boosted (autogroup nice, benchmarks/whatif/boost.py): {'yes' if on else 'no'}", flush=True)
        for job in jobs:
            runs: list[Run] = []
            net_cm = (NetnsCluster(job.workers, job.cap) if job.net == "cap" and job.path in ("ddp", "hvd")
                      else None)  # the other paths' launchers make their own namespaces
            net = net_cm.__enter__() if net_cm is not None else None
            try:
                for i in range(a.k):
                    order = [*variants, "off"]
                    if a.order == "alternate" and i % 2:
                        order = ["off", *variants]
                    for v in order:
                        runs.append(launch(job, Path(tmp) / job.name / f"{v}{i}", v, variants.get(v, {}),
                                           net, ports, log, settings_of(job)))
            finally:
                if net_cm is not None:
                    net_cm.__exit__(None, None, None)
            rows.append({**figures(job, runs), "settings": settings_of(job).name})
            print_row(rows[-1])
            if a.json_out:
                a.json_out.write_text(json.dumps({"k": a.k, "variants": variants, "rows": rows}, indent=1))
    ok = [f for r in rows for f in r["variants"].values()]
    if ok:
        print(f"# median in-window overhead over jobs {statistics.median(f['window_pct'] for f in ok):+.1f}%, "
              f"max {max(f['window_pct'] for f in ok):+.1f}%; whole-run median "
              f"{statistics.median(f['run_pct'] for f in ok):+.1f}%; own pace median "
              f"{statistics.median(f['pace_pct'] for f in ok):+.1f}%, max {max(f['pace_pct'] for f in ok):+.1f}%",
              flush=True)


if __name__ == "__main__":
    main()
