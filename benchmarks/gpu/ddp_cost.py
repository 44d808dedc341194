"""dpro's recorder on multi-rank DDP GPU jobs: default, shallow ranks, CUDA-light (issue #31).

What ``profiler_cost.py`` does for one process, for DDP: every rank of a job runs the same
sequence of windows, variants interleaved over ``--rounds`` rounds, and rank 0 times each
window (``torch.cuda.synchronize()`` at both ends; the ranks are held together by DDP's
all-reduce, so rank 0's wall is the job's step):

* ``off``: no profiler;
* ``dpro``: dpro's two-line recorder as configured by default (a fresh ``dpro.Recorder`` per
  window; 2 untimed calls, ``--steps`` timed, one untimed that ends the window);
* ``dpro_shallow``: the same with ``DPRO_SHALLOW_RANKS=1`` (ranks other than 0 stop
  torch.profiler after the window's first call; skipped at world size 1);
* ``dpro_light``: the same with ``DPRO_CUDA_LIGHT=1`` (CPU operators in the first call only);
* ``dpro_nodefer``: the default with ``DPRO_DEFER_WRITE=0`` (the trace exported in the window's
  last call, before the recorder's calls timed after the window; not run unless named).

``--after-every``: every recorder window also runs the recorder's calls after the window, and
``OUT/<job>.json`` gets rank 0's median of them per window (``after_us``): the pace the
unprofiled correction scales to, next to the ``off`` windows.

In the last round each recorder variant keeps its trace (``OUT/<job>/<variant>/``, with the
recorder's 20 calls timed after the window) for ``dpro collect`` + ``dpro replay`` elsewhere;
``OUT/<job>.json`` holds every window's µs per step. Jobs:

* ``resnet18_ddp1``: ResNet-18 in DDP over NCCL, world size 1;
* ``resnet18_gloo2``: ResNet-18 in DDP over gloo on CUDA tensors, 2 ranks sharing the GPU
  (NCCL refuses two ranks on one device);
* ``mlp_gloo2``: record_kineto's ``mlp_launch_bound`` (24 tiny layers: the CPU's launches set
  the pace) in DDP over gloo, 2 ranks sharing the GPU.

``--cpu`` runs a small MLP on the CPU instead (gloo, 2 ranks), to check the harness itself on
a machine without a GPU. Usage::

    PYTHONPATH=. python3 benchmarks/gpu/ddp_cost.py --out /tmp/ddp --rounds 4    # GPU machine
    PYTHONPATH=. python3 benchmarks/gpu/ddp_cost.py --out /tmp/ddp --cpu --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_kineto import _step as kineto_step  # noqa: E402

JOBS = {"resnet18_ddp1": ("nccl", 1), "resnet18_gloo2": ("gloo", 2), "mlp_gloo2": ("gloo", 2)}
VARIANTS = ("off", "dpro", "dpro_shallow", "dpro_light", "dpro_nodefer")
ENV = {"dpro": {}, "dpro_shallow": {"DPRO_SHALLOW_RANKS": "1"}, "dpro_light": {"DPRO_CUDA_LIGHT": "1"},
       "dpro_nodefer": {"DPRO_DEFER_WRITE": "0"}}


def _job(name: str, cpu: bool) -> tuple:
    """(model, make_batch, loss_fn, optimizer, sync): record_kineto's job, in DDP."""
    if cpu:
        layers: list[nn.Module] = []
        for _ in range(8):
            layers += [nn.Linear(128, 128), nn.ReLU()]
        model: nn.Module = nn.Sequential(*layers, nn.Linear(128, 10))
        x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        return nn.parallel.DistributedDataParallel(model), lambda: (x, y), nn.functional.cross_entropy, opt, True
    from record_kineto import _job as kineto_job

    model, batch, loss_fn, opt, sync = kineto_job("mlp_launch_bound" if name == "mlp_gloo2" else name)
    if not isinstance(model, nn.parallel.DistributedDataParallel):
        model = nn.parallel.DistributedDataParallel(model, device_ids=[0])
    return model, batch, loss_fn, opt, sync


def _step(job: tuple, cpu: bool) -> None:
    model, batch, loss_fn, opt, sync = job
    kineto_step(model, batch(), loss_fn, opt, sync, autocast=not cpu)  # bf16 autocast on the GPU


def _sync(cpu: bool) -> None:
    if not cpu:
        torch.cuda.synchronize()


