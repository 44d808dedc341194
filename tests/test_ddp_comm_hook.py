"""dpro's DDP bucket hook across recorders: DDP takes one comm hook per model and cannot drop
it, so a second ``dpro.Recorder`` on the same model (another window of the same job) must reuse
dpro's hook rather than lose its buckets. A real one-rank gloo DDP model on the CPU."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def ddp_model(tmp_path, monkeypatch):
    monkeypatch.setenv("DPRO_AFTER_STEPS", "0")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        yield torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0005)
    finally:
        dist.destroy_process_group()


def _window(model, out) -> dict:
    import dpro

    rec = dpro.Recorder(model, out_dir=str(out), warmup=1, steps=2)
    step = dpro.profile(rec)(lambda: model(torch.randn(4, 16)).sum().backward())
    for _ in range(3):
        step()
    rec.close()
    return json.loads((out / "rank0.meta.json").read_text())


def test_second_recorder_on_the_same_model_gets_the_buckets(ddp_model, tmp_path, caplog):
    first = _window(ddp_model, tmp_path / "a")["buckets"]
    second = _window(ddp_model, tmp_path / "b")["buckets"]
    assert first and first[0]["bytes"] == 4 * (16 * 16 + 16 + 16 + 1)
    assert second == first
    assert "cannot register the DDP bucket hook" not in caplog.text


def test_a_jobs_own_hook_is_kept(ddp_model, tmp_path, caplog):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    ddp_model.register_comm_hook(None, default_hooks.allreduce_hook)
    meta = _window(ddp_model, tmp_path / "a")
    assert meta["buckets"] == []
    assert "cannot register the DDP bucket hook" in caplog.text


@pytest.mark.parametrize("env,local,want", [
    ({}, "8", True),  # unset: 8 local ranks on this host's fewer cores, DDP over every rank
    ({}, "1", False),  # unset: a core each
    ({"DPRO_SHALLOW_RANKS": "0"}, "8", False),
    ({"DPRO_SHALLOW_RANKS": "1"}, "1", True),
])
def test_shallow_ranks_where_ranks_share_cores(ddp_model, tmp_path, monkeypatch, env, local, want):
    """Shallow ranks by default only where the host runs more ranks of a DDP model over every
    rank than it has cores (LOCAL_WORLD_SIZE against os.cpu_count()); DPRO_SHALLOW_RANKS
    decides where set."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert _shallow_wanted(ddp_model, tmp_path, monkeypatch, local, 16) is want


def test_no_shallow_ranks_for_a_plain_model(tmp_path, monkeypatch):
    assert _shallow_wanted(torch.nn.Linear(16, 1), tmp_path, monkeypatch, "8", 16) is False


def _shallow_wanted(model, tmp_path, monkeypatch, local: str, width: int) -> bool:
    """The recorder's decision on a host of 2 cores running ``local`` ranks."""
    import os

    import dpro

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    monkeypatch.setenv("DPRO_AFTER_STEPS", "0")
    rec = dpro.Recorder(model, out_dir=str(tmp_path), warmup=0, steps=2)
    step = dpro.profile(rec)(lambda: model(torch.randn(4, width)).sum().backward())
    step()
    wanted = rec._backend._shallow_wanted()
    step()
    rec.close()
    return wanted
