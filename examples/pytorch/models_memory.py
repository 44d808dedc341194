"""One more example model for the memory benchmark: a small residual network.

``resnet``: a 3x3 stem, three residual stages of two blocks (Conv-BN-ReLU-Conv-BN + skip,
32/64/128 channels, stride 2 between stages) and a linear head on 3x32x32 images
(~0.7 M parameters). Unlike the models in ``models.py`` it has BatchNorm buffers (running
statistics, kept across iterations) and many activations that backward keeps (each BN's
input and output, the skips), so its memory is dominated by activations.

    model, make_batch, loss_fn = build("resnet")
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

MODEL_NAMES = ("resnet",)
DEFAULT_BATCH_SIZE = {"resnet": 16}
SEED = 1234
IMG_CHANNELS, IMG_SIZE, NUM_CLASSES = 3, 32, 10


class Block(nn.Module):
    """Conv-BN-ReLU-Conv-BN with an identity (or 1x1 strided) skip, then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(y + self.skip(x))


class ResNet(nn.Module):
    """Stem, three stages of two blocks, global average pooling, linear head."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(IMG_CHANNELS, widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks: list[nn.Module] = []
        cin = widths[0]
        for i, w in enumerate(widths):
            blocks += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(cin, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


def build(name: str) -> tuple[nn.Module, Callable[[int], tuple[torch.Tensor, torch.Tensor]], Callable]:
    """``(model, make_batch, loss_fn)`` for ``name`` (seeded: identical on every rank)."""
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODEL_NAMES)}")
    torch.manual_seed(SEED)
    model = ResNet()
    gen = torch.Generator().manual_seed(SEED + 1)

    def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch_size, IMG_CHANNELS, IMG_SIZE, IMG_SIZE, generator=gen)
        return x, torch.randint(0, NUM_CLASSES, (batch_size,), generator=gen)

    return model, make_batch, nn.functional.cross_entropy
