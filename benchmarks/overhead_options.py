"""What each torch.profiler option costs per step, in one process (the recorder's choices).

One process trains one of the example models (examples/pytorch/models.py, 1 thread) and, in
each of ``--rounds`` rounds, runs ``--steps`` steps unprofiled and then ``--steps`` steps under
each configuration, in a shuffled order per round, back to back: adjacent windows share the
machine's state, so the speed drift of a shared VM (up to 2x over minutes) largely cancels in
each configuration's ratio to the unprofiled window of its round. Prints, per configuration,
the median over rounds of (median step profiled / median step unprofiled − 1) and the
min..max; and for ``off`` against itself (the first and the second half of each round's
unprofiled window) the same, the noise floor.

Configurations: ``plain`` (CPU activity only: op names, threads, times), ``+layers`` (the
recorder's ``dpro.layer::`` annotation per module, forward hooks: what the recorder
records by default; opened with torch's C++ range), ``+layers-slow`` (the same with
``record_function``, as before #31), ``+shapes`` (``record_shapes``), ``+memory`` (``profile_memory``),
``+shapes+memory`` and ``recorder-old`` (layers + shapes + memory, the default before #31).

    .venv/bin/python benchmarks/overhead_options.py --model transformer --rounds 8
    .venv/bin/python benchmarks/overhead_options.py --model transformer --rounds 8 --clock cpu   # loaded machine
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "pytorch"))
from models import DEFAULT_BATCH_SIZE, MODEL_NAMES, build  # noqa: E402

from dpro.profiler.pytorch.backend import fast_range  # noqa: E402

CONFIGS = {
    "plain": (False, {}),
    "+layers": (True, {}),
    "+layers-slow": ("slow", {}),
    "+shapes": (False, {"record_shapes": True}),
    "+memory": (False, {"profile_memory": True}),
    "+shapes+memory": (False, {"record_shapes": True, "profile_memory": True}),
    "recorder-old": (True, {"record_shapes": True, "profile_memory": True}),
}


def layer_hooks(model: torch.nn.Module, slow: bool = False) -> list:
    """The recorder's annotations: ``dpro.layer::<path>`` around each module's forward, opened
    with torch's C++ range as the recorder does (``slow``: with ``record_function``, as before #31)."""
    stack: list = []
    make = (fast_range() if not slow else None) or record_function

    def pre(_m, _a, name):
        rf = make("dpro.layer::" + name)
        rf.__enter__()
        stack.append(rf)

    def post(_m, _a, _o):
        if stack:
            stack.pop().__exit__(None, None, None)

    hooks = []
    for name, mod in model.named_modules():
        if name:
            hooks.append(mod.register_forward_pre_hook(lambda m, a, n=name: pre(m, a, n)))
            hooks.append(mod.register_forward_hook(post))
    return hooks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODEL_NAMES, default="transformer")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=6, help="steps per window")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time each step by the wall clock, or by this thread's CPU time (time.thread_time: "
                         "the training runs on this one thread; far less sensitive to other processes on a "
                         "loaded machine, blind to waiting)")
    a = ap.parse_args()
    clock = time.perf_counter if a.clock == "wall" else time.thread_time
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, make_batch, loss_fn = build(a.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = make_batch(DEFAULT_BATCH_SIZE[a.model])

    def window(n: int) -> list[float]:
        out = []
        for _ in range(n):
            t = clock()
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            out.append(clock() - t)
        return out

    window(5)  # warm-up
    rng = random.Random(0)
    ratios: dict[str, list[float]] = {k: [] for k in ["off/off", *CONFIGS]}
    off_ms = []
    for _ in range(a.rounds):
        off = window(2 * a.steps)
        base = statistics.median(off)
        off_ms.append(base * 1e3)
        ratios["off/off"].append(statistics.median(off[a.steps:]) / statistics.median(off[:a.steps]) - 1)
        order = list(CONFIGS)
        rng.shuffle(order)
        for name in order:
            layers, kw = CONFIGS[name]
            hooks = layer_hooks(model, slow=layers == "slow") if layers else []
            prof = profile(activities=[ProfilerActivity.CPU], **kw)
            prof.start()
            steps = window(a.steps)
            prof.stop()
            for h in hooks:
                h.remove()
            ratios[name].append(statistics.median(steps) / base - 1)
    print(f"{a.model}: unprofiled {statistics.median(off_ms):.1f} ms/step ({a.clock} clock); {a.rounds} rounds of {a.steps} steps; "
          f"per-step overhead vs the round's unprofiled window (median over rounds, min..max)")
    for name, r in ratios.items():
        print(f"  {name:<15} {100 * statistics.median(r):+6.1f} %  ({100 * min(r):+.1f} .. {100 * max(r):+.1f})")


if __name__ == "__main__":
    main()
