"""What each torch.profiler option the recorder turns on costs a real GPU job (issue #31).

For each job of ``record_kineto.py`` and each variant, interleaved over ``--rounds`` rounds,
it times ``--steps`` steps (``torch.cuda.synchronize()`` at both ends) with:

* ``off``: no profiler;
* ``kineto``: torch.profiler, CPU + CUDA activities, nothing else;
* ``shapes``: + ``record_shapes=True``;
* ``memory``: + ``profile_memory=True`` (what dpro's recorder runs today, without the hooks);
* ``recorder``: + a ``record_function`` per module around its forward (dpro's layer hooks);
* ``layers_only``: kineto + the layer hooks, without shapes or memory;
* ``cuda_only``: the CUDA activity alone (kernels, copies and the runtime calls that launch
  them; no CPU operators);
* ``dpro``: dpro's own two-line recorder (``dpro.Recorder`` + ``@dpro.profile``) as it is
  configured by default, a fresh one per window (its trace is written after the timed
  steps, as the recorder defers it);
* ``dpro_light``: the same with ``DPRO_CUDA_LIGHT=1``: the window's first call (untimed) with
  CPU operators, the timed ones CUDA-only.

and prints the median µs per step and the overhead against ``off``, measured in the same
process. Usage (on the GPU machine)::

    python3 benchmarks/gpu/profiler_cost.py
    PYTHONPATH=. python3 benchmarks/gpu/profiler_cost.py --variants off,kineto,cuda_only,dpro
    PYTHONPATH=. python3 benchmarks/gpu/profiler_cost.py --variants off,cuda_only,dpro,dpro_light
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_kineto import _job, _step  # noqa: E402

VARIANTS = {
    "off": None,
    "kineto": {},
    "shapes": {"record_shapes": True},
    "memory": {"record_shapes": True, "profile_memory": True},
    "recorder": {"record_shapes": True, "profile_memory": True, "hooks": True},
    "layers_only": {"hooks": True},
    "cuda_only": {"activities": [ProfilerActivity.CUDA]},
    "dpro": "dpro",
    "dpro_light": "dpro_light",
}


def dpro_window(job: tuple, steps: int, out: Path, light: bool = False) -> float:
    """µs per step under dpro's recorder: 2 untimed calls (the profiler's start-up; in light
    mode the first is the structure step), ``steps`` timed, one more untimed that ends the
    window; the trace is written after the timing."""
    import os

    import dpro

    model, batch, loss_fn, opt, sync = job
    os.environ["DPRO_CUDA_LIGHT"] = "1" if light else "0"
    try:
        rec = dpro.Recorder(model, out_dir=str(out), warmup=0, steps=steps + 3)
    finally:
        del os.environ["DPRO_CUDA_LIGHT"]

    @dpro.profile(rec)
    def step() -> None:
        _step(model, batch(), loss_fn, opt, sync)

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    us = (time.perf_counter() - t0) / steps * 1e6
    step()
    rec.close()
    return us


def _hooks(model: torch.nn.Module) -> list[Any]:
    stack: list[Any] = []

    def pre(mod: Any, args: Any, name: str) -> None:
        rf = torch.profiler.record_function("## " + name)
        rf.__enter__()
        stack.append(rf)

    def post(mod: Any, args: Any, out: Any) -> None:
        if stack:
            stack.pop().__exit__(None, None, None)

    hs = []
    for name, mod in model.named_modules():
        if name:
            hs.append(mod.register_forward_pre_hook(lambda m, a, n=name: pre(m, a, n)))
            hs.append(mod.register_forward_hook(post))
    return hs


def window(job: tuple, variant: dict | str | None, steps: int) -> float:
    if variant in ("dpro", "dpro_light"):
        with tempfile.TemporaryDirectory(prefix="dpro-cost-") as tmp:
            return dpro_window(job, steps, Path(tmp), light=variant == "dpro_light")
    model, batch, loss_fn, opt, sync = job
    hooks = _hooks(model) if variant and variant.get("hooks") else []
    prof = None
    if variant is not None:
        kw = {"activities": [ProfilerActivity.CPU, ProfilerActivity.CUDA]}
        kw.update({k: v for k, v in variant.items() if k != "hooks"})
        prof = profile(**kw)
        prof.start()
        for _ in range(2):  # the profiler's own start-up is not a step
            _step(model, batch(), loss_fn, opt, sync)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        _step(model, batch(), loss_fn, opt, sync)
    torch.cuda.synchronize()
    us = (time.perf_counter() - t0) / steps * 1e6
    if prof is not None:
        prof.stop()
    for h in hooks:
        h.remove()
    return us


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", default="resnet50_sync,gpt_sync,mlp_launch_bound")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from: " + ",".join(VARIANTS))
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    variants = {v: VARIANTS[v] for v in a.variants.split(",")}
    results: dict[str, dict[str, list[float]]] = {}
    for name in a.jobs.split(","):
        torch.manual_seed(0)
        torch.backends.cudnn.benchmark = True
        job = _job(name)
        for _ in range(10):
            _step(job[0], job[1](), job[2], job[3], job[4])
        res = results.setdefault(name, {v: [] for v in variants})
        for _ in range(a.rounds):
            for v, kw in variants.items():
                res[v].append(window(job, kw, a.steps))
        off = statistics.median(res["off"])
        print(f"{name}: " + ", ".join(
            f"{v} {statistics.median(t):.0f} us ({100 * (statistics.median(t) / off - 1):+.1f} %)"
            for v, t in res.items()), flush=True)
        del job
        torch.cuda.empty_cache()
    if a.json:
        a.json.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                      "steps": a.steps, "rounds": a.rounds, "windows_us": results}, indent=1))


if __name__ == "__main__":
    main()
