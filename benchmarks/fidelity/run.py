"""dpro fidelity harness: how well does dpro's replay predict real DDP iteration time?

For every job (model x world size x network) it

1. runs ``examples/pytorch/train_ddp.py`` WITHOUT profiling ``--truth-runs`` times (default
   2: one before and one after the profiled run, so slow drifts of the machine hit both
   sides alike) and measures the iteration time itself (ground truth, not taken from
   dpro): each timed step's duration is the mean over the ranks (``time.perf_counter()``
   step start to step start; steps run back to back, so every rank's mean step time is the
   iteration time, while within one step the ranks are staggered and the per-step maximum
   is biased upwards by that jitter), and
   the iteration time is the median over the timed steps of the ground-truth runs (only
   the quiet ones -- other processes below 10% of the CPUs -- if there are any);
   ``noise %`` is the inter-quartile range of those steps relative to their median;
2. runs the same job once WITH ``--profile-dir`` (``--active`` steps after ``--warmup``)
   and measures the profiled steps the same way, restricted to the active (traced) steps
   and minus the time spent inside ``prof.step()`` (the profiler's own start/stop
   bookkeeping at the window edges, which the trace does not cover); profiling overhead
   % = profiled / unprofiled - 1;
3. runs ``python -m dpro.cli replay <trace_dir> --json`` and reads
   ``predicted_iteration_us`` and ``measured_iteration_us`` (dpro's own reading of the
   trace) from its stdout; a missing or failing CLI gives ``n/a``;
4. prints a table and writes the same as JSON.

Networks: ``nocap`` jobs run with plain ``torchrun`` over loopback; capped jobs run each rank
in its own network namespace (``netns.py``), joined by a bridge, with a ``tbf`` rate cap on
both directions of every rank's link. All ranks share this host's CPU cores, so 4-rank jobs
on a 2-core machine are CPU-oversubscribed (that is part of what the trace captures).

Noise: on a small shared VM the speed of the machine drifts by up to ~2x over periods of
seconds (visible even with two plain single-threaded matmul loops), so compare ``error %``
with ``noise %``. ``foreign_cpu_pct`` in the JSON is the CPU time used by processes other
than the harness's own children while a run was going, as a share of all cores (detects
other work on the machine; contention outside the VM is invisible to it); above 10% the
table adds a note. ``--wait-quiet S`` waits before each run for the machine to calm down.

Usage (as root for capped jobs)::

    python benchmarks/fidelity/run.py --quick
    python benchmarks/fidelity/run.py --jobs 'mlp-*,*-4r-*' --verbose
    python benchmarks/fidelity/run.py --list
"""

from __future__ import annotations

import argparse
import importlib.util
import fnmatch
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from netns import NetnsCluster, install_teardown_signals, restore_signals, tbf_args  # noqa: E402

TRAIN_SCRIPT = REPO / "examples" / "pytorch" / "train_ddp.py"
HVD_RECORDER_SCRIPT = REPO / "examples" / "pytorch" / "hvd_recorder.py"
DDP_RECORDER_SCRIPT = REPO / "examples" / "pytorch" / "ddp_recorder.py"
HVD_NETNS_SCRIPT = Path(__file__).resolve().parent / "hvd_netns.py"
#: Horovod (gloo) jobs: loopback only (horovodrun across namespaces is not set up here)
HVD_MODELS = ("mlp", "transformer")
DEFAULT_PYTHON = "/work/venv/bin/python"
MODELS = ("mlp", "convnet", "transformer")
WORLD_SIZES = (2, 4)
#: Per-model cap (Mbit/s per direction) that makes gradient all-reduce a large share of the
#: step on a 2-core VM: mlp has ~34 MB of gradients, convnet ~3 MB, transformer ~4.5 MB.
DEFAULT_CAP_MBIT = {"mlp": 1000.0, "convnet": 200.0, "transformer": 200.0}
QUICK_JOBS = ("mlp-2r-nocap", "mlp-2r-cap*")
#: Above this share of all cores used by other processes during a run, the table warns.
FOREIGN_CPU_WARN_PCT = 10.0

Logger = Callable[[str], None]


@dataclass(frozen=True)
class Job:
    """One benchmark configuration."""

    model: str
    world: int
    cap_mbit: float | None  # None: loopback via torchrun, no namespaces
    horovod: bool = False  # Horovod (gloo) via horovodrun instead of DDP via torchrun

    @property
    def name(self) -> str:
        """E.g. ``mlp-2r-nocap``, ``mlp-4r-cap1000`` or ``hvd-mlp-2r-nocap``."""
        cap = "nocap" if self.cap_mbit is None else f"cap{self.cap_mbit:g}"
        return f"{'hvd-' if self.horovod else ''}{self.model}-{self.world}r-{cap}"


