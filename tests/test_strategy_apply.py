"""Strategy files read by the real libraries: profile a real 2-rank DDP job, `dpro optimize` it,
then run the examples with `--dpro-strategy` and check what DDP and Horovod actually built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hvd_util import horovod_skip_reason, horovodrun

from dpro.gtrace.io import load_gtrace
from dpro.optimizer import libraries as lib

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
EX = REPO / "examples" / "pytorch"


def _env() -> dict[str, str]:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("HOROVOD_TIMELINE", None)
    return env


def _dpro(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "dpro.cli", *args], cwd=REPO, capture_output=True, text=True,
                       timeout=timeout, env=_env())
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def _torchrun(port: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(port), *args]


@pytest.fixture(scope="module")
def strategy(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("strategy")
    _dpro("profile", "-o", str(tmp / "trace"), "--warmup", "3", "--steps", "4", "--",
          *_torchrun(29671, str(EX / "ddp_recorder.py"), "--model", "mlp", "--steps", "8", "--bucket-cap-mb", "25"))
    _dpro("optimize", str(tmp / "trace"), "-o", str(tmp / "strategy"), "--budget", "10")
    return tmp / "strategy"


@pytest.mark.slow
@pytest.mark.parametrize("which", ["dpro's", "a set cap", "keep default"])
def test_ddp_builds_the_predicted_buckets(strategy, tmp_path, which):
    plan = json.loads((strategy / "ddp.json").read_text())
    assert plan["buckets"]
    if plan.get("keep_default"):  # dpro predicted no gain over DDP's 25 MB buckets: the job keeps them
        assert plan["bucket_cap_mb"] is None
    else:
        assert plan["bucket_cap_mb"] > 0
    if which == "dpro's":
        # ddp.json alone: a compile.json (op fusion) changes the order gradients become ready in,
        # hence DDP's buckets (the summary says so)
        alone = tmp_path / "ddp-only"
        alone.mkdir()
        (alone / "ddp.json").write_text((strategy / "ddp.json").read_text())
        strategy = alone
    else:  # hand-written ddp.json files, so that both kinds are always exercised
        order = [p for b in plan["buckets"] for p in b]  # gradient-ready order
        size = {t.name: t.bytes for nt in load_gtrace(strategy.parent / "trace").workers() for t in nt.tensors}
        sizes = [size[p] for p in order]
        if which == "a set cap":
            cap_mb = sorted(sizes)[len(order) // 2] / lib.MiB
            plan = {"bucket_cap_mb": cap_mb, "buckets": lib.ddp_buckets(sizes, int(cap_mb * lib.MiB))}
            assert len(plan["buckets"]) > 1
        else:
            plan = {"bucket_cap_mb": None, "keep_default": True,
                    "buckets": lib.ddp_buckets(sizes, lib.DDP_DEFAULT_CAP_BYTES, lib.DDP_FIRST_BUCKET_BYTES)}
        plan["buckets"] = [[order[i] for i in b] for b in plan["buckets"]]
        strategy = tmp_path / "s"
        strategy.mkdir()
        (strategy / "ddp.json").write_text(json.dumps(plan))
    _dpro("profile", "-o", str(tmp_path / "t"), "--warmup", "2", "--steps", "2", "--",
          *_torchrun(29672, str(EX / "ddp_recorder.py"), "--model", "mlp", "--steps", "5",
                     "--dpro-strategy", str(strategy)))
    gt = load_gtrace(tmp_path / "t")
    for nt in gt.workers():
        built = [b["params"] for b in sorted(nt.meta["buckets"], key=lambda b: b["index"])]
        assert built == plan["buckets"]  # what DDP really did with bucket_cap_mb = what dpro predicted


@pytest.mark.slow
@pytest.mark.parametrize("which", ["dpro's", "three groups"])
def test_horovod_takes_the_groups(strategy, tmp_path, which):
    reason = horovod_skip_reason()
    if reason:
        pytest.skip(reason)
    if which == "three groups":  # a hand-written horovod.json, so that several groups are exercised
        strategy = tmp_path / "s"
        strategy.mkdir()
        (strategy / "horovod.json").write_text(json.dumps({"groups": [
            ["6.bias", "6.weight", "4.bias", "4.weight"], ["2.bias", "2.weight"], ["0.bias", "0.weight"]],
            "HOROVOD_FUSION_THRESHOLD": 64 << 20}))  # at least the largest group, or Horovod splits it
    plan = json.loads((strategy / "horovod.json").read_text())
    _dpro("profile", "-o", str(tmp_path / "t"), "--warmup", "2", "--steps", "3", "--",
          horovodrun(), "-np", "2", "--gloo", "-H", "localhost:2",
          sys.executable, str(EX / "hvd_recorder.py"), "--model", "mlp", "--steps", "6",
          "--dpro-strategy", str(strategy))
    gt = load_gtrace(tmp_path / "t")
    if plan.get("keep_default"):  # dpro predicted no gain over Horovod's own fusion: the job keeps it
        assert plan["groups"] is None and plan["HOROVOD_FUSION_THRESHOLD"] == 64 << 20
    for nt in gt.workers():
        atoms = [set(a["tensors"]) for a in nt.meta["horovod"]["atoms"]]
        for group in plan["groups"] or []:
            # Horovod reduced each of dpro's groups as one: the group lies inside one fusion atom
            assert any(set(group) <= a for a in atoms), (group, atoms)
