"""What dpro's PyTorch recording window costs, measured inside the same processes.

`benchmarks/overhead.py` compares separate runs with dpro on and off; their launches differ
by several per cent on a shared VM, which its figures carry. Here N gloo ranks of a DDP job
(examples/pytorch/models.py) run blocks of ``--steps`` calls, one block per variant per
round (order alternating), all in the same processes:

* ``off``: the job alone;
* ``window``: dpro's recorder backend (dpro.profiler.pytorch.backend.TorchBackend: torch.profiler,
  layer ranges, the DDP bucket hook, the memory watch) started before the block and stopped
  after it, as in a window (no trace written);
* ``coarse``: the same, with torch.profiler observing only user ranges and autograd nodes
  (``RecordScope.USER_SCOPE``, ``BACKWARD_FUNCTION``), not every operator: what recording
  without per-op events would cost (a measurement; dpro does not record so);
* ``bare``: a torch.profiler CPU session alone;
* ``light``: dpro's recorder backend in CPU-light mode (``DPRO_CPU_LIGHT``): torch.profiler in
  the block's first call, the others timed by the layer and bucket hooks alone;
* ``hooks``: those hooks alone in every call (no torch.profiler);
* ``once``: a torch.profiler CPU session over the block's first call alone (what the
  structure call leaves behind for the next ones).

dpro's bucket hook is installed once for every variant (DDP takes one comm hook per model).
Each step is the mean over the ranks; per variant: the median of its steps (pooled), against
``off``, and the median over rounds of the block's median against the same round's ``off``
block; events a step on rank 0. Times in µs in ``--json-out``. Runs with benchmarks/jobenv.py's
``threads1heap`` (one compute thread, glibc's mmap threshold fixed). A time: run it through
benchmarks/measure.sh.

    benchmarks/measure.sh .venv/bin/python benchmarks/window_parts.py --rounds 24
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import jobenv  # noqa: E402

VARIANTS = ("off", "window", "coarse", "bare", "light", "hooks", "once")


class _ScopedSession:
    """``torch.profiler.profile``'s start/stop observing only some RecordScopes (``coarse``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import torch.autograd.profiler as ap
        from torch._C._profiler import _ExperimentalConfig

        self.config = ap.ProfilerConfig(ap.ProfilerState.KINETO, False, False, False, False, False,
                                        _ExperimentalConfig())
        self.events = 0

    def start(self) -> None:
        from torch._C._autograd import _enable_profiler, _prepare_profiler
        from torch._C._profiler import ProfilerActivity, RecordScope

        _prepare_profiler(self.config, {ProfilerActivity.CPU})
        _enable_profiler(self.config, {ProfilerActivity.CPU}, {RecordScope.USER_SCOPE, RecordScope.BACKWARD_FUNCTION})

    def stop(self) -> None:
        from torch._C._autograd import _disable_profiler

        self.events = len(_disable_profiler().events())