@dataclass
class RunResult:
    """One launch of the training script (all ranks)."""

    ok: bool
    wall_s: float
    commands: list[list[str]]
    timings: list[dict[str, Any]] = field(default_factory=list)  # one per rank
    error: str | None = None
    foreign_cpu_pct: float | None = None


@dataclass
class JobResult:
    """Everything the table and the JSON report about a job."""

    job: str
    model: str
    ranks: int
    cap_mbit: float | None
    measured_ms: float | None = None
    noise_pct: float | None = None
    trace_ms: float | None = None
    predicted_ms: float | None = None
    error_pct: float | None = None
    overhead_pct: float | None = None
    #: dpro's prediction with the recorder's measured overhead removed (recorder traces only)
    predicted_unprofiled_ms: float | None = None
    error_unprofiled_pct: float | None = None
    profiled_ms: float | None = None
    measured_steps_ms: list[float] = field(default_factory=list)
    measured_run_medians_ms: list[float] = field(default_factory=list)
    truth_runs_used: list[int] = field(default_factory=list)  # indices into the unprofiled runs
    used_foreign_cpu_pct: float | None = None  # max over the runs the numbers come from
    profiled_steps_ms: list[float] = field(default_factory=list)
    foreign_cpu_pct: list[float | None] = field(default_factory=list)  # per launch, in order
    trace_dir: str | None = None
    replay_error: str | None = None
    run_error: str | None = None
    commands: list[list[str]] = field(default_factory=list)
    wall_s: float = 0.0


# ----------------------------------------------------------------------------- job matrix


def build_matrix(cap_override: float | None) -> list[Job]:
    """All jobs: models x world sizes x {no cap, capped}."""
    jobs = []
    for model in MODELS:
        for world in WORLD_SIZES:
            cap = cap_override if cap_override is not None else DEFAULT_CAP_MBIT[model]
            jobs += [Job(model, world, None), Job(model, world, cap)]
    if importlib.util.find_spec("horovod") is not None:
        for model in HVD_MODELS:
            cap = cap_override if cap_override is not None else DEFAULT_CAP_MBIT[model]
            jobs += [Job(model, 2, None, horovod=True), Job(model, 2, cap, horovod=True)]
    return jobs


def select_jobs(jobs: list[Job], quick: bool, patterns: str | None) -> list[Job]:
    """Filter by ``--quick`` and the comma-separated glob patterns of ``--jobs``."""
    pats = list(QUICK_JOBS) if quick else []
    if patterns:
        pats += [p.strip() for p in patterns.split(",") if p.strip()]
    if not pats:
        return jobs
    return [j for j in jobs if any(fnmatch.fnmatchcase(j.name, p) for p in pats)]


# ----------------------------------------------------------------------------- launching


class PortAllocator:
    """Hands out a fresh MASTER_PORT per run, skipping ports busy on loopback."""

    def __init__(self, base: int) -> None:
        self.next = base

    def take(self) -> int:
        """A port not in use on 127.0.0.1 (namespaces have their own port space anyway)."""
        while True:
            port, self.next = self.next, self.next + 1
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                    return port
                except OSError:
                    continue


def train_args(job: Job, opts: argparse.Namespace, run_dir: Path, tag: str, profiled: bool) -> list[str]:
    """Arguments of ``train_ddp.py`` for an unprofiled or the profiled run (files named by ``tag``)."""
    steps = opts.warmup + (opts.active if profiled else opts.timed)
    args = ["--model", job.model, "--warmup", str(opts.warmup), "--steps", str(steps),
            "--timing-out", str(run_dir / f"timing_{tag}_rank{{rank}}.json")]
    if opts.batch_size:
        args += ["--batch-size", str(opts.batch_size)]
    if profiled:
        args += ["--active", str(opts.active), "--profile-dir", str(run_dir / "trace")]
    return args


def recorder_truth_args(job: Job, opts: argparse.Namespace, run_dir: Path, tag: str) -> list[str]:
    """Arguments of ``ddp_recorder.py`` / ``hvd_recorder.py`` for a ground-truth run (recorder off)."""
    args = ["--model", job.model, "--steps", str(opts.warmup + opts.timed), "--timing-skip", str(opts.warmup),
            "--timing-out", str(run_dir / f"timing_{tag}_rank{{rank}}.json")]
    if opts.batch_size:
        args += ["--batch-size", str(opts.batch_size)]
    return args


