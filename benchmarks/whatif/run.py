"""What-if validation: predicted vs measured step time of real DDP or Horovod (gloo) jobs at other scales.

For each profile size P (default 1 and 2 workers) the job is profiled at P ranks:
``examples/pytorch/train_ddp.py --model MODEL`` with torch.profiler (torchrun), or with
``--framework horovod`` ``examples/pytorch/hvd_recorder.py`` under ``dpro profile`` and
horovodrun; ``dpro whatif TRACE --workers 2,3,4 --json`` predicts each target scale (a
1-worker profile has no collective to fit: it gets ``--platform`` from ``dpro calibrate``,
run once here, for Horovod ``dpro calibrate --backend horovod --pin``, Horovod's own
all-reduce, unless ``--torch-calibration``; every prediction gets ``--host-cores`` and the
torch calibration's CPU cost of the collectives, ``--cpu-cost``); then every target is run UNPROFILED and timed by the
training script itself (``--timing-out``: ``time.perf_counter()``, mean over the ranks,
median over the timed steps of ``--truth-runs`` runs, half before and half after the
profiles) -- the harness trusts nothing dpro says about the measured side.
``foreign_cpu_pct`` is the CPU time other processes used during each measured run
(benchmarks/fidelity/run.py's meter): other work on a shared machine. The jobs run
boosted (boost.py: their autogroups before other sessions').

Usage::

    python benchmarks/whatif/run.py [--model mlp] [--profiles 1,2] [--targets 2,3,4] [--out /tmp/dpro-whatif]
    python benchmarks/whatif/run.py --cap-mbit 500                       # in namespaces, capped (root)
    python benchmarks/whatif/run.py --profiles '' --bandwidth-case 1000:200,500
    python benchmarks/whatif/run.py --framework horovod [--cap-mbit 500]
    python benchmarks/whatif/run.py --truth-runs 6 --profile-runs 3   # every size profiled 3 times: median prediction
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
TRAIN = ROOT / "examples" / "pytorch" / "train_ddp.py"
HVD_TRAIN = ROOT / "examples" / "pytorch" / "hvd_recorder.py"
HVD_NETNS = ROOT / "benchmarks" / "fidelity" / "hvd_netns.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
import jobenv  # noqa: E402  (the jobs' thread and pinning settings, shared with the other harnesses)


def _fidelity():
    spec = importlib.util.spec_from_file_location("fidelity_run", ROOT / "benchmarks" / "fidelity" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fidelity_run"] = mod
    spec.loader.exec_module(mod)
    return mod


#: ``--job-setting``: one of jobenv.SETTINGS for every job, calibration included ("": the default below)
JOB_SETTING = ""
#: the default: jobenv.default_for's setting with glibc's mmap threshold fixed. Without it an
#: unprofiled run is one of two kinds (its gradient buffers on the heap, or mapped and faulted
#: in every step), a profiled one always the first, and the truth moves with the mix
#: (docs/whatif.md, session 30); with it the DDP truths reproduced to 0.5 % (session 31)
HEAP_DEFAULT = {"threads1": "threads1heap", "threads1pin": "threads1pinheap"}


def job_setting(path: str) -> jobenv.JobSettings:
    if JOB_SETTING:
        return jobenv.SETTINGS[JOB_SETTING]
    base = jobenv.default_for(path)
    return jobenv.SETTINGS[HEAP_DEFAULT.get(base.name, base.name)]


def launch(n: int, port: int, args: list[str], cap_mbit: float | None, fid, log_dir: Path,
           timeout: float = 900) -> None:
    """Run n ranks of train_ddp.py: torchrun over loopback, or (``cap_mbit``) one network
    namespace per rank with a tbf cap on its link (benchmarks/fidelity/netns.py; root);
    profiled and measured alike with ``job_setting("ddp")``."""
    os.environ["OMP_NUM_THREADS"] = "1"
    s = job_setting("ddp")
    if cap_mbit is None:
        cmds = [s.apply([PY, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "--master_addr",
                         "127.0.0.1", "--master_port", str(port), str(TRAIN), *args])]
        err = fid.run_processes(cmds, log_dir, timeout, lambda _: None)
    else:
        with fid.NetnsCluster(n, rate_mbit=cap_mbit) as net:
            cmds = [net.exec_prefix(r) + s.apply(["env", *net.env_assignments(r, port), PY, str(TRAIN), *args])
                    for r in range(n)]
            err = fid.run_processes(cmds, log_dir, timeout, lambda _: None)
    if err:
        raise RuntimeError(f"{n} ranks, cap {cap_mbit}: {err}")


def hvd_launch(n: int, args: list[str], cap_mbit: float | None, fid, log_dir: Path, profile_dir: Path | None = None,
               warmup: int = 0, active: int = 0, timeout: float = 900) -> None:
    """Run n ranks of hvd_recorder.py (Horovod, gloo): ``horovodrun`` over loopback, or
    (``cap_mbit``) one namespace per rank (benchmarks/fidelity/hvd_netns.py; root). With
    ``profile_dir`` the job runs under ``dpro profile`` (the recorder's trace), else with the
    recorder off (``DPRO_DISABLE=1``), timed by the script itself; both with
    ``job_setting("hvd")`` (one compute thread per process, each rank on core rank % cores)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["PYTHONPATH"] = str(ROOT)  # the ranks import this checkout's dpro (the recorder)

    def job(existing: bool) -> list[str]:
        ranks = [PY, str(HVD_TRAIN), *args]
        cmd = ([PY, str(HVD_NETNS), "--np", str(n), "--existing", "--", *ranks] if existing else
               [str(Path(PY).parent / "horovodrun"), "-np", str(n), "--gloo", "-H", f"localhost:{n}", *ranks])
        cmd = job_setting("hvd").apply(cmd)
        if profile_dir is None:
            return ["env", "DPRO_DISABLE=1", *cmd]
        return [PY, "-m", "dpro.cli", "profile", "-o", str(profile_dir), "--force", "--warmup", str(warmup),
                "--steps", str(active), "--", *cmd]

    if cap_mbit is None:
        err = fid.run_processes([job(False)], log_dir, timeout, lambda _: None)
    else:
        with fid.NetnsCluster(n, rate_mbit=cap_mbit):
            err = fid.run_processes([job(True)], log_dir, timeout, lambda _: None)
    if err:
        raise RuntimeError(f"horovod {n} ranks, cap {cap_mbit}: {err}")


def measure(n: int, model: str, out: Path, port: int, steps: int, warmup: int, fid, reuse: bool,
            cap_mbit: float | None = None, framework: str = "ddp") -> dict:
    """Unprofiled run of n ranks: its steps (mean over ranks, µs), foreign CPU % and load."""
    out.mkdir(parents=True, exist_ok=True)
    if reuse and (out / "meta.json").exists():
        return json.loads((out / "meta.json").read_text())
    meter = fid.CpuMeter()
    if framework == "horovod":
        hvd_launch(n, ["--model", model, "--steps", str(steps), "--timing-skip", str(warmup),
                       "--timing-out", str(out / "t{rank}.json")], cap_mbit, fid, out / "logs")
    else:
        launch(n, port, ["--model", model, "--steps", str(steps), "--warmup", str(warmup),
                         "--timing-out", str(out / "t{rank}.json")], cap_mbit, fid, out / "logs")
    per_rank = [json.loads((out / f"t{r}.json").read_text())["step_us"] for r in range(n)]
    res = {"steps_us": [sum(v) / len(v) for v in zip(*per_rank)], "foreign_cpu_pct": meter.foreign_pct() or 0.0,
           "load_avg_1m": os.getloadavg()[0]}
    (out / "meta.json").write_text(json.dumps(res))
    return res


def combine(runs: list[dict]) -> dict:
    """Ground truth over several runs: the median step (each step the mean over the ranks),
    its inter-quartile range in % (noise), the spread of the runs' own medians in %
    (repeat), the runs' mean foreign CPU % and load."""
    steps = [x for r in runs for x in r["steps_us"]]
    q = statistics.quantiles(steps, n=4)
    med = statistics.median(steps)
    per_run = [statistics.median(r["steps_us"]) for r in runs]
    return {"measured_us": med, "noise_pct": 100 * (q[2] - q[0]) / med, "run_medians_us": per_run,
            "repeat_pct": 100 * (max(per_run) - min(per_run)) / med,
            "foreign_cpu_pct": statistics.mean(r["foreign_cpu_pct"] for r in runs),
            "load_avg_1m": statistics.mean(r["load_avg_1m"] for r in runs)}


def dpro(*args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([PY, "-m", "dpro.cli", *args], capture_output=True, text=True, env=env, timeout=900)
    if p.returncode:
        raise RuntimeError(f"dpro {' '.join(args)}: {p.stderr.strip()}")
    return json.loads(p.stdout) if "--json" in args else {}


def profile(p: int, o, port: int, fid, tdir: Path, cap_mbit: float | None) -> None:
    if o.reuse and tdir.exists():
        return
    if o.framework == "horovod":
        hvd_launch(p, ["--model", o.model, "--steps", str(o.warmup + o.active + 1)], cap_mbit, fid,
                   tdir.parent / f"{tdir.name}_logs", profile_dir=tdir, warmup=o.warmup, active=o.active)
    else:
        launch(p, port, ["--model", o.model, "--steps", str(o.warmup + o.active + 1), "--warmup", str(o.warmup),
                         "--profile-dir", str(tdir), "--active", str(o.active)], cap_mbit, fid, tdir.parent / f"{tdir.name}_logs")


def row(o, network: str, p: int, n: int, pt: dict, pred: dict, truth: dict) -> dict:
    m = truth["measured_us"]
    return {"framework": o.framework, "model": o.model, "network": network, "profiled_workers": p, "workers": n,
            "predicted_us": pt["iteration_us"], **truth, "error_pct": 100 * (pt["iteration_us"] - m) / m,
            "transfer": pred["transfer"], "profile_measured_us": pred["measured_iteration_us"]}


def median_row(o, network: str, p: int, per_profile: list[tuple[dict, dict]], runs: dict[int, list[dict]]) -> dict:
    """The row of one target from several profiles: the profile whose prediction is the median
    (the lower middle one of an even count), with every profile's prediction listed."""
    ranked = sorted(per_profile, key=lambda x: x[0]["iteration_us"])
    pt, pred = ranked[(len(ranked) - 1) // 2]
    n = pt["workers"]
    return {**row(o, network, p, n, pt, pred, combine(runs[n])),
            "profile_predictions_us": [x[0]["iteration_us"] for x in per_profile],
            "profiles_measured_us": [x[1]["measured_iteration_us"] for x in per_profile]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--framework", choices=["ddp", "horovod"], default="ddp",
                    help="ddp: train_ddp.py under torchrun; horovod: hvd_recorder.py under horovodrun "
                         "(profiled by dpro profile, measured with the recorder off)")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--profiles", default="1,2", help="profile sizes (workers); empty: none")
    ap.add_argument("--targets", default="2,3,4")
    ap.add_argument("--cap-mbit", type=float, default=None,
                    help="run profiles and targets in network namespaces under this tbf cap (root)")
    ap.add_argument("--bandwidth-case", default=None, metavar="PROF:T1,T2",
                    help="also profile 2 workers capped at PROF Mbit/s and predict 2 workers at T1, T2 Mbit/s")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--truth-runs", type=int, default=2,
                    help="unprofiled runs of every target, half before and half after the profiles")
    ap.add_argument("--active", type=int, default=10, help="profiled steps (a profile of a few steps is noisy here)")
    ap.add_argument("--profile-runs", type=int, default=1,
                    help="profile every size this many times (interleaved) and predict with the median prediction "
                         "per target: one run of a loopback job stands for a phase of the machine")
    ap.add_argument("--out", type=Path, default=Path("/tmp/dpro-whatif"))
    ap.add_argument("--port", type=int, default=29900)
    ap.add_argument("--reuse", action="store_true", help="keep the measurements and profiles already in OUT")
    ap.add_argument("--torch-calibration", action="store_true",
                    help="--framework horovod: calibrate torch.distributed's gloo all-reduce, not Horovod's")
    ap.add_argument("--host-cores", type=int, default=os.cpu_count(),
                    help="passed to dpro whatif: the ranks share this host's cores (default: all of them)")
    ap.add_argument("--job-setting", default="", choices=["", *jobenv.SETTINGS],
                    help="every job (and the calibration: its environment) with this benchmarks/jobenv.py setting; "
                         "default: jobenv.default_for(framework) with glibc's mmap threshold fixed (threads1heap for "
                         "DDP, threads1pinheap for Horovod)")
    o = ap.parse_args()
    global JOB_SETTING
    JOB_SETTING = o.job_setting
    os.environ.update(job_setting("ddp").env())  # the calibration's processes inherit it
    fid = _fidelity()
    o.out.mkdir(parents=True, exist_ok=True)
    port = o.port
    plat = o.out / "platform.json"
    if not plat.exists():
        dpro("calibrate", "-o", str(plat))
    link = plat  # the 1-worker profile's --platform
    if o.framework == "horovod" and not o.torch_calibration:
        # Horovod's own all-reduce (its cycle, negotiation and fusion buffer; with computation beside it),
        # pinned as its jobs run; the CPU cost stays torch's (Horovod's calls poll: CPU = wall)
        link = o.out / "platform-horovod.json"
        if not link.exists():
            pin = ["--pin"] if job_setting("hvd").pin else []
            dpro("calibrate", "--backend", "horovod", *pin, "-o", str(link))
    net = "loopback" if o.cap_mbit is None else f"{o.cap_mbit:g} Mbit/s"
    sub = o.out / ("loopback" if o.cap_mbit is None else f"cap{o.cap_mbit:g}")
    common = ["--host-cores", str(o.host_cores)]
    if job_setting("hvd" if o.framework == "horovod" else "ddp").pin:
        common.append("--pinned")  # each rank bound to core rank % cores (jobenv)
    if "cpu_alpha_us" in json.loads(plat.read_text()).get("allreduce", {}):
        common += ["--cpu-cost", str(plat)]  # the collectives' CPU, measured by dpro calibrate
    rows = []
    profiles = [int(x) for x in o.profiles.split(",") if x.strip()]
    if profiles:
        targets = [int(x) for x in o.targets.split(",")]
        runs: dict[int, list[dict]] = {n: [] for n in targets}

        def truths(k: int) -> None:  # one unprofiled run of every target
            nonlocal port
            for n in targets:
                port += 1
                runs[n].append(measure(n, o.model, sub / f"truth{n}_{k}", port, o.steps, o.warmup, fid, o.reuse,
                                       o.cap_mbit, o.framework))

        for k in range(o.truth_runs // 2):  # before and after the profiles: slow drifts hit both sides
            truths(k)
        preds: dict[int, list[dict]] = {p: [] for p in profiles}
        for i in range(o.profile_runs):
            for p in profiles:
                port += 1
                tdir = sub / (f"profile{p}" if o.profile_runs == 1 else f"profile{p}_{i}")
                profile(p, o, port, fid, tdir, o.cap_mbit)
                extra = ["--platform", str(link)] if p == 1 else []
                if p == 1 and o.cap_mbit is not None:
                    extra += ["--bandwidth", f"{o.cap_mbit:g}Mbit"]
                preds[p].append(dpro("whatif", str(tdir), "--workers", o.targets, "--json", *extra, *common))
        for k in range(o.truth_runs // 2, o.truth_runs):
            truths(k)
        for p, plist in preds.items():
            for j in range(len(plist[0]["scaling"])):
                rows.append(median_row(o, net, p, [(pl["scaling"][j], pl) for pl in plist], runs))
    if o.bandwidth_case:
        prof, _, tgts = o.bandwidth_case.partition(":")
        port += 1
        tdir = o.out / f"bw_profile{prof}"
        profile(2, o, port, fid, tdir, float(prof))
        for t in [float(x) for x in tgts.split(",")]:
            port += 1
            tr = combine([measure(2, o.model, o.out / f"bw_truth{t:g}_{k}", port + k * 50, o.steps, o.warmup, fid,
                                  o.reuse, t, o.framework) for k in range(2)])
            pred = dpro("whatif", str(tdir), "--workers", "2", "--bandwidth", f"{t:g}Mbit",
                        "--profiled-bandwidth", f"{prof}Mbit", "--json", *common)
            rows.append(row(o, f"{prof}->{t:g} Mbit/s", 2, 2, pred["scaling"][0], pred, tr))
    print(f"{'case':36} {'pred ms':>9} {'meas ms':>9} {'err %':>7} {'noise %':>8} {'repeat %':>8} {'foreign %':>9} "
          f"{'profile ms':>10}")
    for r in rows:
        case = f"{'hvd ' if r['framework'] == 'horovod' else ''}{r['model']} {r['network']} P{r['profiled_workers']}->N{r['workers']}"
        print(f"{case:36} {r['predicted_us'] / 1e3:9.2f} {r['measured_us'] / 1e3:9.2f} {r['error_pct']:+7.1f} "
              f"{r['noise_pct']:8.1f} {r['repeat_pct']:8.1f} {r['foreign_cpu_pct'] or 0:9.0f} "
              f"{r['profile_measured_us'] / 1e3:10.2f}" + (
                  "  profiles: " + " / ".join(f"{x / 1e3:.2f}" for x in r["profile_predictions_us"])
                  if len(r.get("profile_predictions_us", [])) > 1 else ""))
    errs = sorted(abs(r["error_pct"]) for r in rows)
    if errs:
        print(f"median |error| {statistics.median(errs):.1f}%, max {errs[-1]:.1f}% over {len(errs)} cases "
              f"(machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    name = "results" + ("" if o.cap_mbit is None else f"_cap{o.cap_mbit:g}") + ("" if profiles else "_bandwidth") + ".json"
    (o.out / name).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from boost import boosted

    with boosted() as on:  # the measured jobs before other sessions' work (autogroup nice)
        print(f"# measured jobs boosted: {'yes' if on else 'no'}", file=sys.stderr, flush=True)
        main()