def rank_main(model_name: str, variants: list[str], rounds: int, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, str(REPO / "examples" / "pytorch"))
    from models import DEFAULT_BATCH_SIZE, build

    from dpro.profiler.config import RecordConfig
    from dpro.profiler.pytorch.anchors import AnchorLog
    from dpro.profiler.pytorch.backend import TorchBackend

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model, make_batch, loss_fn = build(model_name)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)
    batch = make_batch(DEFAULT_BATCH_SIZE[model_name])
    config = RecordConfig(out_dir=Path(out) / "unused", warmup=0, steps=steps, shallow_ranks=False, cpu_light=False)
    light_config = dataclasses.replace(config, cpu_light=True)
    TorchBackend(ddp, config)  # dpro's bucket hook, for every variant
    real_profile = torch.profiler.profile

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(ddp(batch[0]), batch[1]).backward()
        opt.step()

    def timed(begin=None, end=None) -> list[float]:  # type: ignore[no-untyped-def]
        """``steps`` calls, each timed (µs), ``begin(i)`` / ``end(i, token)`` around the step."""
        times: list[float] = []
        for i in range(steps):
            t0 = time.perf_counter()
            token = begin(i) if begin else None
            step()
            if end:
                end(i, token)
            times.append((time.perf_counter() - t0) * 1e6)
        return times

    def block(variant: str) -> tuple[list[float], int]:
        if variant == "off":
            return timed(), 0
        if variant in ("bare", "once"):
            prof = real_profile(activities=[torch.profiler.ProfilerActivity.CPU])
            prof.start()
            if variant == "once":
                times = timed(end=lambda i, _: prof.stop() if i == 0 else None)
            else:
                times = timed()
                prof.stop()
            return times, len(prof.profiler.kineto_results.events())
        if variant == "hooks":
            b = TorchBackend(ddp, light_config)
            b.active, b.anchors = True, AnchorLog()
            b._install_layer_hooks()
            times = timed(b.step_begin, b.step_end)
            b._remove_layer_hooks()
            b.active, b.anchors = False, None
            return times, 0
        torch.profiler.profile = _ScopedSession if variant == "coarse" else real_profile
        b = TorchBackend(ddp, light_config if variant == "light" else config)
        b.start()
        times = timed(b.step_begin, b.step_end)
        b.stop()
        events = b.prof.events if variant == "coarse" else len(b.prof.profiler.kineto_results.events())
        b._drop_sessions()
        torch.profiler.profile = real_profile
        return times, events

    # (result key, variant) of every block in order: --sequence (rounds 0) once each from the
    # process's first call, keyed by position; else two unrecorded off blocks, then the rounds
    if rounds == 0:
        plan = [(f"{i}:{v}", v) for i, v in enumerate(variants)]
        rounds = 1
    else:
        for _ in range(2):
            block("off")
        plan = [(v, v) for r in range(rounds) for v in (variants if r % 2 == 0 else variants[::-1])]
    res: dict[str, list[list[float]]] = {k: [] for k, _ in plan}
    events: dict[str, int] = {}
    for key, v in plan:
        dist.barrier()
        times, n = block(v)
        res[key].append(times)
        events[key] = n // steps
    variants = list(res)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, res)
    if rank == 0:
        mean = {v: [[statistics.mean(x) for x in zip(*(g[v][r] for g in gathered))] for r in range(rounds)]
                for v in variants}
        Path(out, "result.json").write_text(json.dumps({"steps_us": mean, "events_per_step": events}))
    dist.barrier()
    dist.destroy_process_group()
    # past here only C++ teardown: a profiler or gloo thread still joinable at static destruction
    # aborts the process now and then ("terminate called without an active exception"), after
    # the result is written; leave without it
    sys.stdout.flush()
    os._exit(0)


def summarize(result: dict, variants: list[str]) -> dict[str, dict[str, float]]:
    """Per variant: pooled median step (µs), its % against ``off``, the median over rounds of
    the block's median against the same round's ``off`` block (%), the same two for the
    block's calls after its first (``light``'s and ``once``'s first call holds torch.profiler),
    events a step."""
    steps = result["steps_us"]
    base = statistics.median(x for blk in steps["off"] for x in blk)
    base_later = statistics.median(x for blk in steps["off"] for x in blk[1:]) if len(steps["off"][0]) > 1 else base
    out = {}
    for v in variants:
        pooled = statistics.median(x for blk in steps[v] for x in blk)
        paired = [statistics.median(a) / statistics.median(b) - 1 for a, b in zip(steps[v], steps["off"])]
        out[v] = {"median_us": pooled, "pooled_pct": 100 * (pooled / base - 1),
                  "paired_pct": 100 * statistics.median(paired), "events_per_step": result["events_per_step"].get(v, 0)}
        if len(steps[v][0]) > 1:
            later = statistics.median(x for blk in steps[v] for x in blk[1:])
            paired_later = [statistics.median(a[1:]) / statistics.median(b[1:]) - 1 for a, b in zip(steps[v], steps["off"])]
            out[v] |= {"later_pooled_pct": 100 * (later / base_later - 1),
                       "later_paired_pct": 100 * statistics.median(paired_later)}
    return out