def horovodrun_command(job: Job, opts: argparse.Namespace, script: Path, args: list[str],
                       net: NetnsCluster | None = None) -> list[str]:
    """One command launching all ranks (gloo): ``horovodrun`` on loopback, or, with the
    job's namespaces up, ``hvd_netns.py`` (one rank per namespace)."""
    if net is not None:
        return [opts.python, str(HVD_NETNS_SCRIPT), "--np", str(job.world), "--existing", "--",
                opts.python, str(script), *args]
    hvdrun = str(Path(opts.python).parent / "horovodrun")
    return [hvdrun, "-np", str(job.world), "--gloo", "-H", f"localhost:{job.world}", opts.python, str(script), *args]


def dpro_profile_command(job: Job, opts: argparse.Namespace, run_dir: Path, net: NetnsCluster | None = None) -> list[str]:
    """The profiled Horovod run: the two-line recorder under ``dpro profile`` (trace in run_dir/trace)."""
    args = ["--model", job.model, "--steps", str(opts.warmup + opts.active + 1)]
    if opts.batch_size:
        args += ["--batch-size", str(opts.batch_size)]
    return [opts.python, "-m", "dpro.cli", "profile", "-o", str(run_dir / "trace"), "--force",
            "--warmup", str(opts.warmup), "--steps", str(opts.active), "--",
            *horovodrun_command(job, opts, HVD_RECORDER_SCRIPT, args, net)]


def torchrun_command(job: Job, opts: argparse.Namespace, port: int, args: list[str],
                     script: Path = TRAIN_SCRIPT) -> list[str]:
    """One ``torchrun`` command launching all ranks over loopback."""
    torchrun = str(Path(opts.python).parent / "torchrun")
    return [torchrun, "--nproc_per_node", str(job.world), "--master_addr", "127.0.0.1",
            "--master_port", str(port), str(script), *args]


def ddp_recorder_commands(job: Job, opts: argparse.Namespace, run_dir: Path, port: int,
                          net: NetnsCluster | None) -> list[list[str]]:
    """The profiled DDP run with dpro's two-line recorder (``--ddp-recorder``).

    Loopback: ``dpro profile -- torchrun ... ddp_recorder.py`` (trace in run_dir/trace).
    Capped: one command per namespace with the environment ``dpro profile`` would set (the
    ranks write to run_dir/recorder_raw); :func:`collect_recorder_raw` merges it afterwards."""
    args = ["--model", job.model, "--steps", str(opts.warmup + opts.active + 1)]
    if opts.batch_size:
        args += ["--batch-size", str(opts.batch_size)]
    if net is None:
        return [[opts.python, "-m", "dpro.cli", "profile", "-o", str(run_dir / "trace"), "--force",
                 "--warmup", str(opts.warmup), "--steps", str(opts.active), "--",
                 *torchrun_command(job, opts, port, args, DDP_RECORDER_SCRIPT)]]
    env = [f"DPRO_TRACE_DIR={run_dir / 'recorder_raw'}", f"DPRO_WARMUP={opts.warmup}", f"DPRO_STEPS={opts.active}"]
    return [net.exec_prefix(r) + ["env", *net.env_assignments(r, port), *env, opts.python,
                                  str(DDP_RECORDER_SCRIPT), *args] for r in range(net.n)]


