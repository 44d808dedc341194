"""Record real single-GPU torch.profiler traces with the unprofiled step time as ground truth.

Runs on a machine with an NVIDIA GPU (it needs torch with CUDA and torchvision; dpro is
not needed there). For each job it

1. times ``--reps`` windows of ``--steps`` training steps *without* the profiler, the clock
   read with ``time.perf_counter()`` after a ``torch.cuda.synchronize()`` at both ends of the
   window, so the figure is the steady-state step period (median over the windows);
2. profiles the same job, in the same process, with ``torch.profiler`` (CPU + CUDA,
   ``record_shapes=True``, 3 warm-up and ``--active`` active steps, ``prof.step()`` per step)
   and writes the Chrome trace.

It writes ``OUT/<job>/rank<r>.json.gz`` and ``OUT/<job>/measured_rank<r>.json`` (µs), and trusts
nothing from dpro: the trace is imported and replayed elsewhere (``dpro replay OUT/<job>``).

Jobs:
* ``resnet50_sync``: ResNet-50, batch 64, bf16 autocast, SGD; ``loss.item()`` each step
  (the usual loop: the CPU waits for the GPU once per step).
* ``resnet50_async``: the same without ``loss.item()``: the CPU runs ahead of the GPU
  and the launch queue throttles it (the GPU lag a steady-state replay must not count).
* ``gpt_sync``: a 12-layer decoder (d=1024, 16 heads, seq 1024, batch 8), bf16, AdamW (fused).
* ``mlp_launch_bound``: 24 small linear layers, batch 32: the GPU idles between tiny
  kernels, the CPU's launches set the step time.
* ``resnet18_ddp1``: DDP over NCCL with world size 1 (real NCCL kernels and
  ``record_param_comms`` events, one rank).
* ``resnet18_gloo2``: DDP over gloo on CUDA tensors, 2 processes sharing the one GPU (NCCL
  refuses two ranks on one device): real cross-rank collectives in GPU traces.

Usage (on the GPU machine)::

    python3 benchmarks/gpu/record_kineto.py --out /tmp/gpu_traces
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn


def _resnet(name: str) -> nn.Module:
    import torchvision

    return getattr(torchvision.models, name)(num_classes=1000)


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class _GPT(nn.Module):
    def __init__(self, vocab: int = 32000, d: int = 1024, layers: int = 12, heads: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=idx.device), diagonal=1)
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


def _job(name: str) -> tuple[nn.Module, Callable[[], tuple], Callable, torch.optim.Optimizer, bool]:
    """(model, make_batch, loss_fn, optimizer, sync_each_step) for one job."""
    dev = torch.device("cuda")
    if name.startswith("resnet50"):
        model = _resnet("resnet50").to(dev).to(memory_format=torch.channels_last)
        x = torch.randn(64, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (64,), device=dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        return model, lambda: (x, y), nn.functional.cross_entropy, opt, name.endswith("sync")
    if name == "gpt_sync":
        model = _GPT().to(dev)
        idx = torch.randint(0, 32000, (8, 1024), device=dev)

        def lm_loss(logits: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten())

        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        return model, lambda: (idx, idx), lm_loss, opt, True
    if name == "mlp_launch_bound":
        layers: list[nn.Module] = []
        for _ in range(24):
            layers += [nn.Linear(256, 256), nn.ReLU()]
        model = nn.Sequential(*layers, nn.Linear(256, 10)).to(dev)
        x = torch.randn(32, 256, device=dev)
        y = torch.randint(0, 10, (32,), device=dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        return model, lambda: (x, y), nn.functional.cross_entropy, opt, True
    if name.startswith("resnet18_"):
        import torch.distributed as dist

        model = _resnet("resnet18").to(dev)
        if dist.is_initialized():  # nccl (one rank) or gloo on CUDA tensors (several)
            model = nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=10)
        x = torch.randn(64, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (64,), device=dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        return model, lambda: (x, y), nn.functional.cross_entropy, opt, True
    raise SystemExit(f"unknown job {name}")


JOBS = ["resnet50_sync", "resnet50_async", "gpt_sync", "mlp_launch_bound", "resnet18_ddp1",
        "resnet18_gloo2"]


def _step(model: nn.Module, batch: tuple, loss_fn: Callable, opt: torch.optim.Optimizer,
          sync: bool, autocast: bool = True) -> None:
    x, y = batch
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        loss = loss_fn(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if sync:
        loss.item()


def unprofiled_windows(name: str, steps: int, reps: int) -> tuple[tuple, list[float]]:
    """The job (``_job``) after 10 warm-up steps, and µs per step of ``reps`` timed windows of
    ``steps`` steps without any profiler (synchronised at both ends of each window)."""
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    model, batch, loss_fn, opt, sync = job = _job(name)
    for _ in range(10):  # warm-up: cudnn autotuning, allocator, fused kernels
        _step(model, batch(), loss_fn, opt, sync)
    windows = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            _step(model, batch(), loss_fn, opt, sync)
        torch.cuda.synchronize()
        windows.append((time.perf_counter() - t0) / steps * 1e6)
    return job, windows


def run_job(name: str, out: Path, steps: int, reps: int, active: int, rank: int = 0) -> dict:
    (model, batch, loss_fn, opt, sync), windows = unprofiled_windows(name, steps, reps)
    from torch.profiler import ProfilerActivity, profile, schedule

    jdir = out / name
    jdir.mkdir(parents=True, exist_ok=True)
    raw = jdir / f"rank{rank}.json"
    prof_steps = 2 + 3 + active
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                 schedule=schedule(wait=2, warmup=3, active=active),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        for _ in range(prof_steps):
            _step(model, batch(), loss_fn, opt, sync)
            prof.step()
    torch.cuda.synchronize()
    profiled_wall_us = (time.perf_counter() - t0) * 1e6
    gz = jdir / f"rank{rank}.json.gz"
    with open(raw, "rb") as f, gzip.open(gz, "wb", compresslevel=6) as g:
        shutil.copyfileobj(f, g)
    raw.unlink()
    meta = {
        "job": name,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "sync_each_step": sync,
        "steps_per_window": steps,
        "windows_us": windows,
        "measured_step_us": statistics.median(windows),
        "profiled_steps": prof_steps,
        "profiled_wall_us": profiled_wall_us,
        "active_steps": active,
    }
    (jdir / f"measured_rank{rank}.json").write_text(json.dumps(meta, indent=1))
    print(f"{name}: measured {meta['measured_step_us']:.0f} us/step "
          f"(windows {', '.join(f'{w:.0f}' for w in windows)}), trace "
          f"{gz.stat().st_size / 1e6:.1f} MB", flush=True)
    del model, opt
    torch.cuda.empty_cache()
    return meta


def _rank_main(rank: int, world: int, backend: str, name: str, a: argparse.Namespace) -> None:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(29531 + JOBS.index(name))  # one store per job
    dist.init_process_group(backend, rank=rank, world_size=world)
    run_job(name, a.out, a.steps, a.reps, a.active, rank)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--jobs", default=",".join(JOBS))
    p.add_argument("--steps", type=int, default=30, help="steps per timed window")
    p.add_argument("--reps", type=int, default=3, help="timed windows")
    p.add_argument("--active", type=int, default=5, help="profiled steps")
    a = p.parse_args()
    for name in a.jobs.split(","):
        try:
            if name == "resnet18_ddp1":
                _rank_main(0, 1, "nccl", name, a)
            elif name == "resnet18_gloo2":  # two ranks share the one GPU
                torch.multiprocessing.spawn(_rank_main, args=(2, "gloo", name, a), nprocs=2)
            else:
                run_job(name, a.out, a.steps, a.reps, a.active)
        except Exception as e:  # one failing job must not lose the others' traces
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
