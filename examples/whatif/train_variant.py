"""One-process training of the example models (examples/pytorch/models.py) in the variants
the what-ifs predict: plain, bf16 autocast (``--amp``), a ``foreach`` or ``fused`` optimizer.

    python examples/whatif/train_variant.py --model mlp --profile-dir /tmp/plain     # profile the plain job
    dpro whatif /tmp/plain --apply mixed_precision --json                            # predict AMP
    python examples/whatif/train_variant.py --model mlp --amp --timing-out /tmp/amp.json   # measure it

One intra-op thread; ``--timing-out``: per-step wall-clock µs (``time.perf_counter()`` step
start to step start) after ``--warmup``; ``--profile-dir``: a torch.profiler trace
(``rank0.json.gz``, shapes recorded) of ``--active`` steps after the warm-up.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pytorch"))
from models import DEFAULT_BATCH_SIZE, MODEL_NAMES, build  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=MODEL_NAMES, default="mlp")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--amp", action="store_true", help="torch.autocast('cpu', dtype=torch.bfloat16)")
    p.add_argument("--optimizer", choices=["sgd", "sgd-foreach", "sgd-fused"], default="sgd")
    p.add_argument("--profile-dir", type=Path, default=None)
    p.add_argument("--active", type=int, default=5)
    p.add_argument("--timing-out", type=Path, default=None)
    a = p.parse_args()
    if a.steps <= a.warmup + (a.active if a.profile_dir else 0):
        p.error("--steps must exceed --warmup (+ --active when profiling)")
    torch.set_num_threads(1)
    model, make_batch, loss_fn = build(a.model)
    kw = {"foreach": True} if a.optimizer == "sgd-foreach" else {"fused": True} if a.optimizer == "sgd-fused" else {
        "foreach": False}
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, **kw)
    batches = [make_batch(a.batch_size or DEFAULT_BATCH_SIZE[a.model]) for _ in range(4)]
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if a.amp else contextlib.nullcontext()
    prof = None
    if a.profile_dir:
        from torch.profiler import ProfilerActivity, profile, schedule

        prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                       schedule=schedule(skip_first=a.warmup - 1, wait=0, warmup=1, active=a.active, repeat=1))
        prof.__enter__()
    starts = []
    for step in range(a.steps):
        starts.append(time.perf_counter())
        x, y = batches[step % 4]
        opt.zero_grad(set_to_none=True)
        with amp:
            out = model(x)
        loss = loss_fn(out.float(), y)
        loss.backward()
        opt.step()
        if prof is not None:
            prof.step()
    starts.append(time.perf_counter())
    if prof is not None:
        prof.__exit__(None, None, None)
        a.profile_dir.mkdir(parents=True, exist_ok=True)
        raw = a.profile_dir / "rank0.json"
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as fin, gzip.open(a.profile_dir / "rank0.json.gz", "wb") as fout:
            shutil.copyfileobj(fin, fout)
        raw.unlink()
    step_us = [(b - s) * 1e6 for s, b in zip(starts[a.warmup:], starts[a.warmup + 1:])]
    if a.timing_out:
        a.timing_out.write_text(json.dumps({"step_us": step_us, "model": a.model, "amp": a.amp,
                                            "optimizer": a.optimizer}))
    print(f"[train_variant] {a.model} amp={a.amp} optimizer={a.optimizer}: median step "
          f"{statistics.median(step_us) / 1e3:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