def collect_recorder_raw(opts: argparse.Namespace, run_dir: Path, log: Logger) -> str | None:
    """``dpro collect`` of what the namespaced ranks recorded; an error message or None."""
    cmd = [opts.python, "-m", "dpro.cli", "collect", str(run_dir / "recorder_raw"), "-o", str(run_dir / "trace"),
           "--force"]
    log("$ " + " ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.replay_timeout)
    return None if r.returncode == 0 else f"dpro collect failed: {(r.stdout + r.stderr).strip()[-500:]}"


def netns_commands(net: NetnsCluster, opts: argparse.Namespace, port: int,
                   args: list[str]) -> list[list[str]]:
    """One ``ip netns exec ... env RANK=.. python train_ddp.py`` command per rank."""
    return [net.exec_prefix(r) + ["env", *net.env_assignments(r, port), opts.python,
                                  str(TRAIN_SCRIPT), *args] for r in range(net.n)]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group we started ``proc`` in (it has its own session)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def run_processes(cmds: list[list[str]], log_dir: Path, timeout_s: float, log: Logger) -> str | None:
    """Start all commands, wait for all; return an error string or None if all exited 0.

    If one fails or the timeout passes, the others are killed (no hung gloo peers).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    try:
        for i, cmd in enumerate(cmds):
            log("$ " + " ".join(cmd))
            out = (log_dir / f"proc{i}.log").open("w")
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, cwd=REPO, start_new_session=True))
            out.close()
        return _wait_all(procs, log_dir, time.monotonic() + timeout_s)
    finally:
        for p in procs:
            kill_group(p)


def _wait_all(procs: list[subprocess.Popen], log_dir: Path, deadline: float) -> str | None:
    """Poll until all exit 0, one fails, or ``deadline``; return an error or None."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            i = failed[0]
            return f"process {i} exited {codes[i]}: {_tail(log_dir / f'proc{i}.log')}"
        if all(c == 0 for c in codes):
            return None
        if time.monotonic() > deadline:
            return f"timed out; see {log_dir}"
        time.sleep(0.2)


def _tail(path: Path, n: int = 3) -> str:
    """Last ``n`` non-empty lines of a log, joined."""
    try:
        lines = [l for l in path.read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return "?"
    return " | ".join(lines[-n:])


class CpuMeter:
    """CPU time used on the machine since creation by processes other than our children."""

    def __init__(self) -> None:
        self.t0, self.busy0, self.own0 = time.monotonic(), _busy_cpu_s(), _children_cpu_s()

    def foreign_pct(self) -> float | None:
        """Foreign CPU time as % of all cores' wall time; None if /proc/stat is unreadable.

        Children count once they have been waited for (all have, when a run returns).
        """
        busy = _busy_cpu_s()
        if busy is None or self.busy0 is None:
            return None
        wall = (time.monotonic() - self.t0) * (os.cpu_count() or 1)
        foreign = (busy - self.busy0) - (_children_cpu_s() - self.own0)
        return max(0.0, 100.0 * foreign / wall) if wall > 0 else None


def wait_for_quiet(max_wait_s: float, threshold_pct: float, log: Logger) -> float | None:
    """Wait (at most ``max_wait_s``) until the machine's CPU use over 2 s is below the threshold.

    Called between runs, when none of our processes is running, so all CPU use is foreign.
    Returns the last measured use in % of all cores (None if /proc/stat is unreadable).
    """
    deadline = time.monotonic() + max_wait_s
    while True:
        b0, t0 = _busy_cpu_s(), time.monotonic()
        time.sleep(2.0)
        b1 = _busy_cpu_s()
        if b0 is None or b1 is None:
            return None
        pct = 100.0 * (b1 - b0) / ((time.monotonic() - t0) * (os.cpu_count() or 1))
        if pct < threshold_pct or time.monotonic() >= deadline:
            log(f"# machine CPU use {pct:.0f}% of all cores" + ("" if pct < threshold_pct else " (gave up waiting)"))
            return pct
        log(f"# machine busy ({pct:.0f}% of all cores), waiting")


def _busy_cpu_s() -> float | None:
    """Non-idle CPU seconds of the whole machine: user+nice+system.

    irq/softirq time is left out: packet processing for our own ranks' traffic (veth, tbf,
    loopback) is accounted there and not in any process's rusage.
    """
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    user, nice, system = (int(x) for x in fields[1:4])
    return (user + nice + system) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    """User+system CPU seconds of our waited-for descendants."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def launch(job: Job, opts: argparse.Namespace, net: NetnsCluster | None, ports: PortAllocator,
           run_dir: Path, tag: str, log: Logger) -> RunResult:
    """Run the training script once for ``job`` and collect every rank's timing file.

    ``tag`` is ``profiled`` for the profiled run, else e.g. ``unprofiled0``.
    """
    profiled = tag == "profiled"
    args = train_args(job, opts, run_dir, tag, profiled)
    port = ports.take()
    recorder = job.horovod or (opts.ddp_recorder and profiled)  # profiled by dpro's recorder
    if job.horovod:
        # ground truth: the profiled script itself with the recorder off, timed by itself
        cmds = [dpro_profile_command(job, opts, run_dir, net) if profiled
                else ["env", "DPRO_DISABLE=1", *horovodrun_command(job, opts, HVD_RECORDER_SCRIPT,
                                                                   recorder_truth_args(job, opts, run_dir, tag), net)]]
    elif recorder:
        shutil.rmtree(run_dir / "recorder_raw", ignore_errors=True)
        cmds = ddp_recorder_commands(job, opts, run_dir, port, net)
    elif opts.ddp_recorder:  # ground truth: the same script, recorder off, timed by itself
        targs = recorder_truth_args(job, opts, run_dir, tag)
        if net is None:
            cmds = [["env", "DPRO_DISABLE=1", *torchrun_command(job, opts, port, targs, DDP_RECORDER_SCRIPT)]]
        else:
            cmds = [net.exec_prefix(r) + ["env", *net.env_assignments(r, port), "DPRO_DISABLE=1", opts.python,
                                          str(DDP_RECORDER_SCRIPT), *targs] for r in range(net.n)]
    else:
        cmds = [torchrun_command(job, opts, port, args)] if net is None else netns_commands(net, opts, port, args)
    if opts.wait_quiet > 0:
        wait_for_quiet(opts.wait_quiet, FOREIGN_CPU_WARN_PCT, log)
    t0, cpu0 = time.monotonic(), CpuMeter()
    err = run_processes(cmds, run_dir / f"logs_{tag}", opts.run_timeout, log)
    if err is None and recorder and not job.horovod and net is not None:
        err = collect_recorder_raw(opts, run_dir, log)
    res = RunResult(ok=err is None, wall_s=time.monotonic() - t0, commands=cmds, error=err,
                    foreign_cpu_pct=cpu0.foreign_pct())
    if res.ok and not (recorder and profiled):  # the recorder writes no timing file
        try:
            res.timings = [json.loads((run_dir / f"timing_{tag}_rank{r}.json").read_text())
                           for r in range(job.world)]
        except (OSError, ValueError) as e:
            res.ok, res.error = False, f"timing files: {e}"
    return res


# ----------------------------------------------------------------------------- metrics


def per_step_mean(timings: list[dict[str, Any]], subtract_profiler: bool) -> list[float]:
    """Per-step duration (us), mean over the ranks, optionally minus ``prof.step()`` time."""
    per_rank = []
    for t in timings:
        steps = t["step_us"]
        if subtract_profiler:
            steps = [s - p for s, p in zip(steps, t["profiler_us"])]
        per_rank.append(steps)
    return [sum(vals) / len(vals) for vals in zip(*per_rank)]


def ground_truth_us(runs: list[RunResult]) -> tuple[float, list[float], list[float]]:
    """Median over the timed steps of all unprofiled runs of the step time (mean over ranks).

    Returns (median, all steps, each run's own median), us.
    """
    per_run = [per_step_mean(r.timings, subtract_profiler=False) for r in runs]
    steps = [s for run in per_run for s in run]
    return statistics.median(steps), steps, [statistics.median(run) for run in per_run]


def iqr_pct(values: list[float]) -> float | None:
    """Inter-quartile range as % of the median (None for fewer than 4 values)."""
    if len(values) < 4:
        return None
    q1, _, q3 = statistics.quantiles(values, n=4)
    return 100.0 * (q3 - q1) / statistics.median(values)


def profiled_us(run: RunResult) -> tuple[float, list[float]]:
    """Median over the traced (active) steps, profiler bookkeeping excluded."""
    lo, hi = run.timings[0]["active_steps"]
    steps = per_step_mean(run.timings, subtract_profiler=True)[lo:hi]
    return statistics.median(steps), steps


# ----------------------------------------------------------------------------- replay


def replay(trace_dir: Path, opts: argparse.Namespace, log: Logger) -> tuple[dict[str, Any] | None, str | None]:
    """Run dpro's replay CLI on ``trace_dir``; return (its JSON, None) or (None, why not)."""
    cmd = [opts.python, "-m", "dpro.cli", "replay", str(trace_dir), "--json"]
    log("$ " + " ".join(cmd))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env,
                              timeout=opts.replay_timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"replay timed out after {opts.replay_timeout}s"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"replay exited {proc.returncode}: {last}"
    doc = _parse_json(proc.stdout)
    if doc is None:
        return None, "replay printed no JSON object"
    return doc, None


def _parse_json(text: str) -> dict[str, Any] | None:
    """The JSON object on stdout: the whole text, else its last line that parses as one."""
    candidates = [text] + list(reversed(text.strip().splitlines()))
    for cand in candidates:
        try:
            doc = json.loads(cand)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc
    return None


def _number(doc: dict[str, Any], key: str) -> float | None:
    """``doc[key]`` as a float, or None if absent / not a number."""
    val = doc.get(key)
    return float(val) if isinstance(val, (int, float)) and not isinstance(val, bool) else None


# ----------------------------------------------------------------------------- one job


def run_job(job: Job, opts: argparse.Namespace, ports: PortAllocator, log: Logger) -> JobResult:
    """Ground-truth run, profiled run, replay, for one job."""
    res = JobResult(job=job.name, model=job.model, ranks=job.world, cap_mbit=job.cap_mbit)
    run_dir = Path(opts.out) / job.name
    run_dir.mkdir(parents=True, exist_ok=True)
    _clear_previous(run_dir)
    t0 = time.monotonic()
    try:
        truths, prof = _run_all_launches(job, opts, ports, run_dir, log)
    except Exception as e:  # noqa: BLE001 - e.g. namespace setup failed: report, go on
        res.run_error = f"{type(e).__name__}: {e}"
        res.wall_s = time.monotonic() - t0
        return res
    launches = truths[:1] + [prof] + truths[1:]
    res.commands = [c for run in launches for c in run.commands]
    res.foreign_cpu_pct = [run.foreign_cpu_pct for run in launches]
    used = _truth_runs_to_use(truths)
    res.truth_runs_used = [i for i, t in enumerate(truths) if any(t is u for u in used)]
    if used:
        measured, steps, medians = ground_truth_us(used)
        res.measured_ms, res.measured_steps_ms = measured / 1e3, [s / 1e3 for s in steps]
        res.measured_run_medians_ms = [m / 1e3 for m in medians]
        res.noise_pct = iqr_pct(steps)
    if prof.ok:
        res.trace_dir = str(run_dir / "trace")
        if prof.timings:
            p, steps = profiled_us(prof)
            res.profiled_ms, res.profiled_steps_ms = p / 1e3, [s / 1e3 for s in steps]
        _fill_replay(res, Path(res.trace_dir), opts, log)
        if res.profiled_ms is None:  # profiled by dpro's recorder (Horovod, --ddp-recorder): the trace's steps
            res.profiled_ms = res.trace_ms
    if res.measured_ms and res.profiled_ms:
        res.overhead_pct = 100.0 * (res.profiled_ms / res.measured_ms - 1.0)
    busy = [r.foreign_cpu_pct for r in used + [prof] if r.ok and r.foreign_cpu_pct is not None]
    res.used_foreign_cpu_pct = max(busy) if busy else None
    errors = [run.error for run in launches if run.error]
    res.run_error = "; ".join(errors) or None
    res.wall_s = time.monotonic() - t0
    return res


def _is_quiet(run: RunResult) -> bool:
    """Whether other processes used at most FOREIGN_CPU_WARN_PCT of the CPUs during ``run``."""
    return run.foreign_cpu_pct is not None and run.foreign_cpu_pct <= FOREIGN_CPU_WARN_PCT


def _truth_runs_to_use(truths: list[RunResult]) -> list[RunResult]:
    """The successful ground-truth runs; only the quiet ones if there are any."""
    good = [t for t in truths if t.ok]
    quiet = [t for t in good if _is_quiet(t)]
    return quiet or good


def _clear_previous(run_dir: Path) -> None:
    """Remove timing files and traces of an earlier harness run of the same job."""
    for pattern in ("timing_*.json", "trace/rank*.json.gz", "logs_*/proc*.log"):
        for p in run_dir.glob(pattern):
            p.unlink()


def _run_all_launches(job: Job, opts: argparse.Namespace, ports: PortAllocator, run_dir: Path,
                      log: Logger) -> tuple[list[RunResult], RunResult]:
    """Ground-truth runs around the profiled run (inside namespaces if the job is capped).

    Order: unprofiled0, profiled, unprofiled1, unprofiled2, ...
    """
    if job.cap_mbit is None:
        return _launch_sequence(job, opts, None, ports, run_dir, log)
    with NetnsCluster(job.world, job.cap_mbit, log) as net:
        log(f"# {net.describe()} ({' '.join(tbf_args(job.cap_mbit))})")
        return _launch_sequence(job, opts, net, ports, run_dir, log)


def _launch_sequence(job: Job, opts: argparse.Namespace, net: NetnsCluster | None,
                     ports: PortAllocator, run_dir: Path, log: Logger) -> tuple[list[RunResult], RunResult]:
    """See :func:`_run_all_launches`."""
    truths = [launch(job, opts, net, ports, run_dir, "unprofiled0", log)]
    prof = launch(job, opts, net, ports, run_dir, "profiled", log)
    truths += [launch(job, opts, net, ports, run_dir, f"unprofiled{k}", log)
               for k in range(1, opts.truth_runs)]
    return truths, prof


def _fill_replay(res: JobResult, trace_dir: Path, opts: argparse.Namespace, log: Logger) -> None:
    """Run the replay and fill predicted/trace/error columns (or record why not)."""
    if opts.no_replay:
        res.replay_error = "skipped (--no-replay)"
        return
    doc, err = replay(trace_dir, opts, log)
    if doc is None:
        res.replay_error = err
        return
    pred, meas = _number(doc, "predicted_iteration_us"), _number(doc, "measured_iteration_us")
    res.predicted_ms = pred / 1e3 if pred is not None else None
    res.trace_ms = meas / 1e3 if meas is not None else None
    if pred is None:
        res.replay_error = "replay JSON has no numeric predicted_iteration_us"
    if res.predicted_ms is not None and res.measured_ms:
        res.error_pct = 100.0 * (res.predicted_ms / res.measured_ms - 1.0)
    unprof = _number(doc, "predicted_unprofiled_iteration_us")
    if unprof is None and "predicted_unprofiled_iteration_us" in doc:
        unprof = pred  # the recorder measured no overhead: nothing removed
    if unprof is not None:
        res.predicted_unprofiled_ms = unprof / 1e3
        if res.measured_ms:
            res.error_unprofiled_pct = 100.0 * (res.predicted_unprofiled_ms / res.measured_ms - 1.0)


# ----------------------------------------------------------------------------- output

COLUMNS = (("job", 21), ("ranks", 5), ("cap", 9), ("measured ms", 11), ("noise %", 7),
           ("trace ms", 9), ("predicted ms", 12), ("error %", 8), ("prof ovh %", 10),
           ("pred-ovh ms", 11), ("error %", 8))


def _fmt(val: float | None, signed: bool = False) -> str:
    """Number for the table, ``n/a`` if missing."""
    if val is None:
        return "n/a"
    return f"{val:+.1f}" if signed else f"{val:.1f}"


def table_row(r: JobResult) -> list[str]:
    """One row of the table."""
    cap = "loopback" if r.cap_mbit is None else f"{r.cap_mbit:g}Mbit"
    return [r.job, str(r.ranks), cap, _fmt(r.measured_ms), _fmt(r.noise_pct), _fmt(r.trace_ms),
            _fmt(r.predicted_ms),
            _fmt(r.error_pct, signed=True), _fmt(r.overhead_pct, signed=True),
            _fmt(r.predicted_unprofiled_ms), _fmt(r.error_unprofiled_pct, signed=True)]


def _foreign_load_note(r: JobResult) -> str | None:
    """A warning if other processes used much CPU during the runs ``r``'s numbers come from."""
    busy = r.used_foreign_cpu_pct
    if busy is None or busy <= FOREIGN_CPU_WARN_PCT:
        return None
    return f"other processes used up to {busy:.0f}% of all CPUs during its runs (timings unreliable)"


def format_table(results: Sequence[JobResult]) -> str:
    """The results as a fixed-width text table (plus one line per failure)."""
    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, (_, w)) in enumerate(zip(cells, COLUMNS)))

    rows = [line([name for name, _ in COLUMNS]), line(["-" * w for _, w in COLUMNS])]
    rows += [line(table_row(r)) for r in results]
    notes = [f"  {r.job}: {msg}" for r in results for msg in (r.run_error, r.replay_error) if msg]
    notes += [f"  {r.job}: {note}" for r in results if (note := _foreign_load_note(r))]
    return "\n".join(rows + (["notes:"] + notes if notes else []))


def write_json(path: Path, results: Sequence[JobResult], opts: argparse.Namespace) -> None:
    """The same results plus method and settings, as JSON."""
    doc = {
        "method": {
            "measured": "median over the timed steps of the unprofiled runs used (the quiet ones, "
                        "if any) of each step's time, mean over the ranks",
            "noise_pct": "100 * inter-quartile range / median of those steps",
            "profiled": "same over the traced (active) steps of the profiled run, minus time in prof.step()",
            "error_pct": "100 * (predicted / measured - 1)",
            "overhead_pct": "100 * (profiled / measured - 1)",
            "trace_ms": "dpro's measured_iteration_us (read from the trace)",
            "predicted_unprofiled_ms": "dpro's predicted_unprofiled_iteration_us: the recorder's measured "
                                       "overhead removed (recorder traces; torch.profiler traces have none)",
        },
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()},
        "host": {"cpus": os.cpu_count(), "uname": " ".join(os.uname())},
        "results": [asdict(r) for r in results],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


# ----------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_JOBS)}")
    p.add_argument("--jobs", help="comma-separated glob patterns of job names (see --list)")
    p.add_argument("--list", action="store_true", help="print the job names and exit")
    p.add_argument("--out", type=Path, default=Path("/tmp/dpro-fidelity"), help="output folder")
    p.add_argument("--json-out", type=Path, default=None, help="results JSON (default OUT/results.json)")
    p.add_argument("--cap-mbit", type=float, default=None,
                   help=f"cap for capped jobs, all models (default per model: {DEFAULT_CAP_MBIT})")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before timing/profiling")
    p.add_argument("--timed", type=int, default=10, help="timed steps per unprofiled run")
    p.add_argument("--truth-runs", type=int, default=2,
                   help="unprofiled runs per job (first before, the others after the profiled run)")
    p.add_argument("--active", type=int, default=5, help="profiled steps")
    p.add_argument("--batch-size", type=int, default=None, help="per-rank batch (default: per model)")
    p.add_argument("--base-port", type=int, default=29650, help="first MASTER_PORT")
    p.add_argument("--run-timeout", type=float, default=300.0, help="seconds per training run")
    p.add_argument("--replay-timeout", type=float, default=600.0, help="seconds per replay")
    p.add_argument("--no-replay", action="store_true", help="do not call dpro")
    p.add_argument("--ddp-recorder", action="store_true",
                   help="DDP jobs run examples/pytorch/ddp_recorder.py: profiled by dpro's two-line recorder under "
                        "dpro profile, ground truth with the recorder off (DPRO_DISABLE=1), timed by the script; "
                        "default: train_ddp.py and its own torch.profiler")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                   help=f"before each run wait up to S seconds for other processes to use < "
                        f"{FOREIGN_CPU_WARN_PCT:g}%% of the CPUs (default 0: do not wait)")
    p.add_argument("--python", default=DEFAULT_PYTHON if Path(DEFAULT_PYTHON).exists() else sys.executable)
    p.add_argument("-v", "--verbose", action="store_true", help="print every command run")
    opts = p.parse_args(argv)
    if opts.truth_runs < 1 or opts.timed < 1 or opts.active < 1 or opts.warmup < 1:
        p.error("--truth-runs, --timed, --active and --warmup must be >= 1")
    return opts