def _window(job: tuple, variant: str, steps: int, cpu: bool, out: Path | None,
            after: bool = False) -> tuple[float, float | None]:
    """µs per step of ``steps`` timed calls under ``variant``, and rank 0's median of the
    recorder's calls after the window where they ran (with ``out``, which keeps the trace, or
    ``after``)."""
    if variant == "off":
        _sync(cpu)
        t0 = time.perf_counter()
        for _ in range(steps):
            _step(job, cpu)
        _sync(cpu)
        return (time.perf_counter() - t0) / steps * 1e6, None
    import dpro

    env = ENV[variant]
    os.environ.update(env)
    tmp = None
    if out is None:
        tmp = tempfile.TemporaryDirectory(prefix="dpro-ddp-cost-")
        out = Path(tmp.name)
    try:
        rec = dpro.Recorder(job[0], out_dir=str(out), warmup=0, steps=steps + 3)
    finally:
        for k in env:
            del os.environ[k]

    @dpro.profile(rec)
    def call() -> None:
        _step(job, cpu)

    for _ in range(2):
        call()
    _sync(cpu)
    t0 = time.perf_counter()
    for _ in range(steps):
        call()
    _sync(cpu)
    us = (time.perf_counter() - t0) / steps * 1e6
    call()  # ends the window
    ran = tmp is None or after
    if ran:
        for _ in range(rec.config.after):  # the recorder's timed calls after the window
            call()
    rec.close()
    after_us = None
    meta = out / "rank0.meta.json"
    if ran and dist.get_rank() == 0 and meta.is_file():
        walls = json.loads(meta.read_text()).get("step_wall_after_us") or []
        after_us = statistics.median(walls) if walls else None
    if tmp is not None:
        dist.barrier()  # every rank has written (and rank 0 read) before the folder goes
        tmp.cleanup()
    return us, after_us


def _rank_main(rank: int, world: int, backend: str, name: str, a: argparse.Namespace) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(29600 + list(JOBS).index(name))
    dist.init_process_group(backend, rank=rank, world_size=world)
    torch.manual_seed(0)
    if not a.cpu:
        torch.backends.cudnn.benchmark = True
    else:
        torch.set_num_threads(1)
    job = _job(name, a.cpu)
    for _ in range(10):
        _step(job, a.cpu)
    variants = [v for v in a.variants.split(",") if not (v == "dpro_shallow" and world == 1)
                and not (v == "dpro_light" and a.cpu)]
    res: dict[str, list[float]] = {v: [] for v in variants}
    after: dict[str, list[float | None]] = {v: [] for v in variants if v != "off"}
    for r in range(a.rounds):
        for v in variants:
            keep = a.out / name / v if r == a.rounds - 1 and v != "off" else None
            us, after_us = _window(job, v, a.steps, a.cpu, keep, a.after_every)
            res[v].append(us)
            if v != "off":
                after[v].append(after_us)
    if rank == 0:
        off = statistics.median(res["off"])
        meta = {"job": name, "world": world, "backend": backend, "torch": torch.__version__,
                "device": "cpu" if a.cpu else torch.cuda.get_device_name(0),
                "steps": a.steps, "rounds": a.rounds, "windows_us": res,
                "median_us": {v: statistics.median(t) for v, t in res.items()}, "after_us": after}
        (a.out / f"{name}.json").write_text(json.dumps(meta, indent=1))
        print(f"{name}: " + ", ".join(
            f"{v} {statistics.median(t):.0f} us ({100 * (statistics.median(t) / off - 1):+.1f} %)"
            for v, t in res.items()), flush=True)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--jobs", default=",".join(JOBS))
    p.add_argument("--variants", default=",".join(VARIANTS[:4]))
    p.add_argument("--after-every", action="store_true",
                   help="run the recorder's calls after every window and keep rank 0's median of them")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--cpu", action="store_true", help="a small CPU MLP instead (checks the harness)")
    p.add_argument("--tar", type=Path, default=None, help="also pack OUT/<job> into TAR/<job>.tgz")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    for name in a.jobs.split(","):
        backend, world = JOBS[name]
        if a.cpu:
            backend, world = "gloo", 2
        try:
            torch.multiprocessing.spawn(_rank_main, args=(world, backend, name, a), nprocs=world)
        except Exception as e:  # one failing job must not lose the others' results
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)
        if a.tar is not None and (a.out / name).is_dir():
            a.tar.mkdir(parents=True, exist_ok=True)
            shutil.make_archive(str(a.tar / name), "gztar", a.out, name)


if __name__ == "__main__":
    main()
