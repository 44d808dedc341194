"""Real GPU traces recorded on one NVIDIA H200 (torch 2.11.0+cu130) by
``benchmarks/gpu/record_kineto.py``; docs/gpu.md has how and the harness's unprofiled step.

* ``mlp_launch_bound``: one rank, tiny kernels: the CPU sets the pace; ``loss.backward()``
  blocks the main thread while autograd's device thread runs the backward pass.
* ``resnet18_gloo2``: DDP over gloo on CUDA tensors, 2 ranks sharing the GPU (NCCL refuses two
  ranks on one device): real cross-rank collectives in GPU traces; gloo copies each step's
  buckets on other streams of torch's stream pool, which dpro names by their order in the step
  (dpro/importers/kineto/streams.py), so that the steps share one structure.

No GPU is needed to read them. ``tests/data/gpu_h200/<job>_rank<r>.json`` is the harness's
ground truth (unprofiled), kept for docs/gpu.md, not compared here: torch.profiler itself
makes these CPU-bound GPU steps 6-50 % longer.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from test_corpus import replay_json  # (it puts benchmarks/fidelity on sys.path)

from kineto_steps import cpu_steps  # noqa: E402  (the one ProfilerStep reader)

DATA = Path(__file__).resolve().parent / "data" / "gpu_h200"


@pytest.mark.parametrize("job", ["mlp_launch_bound", "resnet18_gloo2"])
def test_h200_trace_replays_its_steps(job: str) -> None:
    """measured = the mean CPU step over the steps dpro used (a step slower than 1.5x the median
    is a stall: mlp_launch_bound's last step, 13.3 ms against 8.1-10.1, the profiler stopping);
    the prediction within 5 % of it."""
    d = replay_json(DATA / job)
    steps = cpu_steps(DATA / job)
    used = [steps[s] for s in d["steps"]]
    assert len(used) >= 3
    assert d["measured_iteration_us"] == pytest.approx(statistics.mean(used), rel=0.005)
    assert d["predicted_iteration_us"] == pytest.approx(d["measured_iteration_us"], rel=0.05)


def test_h200_backward_thread_on_the_critical_path() -> None:
    """The main thread's wait for the backward pass is a join edge, not host time."""
    d = replay_json(DATA / "mlp_launch_bound")
    devices = {op["device"] for op in d["critical_path"]}
    assert "worker0/cpu:t1" in devices
    bw = sum(op["dur_us"] for op in d["critical_path"] if op["cat"] == "BW")
    assert bw > 0.4 * d["predicted_iteration_us"]


def test_h200_two_ranks_joined_by_their_collectives() -> None:
    d = replay_json(DATA / "resnet18_gloo2")
    assert d["collectives_expanded"] > 0 and d["link_cost"] is not None
    # the critical path crosses ranks: through the ring's transfers between them
    assert {op["device"] for op in d["critical_path"]} & {"link:0->1", "link:1->0"}
    assert any("GPU streams each run work in few steps" in n for n in d["notes"])
    assert len(d["steps"]) >= 4  # of 5: without the stream names, steps 6-9 were aligned with step 5
