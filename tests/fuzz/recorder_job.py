"""A small real PyTorch training job under dpro.Recorder, for the recorder's input tests
(test_recorder_inputs.py): trains STEPS steps and prints "trained <n> steps <loss>" at the
end, whatever happened to the recording. The environment (DPRO_*) configures the recorder."""

from __future__ import annotations

import sys

import torch

import dpro


def main(steps: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    recorder = dpro.Recorder(model)

    @dpro.profile(recorder)
    def train_one_step() -> float:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return float(loss)

    loss = 0.0
    for _ in range(steps):
        loss = train_one_step()
    print(f"trained {steps} steps {loss:.4f}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 12)
