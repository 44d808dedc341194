"""Predicted vs measured peak memory of real 2-rank PyTorch DDP (gloo) jobs.

    python benchmarks/memory_fidelity.py                       # every config
    python benchmarks/memory_fidelity.py --configs mlp-sgdm resnet-sgd --json out.json

For each config the same training script runs twice:

1. under ``dpro profile`` (the two-line recorder): ``dpro replay``'s schedule and
   :func:`dpro.replayer.memory.peak_memory` give the **predicted** peak per rank;
2. without dpro, under torch.profiler with ``profile_memory=True`` started right after
   the model, DDP and the optimizer are built: the **measured** live bytes are the
   parameters' and buffers' storages (they exist before; counted directly) plus every
   block allocated since and not yet freed, rebuilt from the allocation events; the
   measured peak is the largest over the steps dpro analysed. (Started before the model
   is built instead, rank 0 sometimes keeps a phantom block the size of the model: a block
   freed on gloo's thread, where torch reports no free.) The process's
   peak RSS growth (``ru_maxrss`` minus the RSS before the model is built) is
   printed as a sanity check (it also holds the allocator's and libraries' overheads).

The training step creates its batch (as a data loader would), zeroes the gradients,
runs forward, backward (DDP all-reduces the buckets) and the optimizer step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).absolute().parents[1]
WARMUP, STEPS = 3, 4
TRUTH_PREFIX = "memtruth_step#"

#: name -> (model, optimizer, zero_grad set_to_none, DDP gradient_as_bucket_view)
CONFIGS: dict[str, tuple[str, str, bool, bool]] = {
    "mlp-sgdm": ("mlp", "sgd-momentum", True, False),
    "convnet-adam": ("convnet", "adam", True, False),
    "transformer-adamw": ("transformer", "adamw", True, False),
    "resnet-sgd": ("resnet", "sgd", True, True),
    "mlp-adam-keepgrads": ("mlp", "adam", False, False),
}


# ============================================================================ rank side
def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _build(model: str):
    sys.path.insert(0, str(REPO / "examples" / "pytorch"))
    if model == "resnet":
        from models_memory import DEFAULT_BATCH_SIZE, build
    else:
        from models import DEFAULT_BATCH_SIZE, build
    m, make_batch, loss_fn = build(model)
    return m, make_batch, loss_fn, DEFAULT_BATCH_SIZE[model]


def _optimizer(name: str, params):
    import torch

    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    raise ValueError(name)


def _truth_peaks(trace: Path, steps: range) -> tuple[dict[int, int], dict[int, int], int]:
    """Per step: the highest live bytes while it ran (or when it started).

    The live bytes are rebuilt from the allocation events (address, size): torch reports a
    free only when it happens on a profiled thread, so a block the main thread allocated
    and gloo's thread freed would stay counted for ever in the profiler's running "Total
    Allocated". Two live blocks cannot share an address: when an allocation reuses the
    address of a block still counted, that block was freed unseen and is dropped.
    Returns (rebuilt peaks, the profiler's own "Total Allocated" peaks, bytes dropped).
    """
    with open(trace, "rb") as f:
        evs = json.load(f)["traceEvents"]
    windows = {}
    for e in evs:
        n = str(e.get("name", ""))
        if e.get("ph") == "X" and n.startswith(TRUTH_PREFIX):
            windows[int(n[len(TRUTH_PREFIX):])] = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
    mem = sorted((float(e["ts"]), int(e["args"]["Bytes"]), int(e["args"]["Addr"]), int(e["args"]["Total Allocated"]))
                 for e in evs if e.get("name") == "[memory]" and int((e.get("args") or {}).get("Device Type", 0)) == 0)
    live: dict[int, int] = {}
    level = dropped = 0
    series = []  # (ts, rebuilt level, profiler's level)
    for ts, nbytes, addr, total in mem:
        if nbytes > 0:
            if addr in live:
                old = live.pop(addr)
                level -= old
                dropped += old
            live[addr] = nbytes
            level += nbytes
        elif addr in live:
            level -= live.pop(addr)
        series.append((ts, level, total))
    out, raw = {}, {}
    for s in steps:
        t0, t1 = windows[s]
        before = [x for x in series if x[0] < t0][-1:]
        inside = [x for x in series if t0 <= x[0] <= t1]
        out[s] = max(x[1] for x in before + inside)
        raw[s] = max(x[2] for x in before + inside)
    return out, raw, dropped


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rss0 = _rss_bytes()

    def setup(changed: bool):
        """(inner model, DDP, optimizer, step function); ``changed``: with this run's change."""
        model, make_batch, loss_fn, bs = _build(args.model)
        bs = args.batch_size or bs
        k = args.accum if changed else 1
        amp = args.amp and changed
        if args.checkpoint and changed:
            from dpro.apply import checkpoint_modules

            checkpoint_modules(model, args.checkpoint.split(","))
        if args.compile and changed:
            from dpro.apply import compile_module

            compile_module(model)  # not model.compile(): a no-op on torch's own modules (see there)
        ddp = DDP(model, gradient_as_bucket_view=args.bucket_view)
        opt = _optimizer(args.optimizer, ddp.parameters())

        def train_one_step(i: int) -> float:
            x, y = make_batch(bs)
            opt.zero_grad(set_to_none=args.set_to_none)
            if k == 1:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    loss = loss_fn(ddp(x), y)
                loss.backward()
            else:  # gradient accumulation: k micro-batches, DDP synchronises the last one only
                for j, (xj, yj) in enumerate(zip(x.split(bs // k), y.split(bs // k))):
                    with ddp.no_sync() if j < k - 1 else contextlib.nullcontext():
                        loss = loss_fn(ddp(xj), yj) / k
                        loss.backward()
            opt.step()
            return float(loss)

        return model, ddp, train_one_step

    def timed(step, i: int) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        step(i)
        return (time.perf_counter() - t0) * 1e6

    if args.time_ab:
        # the unchanged (A) and the changed (B) job in one process, steps alternating: the
        # machine's drift between runs (up to +-30 % here) hits both alike
        _, _, step_a = setup(False)
        _, _, step_b = setup(True)
        a, b = [], []
        for i in range(args.steps):
            a.append(timed(step_a, i))
            b.append(timed(step_b, i))
        Path(args.time_ab).mkdir(parents=True, exist_ok=True)
        Path(args.time_ab, f"rank{dist.get_rank()}.json").write_text(json.dumps({"a_us": a[WARMUP:], "b_us": b[WARMUP:]}))
        dist.destroy_process_group()
        return
    model, ddp, train_one_step = setup(True)
    prof = None
    if args.truth:
        from torch.profiler import ProfilerActivity, profile, record_function

        # the parameters and buffers exist before the measurement starts: count them directly
        held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in list(model.parameters()) + list(model.buffers())}
        prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        prof.start()

    if args.time:
        times = [timed(train_one_step, i) for i in range(args.steps)]
        Path(args.time).mkdir(parents=True, exist_ok=True)
        Path(args.time, f"rank{dist.get_rank()}.json").write_text(json.dumps({"step_us": times[WARMUP:]}))
        dist.destroy_process_group()
        return

    if args.truth:
        for i in range(args.steps):
            with record_function(f"{TRUTH_PREFIX}{i}"):
                train_one_step(i)
        prof.stop()
        rank = dist.get_rank()
        with tempfile.TemporaryDirectory() as tmp:
            prof.export_chrome_trace(f"{tmp}/t.json")
            peaks, raw, dropped = _truth_peaks(Path(f"{tmp}/t.json"), range(WARMUP + 1, args.steps))
        peaks = {s: v + sum(held.values()) for s, v in peaks.items()}
        raw = {s: v + sum(held.values()) for s, v in raw.items()}
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
        Path(args.truth).mkdir(parents=True, exist_ok=True)
        Path(args.truth, f"rank{rank}.json").write_text(json.dumps(
            {"peaks": peaks, "profiler_total_allocated": raw, "dropped_unseen_frees": dropped, "rss_growth": rss}))
    else:
        import dpro

        recorder = dpro.Recorder(ddp)
        step = dpro.profile(recorder)(train_one_step)
        for i in range(args.steps):
            step(i)
    dist.destroy_process_group()


# ============================================================================ driver
def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job(extra: list[str], model: str, opt: str, set_to_none: bool, view: bool) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(_port()), str(Path(__file__).absolute()), "--worker", "--model", model,
            "--optimizer", opt, "--steps", str(WARMUP + STEPS + 1),
            *(["--keep-grads"] if not set_to_none else []), *(["--bucket-view"] if view else []), *extra]


def run_config(name: str, work: Path) -> list[dict]:
    """Profile + predict, then measure; one row per rank."""
    from dpro.gtrace.io import load_gtrace
    from dpro.replayer.memory import peak_memory
    from dpro.replayer.replay import replay

    model, opt, set_to_none, view = CONFIGS[name]
    traces, truth = work / name / "traces", work / name / "truth"
    cmd = [sys.executable, "-m", "dpro.cli", "profile", "--memory", "-o", str(traces), "--warmup", str(WARMUP),
           "--steps", str(STEPS), "--force", "--", *_job([], model, opt, set_to_none, view)]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise SystemExit(f"{name}: dpro profile failed:\n{r.stderr[-3000:]}")
    gt = load_gtrace(traces)
    rr = replay(gt)
    pred = peak_memory(gt, rr)
    measured_order = peak_memory(gt)
    r = subprocess.run(_job(["--truth", str(truth)], model, opt, set_to_none, view), cwd=REPO,
                       capture_output=True, text=True, timeout=600)
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
            "carry_in_bytes": p.carry_in_bytes, "rss_growth_bytes": t["rss_growth"],
            "measured_per_step": t["peaks"], "profiler_total_allocated": t["profiler_total_allocated"],
            "dropped_unseen_frees": t["dropped_unseen_frees"], "peak_op": p.peak_op, "at_peak": p.at_peak,
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--work", type=Path, default=None, help="keep traces here (default: a temporary dir)")
    # rank side (run by torchrun)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
    ap.add_argument("--optimizer", default="sgd", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=WARMUP + STEPS + 1, help=argparse.SUPPRESS)
    ap.add_argument("--keep-grads", dest="set_to_none", action="store_false", help=argparse.SUPPRESS)
    ap.add_argument("--bucket-view", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--truth", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--time", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--time-ab", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", default="", help=argparse.SUPPRESS)
    ap.add_argument("--accum", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--amp", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="dpro-mem-") as tmp:
        work = args.work or Path(tmp)
        print(f"{'config':<20} {'rank':>4} {'predicted MB':>13} {'measured MB':>12} {'error %':>8} "
              f"{'static MB':>10} {'RSS growth MB':>14}")
        for name in args.configs:
            t0 = time.perf_counter()
            for row in run_config(name, work):
                rows.append(row)
                print(f"{row['config']:<20} {row['rank']:>4} {row['predicted_bytes'] / 1e6:>13.3f} "
                      f"{row['measured_bytes'] / 1e6:>12.3f} {row['error_pct']:>8.2f} "
                      f"{row['static_bytes'] / 1e6:>10.3f} {row['rss_growth_bytes'] / 1e6:>14.1f}", flush=True)
            print(f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    worst = max(abs(r["error_pct"]) for r in rows)
    print(f"worst |error|: {worst:.2f} % over {len(rows)} ranks")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