def launch(a: argparse.Namespace, variants: list[str], rounds: int) -> dict:
    """One launch of ``a.workers`` ranks; rank 0's result (``rounds`` 0: ``variants`` is a sequence)."""
    settings = jobenv.SETTINGS["threads1heap"]
    with tempfile.TemporaryDirectory(prefix="dpro-window-parts-") as tmp:
        env = {**os.environ, **settings.env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(a.port),
               "WORLD_SIZE": str(a.workers), "PYTHONPATH": str(REPO)}
        procs = [subprocess.Popen([sys.executable, __file__, "--rank", a.model, ",".join(variants), str(rounds),
                                   str(a.steps), tmp], env={**env, "RANK": str(r)}, stderr=subprocess.DEVNULL)
                 for r in range(a.workers)]
        codes = [p.wait(timeout=1800) for p in procs]
        res_file = Path(tmp, "result.json")
        if any(codes) or not res_file.exists():
            sys.exit(f"window_parts: a rank failed (exit codes {codes})")
        return json.loads(res_file.read_text())


def sequence_summary(results: list[dict], order: list[str]) -> list[dict]:
    """``--sequence``: per block, the median over launches of its median step against the
    launch's settled unprofiled pace, the median step of its ``off`` blocks after the first
    (the first holds the process's first calls) (%)."""
    later_off = [f"{j}:off" for j, w in enumerate(order) if w == "off" and j > 0]
    bases = [statistics.median(x for k in later_off for x in r["steps_us"][k][0]) for r in results]
    out = []
    for i, v in enumerate(order):
        k = f"{i}:{v}"
        pct = [100 * (statistics.median(r["steps_us"][k][0]) / base - 1) for r, base in zip(results, bases)]
        out.append({"block": k, "median_pct": statistics.median(pct), "pct": pct})
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        a = sys.argv[2:]
        rank_main(a[0], a[1].split(","), int(a[2]), int(a[3]), a[4])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="transformer", choices=["mlp", "convnet", "transformer"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--steps", type=int, default=5, help="calls per block (a window's length)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="off first; any of " + ", ".join(VARIANTS))
    ap.add_argument("--sequence", default=None, metavar="V,V,...",
                    help="instead of rounds: these blocks once per launch, in this order, from the process's "
                         "first call, each against the launch's later off blocks (e.g. off,window,off,window,off: "
                         "a process's first window, as dpro's, against a later one)")
    ap.add_argument("--launches", type=int, default=8, help="with --sequence: launches")
    ap.add_argument("--port", type=int, default=29851)
    ap.add_argument("--json-out", type=Path, default=None)
    a = ap.parse_args()
    variants = [v for v in (a.sequence or a.variants).split(",") if v]
    if (not variants or variants[0] != "off" or any(v not in VARIANTS for v in variants) or a.rounds < 1
            or (a.sequence and variants.count("off") < 2)
            or a.steps < 1 or a.launches < 1):
        ap.error(f"--variants / --sequence must start with off and name only {', '.join(VARIANTS)}; "
                 "--rounds, --steps, --launches >= 1")
    head = f"# {a.model}, {a.workers} gloo ranks, {os.cpu_count()} CPUs, threads1heap, blocks of {a.steps} calls"
    if a.sequence:
        results = [launch(a, variants, 0) for _ in range(a.launches)]
        rows = sequence_summary(results, variants)
        print(f"{head}; {a.launches} launches of {a.sequence}")
        for r in rows:
            print(f"{r['block']:10s} against the later off blocks: median {r['median_pct']:+6.1f} %  ("
                  + " ".join(f"{x:+.1f}" for x in r["pct"]) + ")")
        if a.json_out:
            a.json_out.write_text(json.dumps({"model": a.model, "workers": a.workers, "sequence": variants,
                                              "summary": rows, "launches": results}))
        return
    result = launch(a, variants, a.rounds)
    summary = summarize(result, variants)
    print(f"{head}; {a.rounds} rounds")
    for v, s in summary.items():
        later = (f"  calls 2+: pooled {s['later_pooled_pct']:+6.1f} %  paired {s['later_paired_pct']:+6.1f} %"
                 if "later_pooled_pct" in s else "")
        print(f"{v:8s} {s['median_us'] / 1e3:8.2f} ms  pooled {s['pooled_pct']:+6.1f} %  "
              f"paired {s['paired_pct']:+6.1f} %  events/step {s['events_per_step']:6d}{later}")
    if a.json_out:
        a.json_out.write_text(json.dumps({"model": a.model, "workers": a.workers, "rounds": a.rounds,
                                          "steps": a.steps, "summary": summary, **result}))


if __name__ == "__main__":
    main()
