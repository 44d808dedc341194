"""Predicted vs measured peak memory of real 2-worker MXNet parameter-server jobs.

    .venv-mx/bin/python benchmarks/memory_fidelity_mxnet.py                # every config
    .venv-mx/bin/python benchmarks/memory_fidelity_mxnet.py --configs mlp-sgdm --json out.json

Each config is a Gluon model trained with ``dist_sync`` over ps-lite (scheduler, 1 server,
2 workers on loopback; ``examples/mxnet/launch_local.py``), run twice:

1. under ``dpro profile`` (the two-line recorder): ``dpro replay``'s schedule and
   :func:`dpro.replayer.memory.peak_memory` give the **predicted** peak per worker
   (static arrays read from the Gluon parameters and trainer, per-op changes from the
   storage counter of that run, see ``dpro/importers/mxnet/memory.py``);
2. without dpro, with ``mx.profiler`` recording *only* the storage counter
   (``profile_memory=True``, operators off), started right after the kvstore is created
   and before the model is built, so the counter holds every CPU storage byte MXNet
   allocated since: the **measured** live bytes. Measured peak = the counter's highest
   value over the steps dpro analysed; its lowest value there is printed too ("floor": the
   live bytes at the iteration's emptiest instant, which the prediction assumes are the
   static arrays). Peak RSS growth (``ru_maxrss`` minus the RSS before the model is built)
   is printed as a sanity bound.

The step makes its batch (as a data loader would), runs forward and backward under
``autograd.record()``, ``trainer.step`` (push/pull every parameter; the update runs on the
server: the optimizer state lives there) and ``mx.nd.waitall()``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).absolute().parents[1]
WARMUP, STEPS = 3, 5

#: name -> (model, optimizer, optimizer params, batch)
CONFIGS: dict[str, tuple[str, str, dict, int]] = {
    "mlp-sgdm": ("mlp", "sgd", {"learning_rate": 0.01, "momentum": 0.9}, 32),
    "conv-adam": ("conv", "adam", {"learning_rate": 0.001}, 64),
    "resnet-sgdm": ("resnet", "sgd", {"learning_rate": 0.01, "momentum": 0.9}, 32),
    "lstm-sgd": ("lstm", "sgd", {"learning_rate": 0.01}, 32),
}


def now_us() -> float:
    return time.time_ns() / 1000.0


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ============================================================================ worker side
def truth_from_counter(events: list[dict], marks: list[tuple[float, float]], steps: range) -> dict:
    """Per analysed step: the storage counters' highest and lowest total (bytes) while it ran.

    The CPU counters (``Memory: cpu/0``; ``Memory: cpu pinned/`` where the kvstore's pinned
    buffers are allocated) are summed.

    Step i owns the counter changes after step i-1 ended up to its own end, and starts at
    the value the counter had then.
    """
    last: dict[str, int] = {}
    series: list[tuple[float, int]] = []  # (ts, sum of every CPU counter's value then)
    for ts, name, v in sorted((float(e["ts"]), str(e["name"]), int(e["args"][e["name"]])) for e in events
                              if e.get("ph") == "C" and e.get("cat") == "Device Storage"
                              and str(e.get("name")).startswith("Memory: cpu")):
        last[name] = v
        series.append((ts, sum(last.values())))
    peaks, floors = {}, {}
    for i in steps:
        lo, hi = marks[i - 1][0] + marks[i - 1][1], marks[i][0] + marks[i][1]
        before = [v for t, v in series if t <= lo][-1:]
        vals = before + [v for t, v in series if lo < t <= hi]
        peaks[i], floors[i] = max(vals), min(vals)
    return {"peaks": peaks, "floors": floors}


def worker(a: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO / "examples" / "mxnet"))
    import mxnet as mx
    from mxnet import autograd, gluon
    from train_ps import build, make_batch

    from dpro.profiler.mxnet.memory import static_facts

    model, opt, opt_params, batch = CONFIGS[a.config]
    mx.random.seed(0)
    kv = mx.kv.create("dist_sync")
    truth = Path(a.truth) if a.truth else None
    if truth:
        truth.mkdir(parents=True, exist_ok=True)
        prof_file = truth / f"counter_rank{kv.rank}.json"
        mx.profiler.set_config(profile_memory=True, profile_symbolic=False, profile_imperative=False,
                               profile_api=False, aggregate_stats=False, filename=str(prof_file))
        mx.profiler.set_state("run")
    rss0 = _rss_bytes()
    net, shape = build(model)
    net.initialize(mx.init.Xavier())
    net.hybridize(**({"forward_bulk_size": 0, "backward_bulk_size": 0} if os.environ.get("MXMEM_NOBULK") else {}))
    trainer = gluon.Trainer(net.collect_params(), opt, opt_params, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def step() -> None:
        x, y = make_batch(model, batch, shape)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(batch)
        mx.nd.waitall()

    if not truth:
        import dpro

        step = dpro.profile(dpro.Recorder(net))(step)
    marks: list[tuple[float, float]] = []
    for _ in range(WARMUP + STEPS + 1):
        t0 = now_us()
        step()
        mx.nd.waitall()
        marks.append((t0, now_us() - t0))
    if truth:
        mx.profiler.set_state("stop")
        mx.profiler.dump(finished=True)
        events = json.loads(prof_file.read_text())["traceEvents"]
        prof_file.unlink()
        t = truth_from_counter(events, marks, range(WARMUP + 1, WARMUP + STEPS))
        t.update({"rss_growth": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0,
                  "static_facts": static_facts(net, [trainer])})
        (truth / f"rank{kv.rank}.json").write_text(json.dumps(t))


# ============================================================================ driver side
def _job(config: str, extra: list[str]) -> list[str]:
    return [sys.executable, str(REPO / "examples" / "mxnet" / "launch_local.py"), "-n", "2", "-s", "1",
            "--timeout", "300", "--", str(Path(__file__).absolute()), "--worker", "--config", config, *extra]


def run_config(name: str, work: Path) -> list[dict]:
    """Profile + predict, then measure; one row per worker."""
    from dpro.gtrace.io import load_gtrace
    from dpro.replayer.memory import peak_memory
    from dpro.replayer.replay import replay

    traces, truth = work / name / "traces", work / name / "truth"
    cmd = [sys.executable, "-m", "dpro.cli", "profile", "--memory", "-o", str(traces), "--warmup", str(WARMUP),
           "--steps", str(STEPS), "--force", "--", *_job(name, [])]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise SystemExit(f"{name}: dpro profile failed:\n{r.stderr[-3000:]}")
    gt = load_gtrace(traces)
    pred = peak_memory(gt, replay(gt))
    measured_order = peak_memory(gt)
    r = subprocess.run(_job(name, ["--truth", str(truth)]), cwd=REPO, capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise SystemExit(f"{name}: measurement run failed:\n{r.stderr[-3000:]}")
    rows = []
    for nt in gt.workers():
        t = json.loads((truth / f"rank{nt.info.rank}.json").read_text())
        meas = max(t["peaks"].values())
        p = pred[nt.info.name]
        rows.append({
            "config": name, "rank": nt.info.rank, "predicted_bytes": p.peak_bytes,
            "measured_order_bytes": measured_order[nt.info.name].peak_bytes, "measured_bytes": meas,
            "error_pct": 100.0 * (p.peak_bytes - meas) / meas, "static_bytes": p.static_bytes,
            "carry_in_bytes": p.carry_in_bytes, "measured_floor_bytes": min(t["floors"].values()),
            "truth_static_bytes": t["static_facts"]["static_bytes"], "rss_growth_bytes": t["rss_growth"],
            "measured_per_step": t["peaks"], "peak_op": p.peak_op, "notes": p.notes,
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--work", type=Path, default=None, help="keep traces here (default: a temporary dir)")
    # worker side (run by launch_local.py)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", default="mlp-sgdm", choices=list(CONFIGS), help=argparse.SUPPRESS)
    ap.add_argument("--truth", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="dpro-mxmem-") as tmp:
        work = args.work or Path(tmp)
        print(f"{'config':<12} {'rank':>4} {'predicted MB':>13} {'measured MB':>12} {'error %':>8} "
              f"{'static MB':>10} {'floor MB':>9} {'RSS growth MB':>14}")
        for name in args.configs:
            t0 = time.perf_counter()
            for row in run_config(name, work):
                rows.append(row)
                print(f"{row['config']:<12} {row['rank']:>4} {row['predicted_bytes'] / 1e6:>13.3f} "
                      f"{row['measured_bytes'] / 1e6:>12.3f} {row['error_pct']:>8.2f} "
                      f"{row['static_bytes'] / 1e6:>10.3f} {row['measured_floor_bytes'] / 1e6:>9.3f} "
                      f"{row['rss_growth_bytes'] / 1e6:>14.1f}", flush=True)
            print(f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    worst = max(abs(r["error_pct"]) for r in rows)
    print(f"worst |error|: {worst:.2f} % over {len(rows)} ranks")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