def main(argv: list[str] | None = None) -> int:
    """Run the selected jobs.

    Exit status: 0 ok, 1 a training run failed (replay ``n/a`` is not a failure), 2 bad
    usage, 130 interrupted (the finished jobs are still reported).
    """
    opts = parse_args(argv)
    jobs = select_jobs(build_matrix(opts.cap_mbit), opts.quick, opts.jobs)
    if opts.list:
        print("\n".join(j.name for j in jobs))
        return 0
    if not jobs:
        print("no job matches", file=sys.stderr)
        return 2
    if os.geteuid() != 0 and any(j.cap_mbit is not None for j in jobs):
        print("capped jobs need root (network namespaces); run as root or --jobs '*nocap'", file=sys.stderr)
        return 2
    log: Logger = (lambda s: print(s, flush=True)) if opts.verbose else (lambda s: None)
    results, interrupted = run_all(jobs, opts, log)
    print(format_table(results))
    json_out = opts.json_out or opts.out / "results.json"
    write_json(json_out, results, opts)
    print(f"wrote {json_out}")
    if interrupted:
        return 130
    return 1 if any(r.measured_ms is None or r.profiled_ms is None for r in results) else 0


def run_all(jobs: list[Job], opts: argparse.Namespace, log: Logger) -> tuple[list[JobResult], bool]:
    """Run jobs in order; return (results, interrupted).

    SIGTERM/SIGHUP/Ctrl-C stop early: the running job's processes are killed, its namespaces
    removed, and the jobs finished so far returned.
    """
    ports = PortAllocator(opts.base_port)
    results: list[JobResult] = []
    old = install_teardown_signals()
    try:
        for i, job in enumerate(jobs, 1):
            print(f"[{i}/{len(jobs)}] {job.name} ...", flush=True)
            r = run_job(job, opts, ports, log)
            results.append(r)
            print(f"    measured {_fmt(r.measured_ms)} ms, profiled {_fmt(r.profiled_ms)} ms, "
                  f"predicted {_fmt(r.predicted_ms)} ms ({r.wall_s:.0f} s)", flush=True)
    except KeyboardInterrupt as e:
        print(f"interrupted ({e or 'Ctrl-C'}); reporting {len(results)} finished job(s)", file=sys.stderr)
        return results, True
    finally:
        restore_signals(old)
    return results, False


if __name__ == "__main__":
    sys.exit(main())
