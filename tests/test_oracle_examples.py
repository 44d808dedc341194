"""The parallel strategies of examples/parallel/ compute the serial model's loss.

Real torch.distributed jobs over gloo (2 and 4 processes, about 15 s in all): every
strategy trains 4 steps from one seed and must give the serial model's loss at every step
(as ParaDL checks its implementations against data parallelism).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "parallel"
STEPS = 4


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serial_losses() -> list[float]:
    import torch.nn.functional as F

    sys.path.insert(0, str(EXAMPLES))
    try:
        from strategies import build_serial, make_batch
    finally:
        sys.path.remove(str(EXAMPLES))
    m = build_serial(0)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    out = []
    for i in range(STEPS):
        x, y = make_batch(0, i, 32)
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        out.append(float(loss.detach()))
    return out


def _run(tmp: Path, n: int, strategies: str, *extra: str) -> dict[str, list[float]]:
    out = tmp / f"loss{n}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "--master_addr", "127.0.0.1",
           "--master_port", str(_port()), str(EXAMPLES / "train.py"), "--strategy", strategies,
           "--steps", str(STEPS), "--batch", "32", "--loss-out", str(out), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPRO_")} | {"OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())["loss"]


@pytest.mark.parametrize("n,strategies", [
    (2, "data,filter,channel,spatial,pipeline"),
    (4, "data,filter,channel,spatial,pipeline,data+filter,data+spatial"),
])
def test_same_loss_as_serial(tmp_path: Path, n: int, strategies: str) -> None:
    ref = _serial_losses()
    assert len(set(round(x, 4) for x in ref)) == STEPS  # the loss moves: a wrong gradient would show
    timing = tmp_path / "t_{rank}.json"  # the step timing (and its wrapped collectives) leave the loss alone
    got = _run(tmp_path, n, strategies, "--timing-out", str(timing), "--timing-skip", "1")
    assert sorted(got) == sorted(strategies.split(","))
    for s, losses in got.items():
        assert losses == pytest.approx(ref, rel=1e-5, abs=1e-6), s
    for r in range(n):  # each step's CPU split and time inside the strategy's collectives
        t = json.loads(Path(str(timing).format(rank=r)).read_text())
        for s in got:
            split = t["cpu_us"][s]
            assert len(split) == len(t["step_us"][s]) == STEPS - 1
            assert all(x["main_cpu"] > 0 and x["comm"] <= w for x, w in zip(split, t["step_us"][s])), s
            # DDP all-reduces inside its backward (not a wrapped call); the others call torch.distributed
            assert (max(x["comm"] for x in split) > 0) == (s != "data"), s
