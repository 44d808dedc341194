"""Small but non-trivial example models for the dpro DDP examples and fidelity harness.

Three models of deliberately different shape:

* ``mlp``: a few large ``Linear`` layers (~8.4 M parameters, ~34 MB of fp32 gradients), so
  gradient all-reduce is a visible share of the step.
* ``convnet``: four conv layers + a linear head on 3x32x32 images: compute-heavy, few
  parameters (~0.77 M), so communication is small.
* ``transformer``: token embedding, 3 ``nn.TransformerEncoderLayer`` (d_model 128) and a
  vocabulary head (~1.1 M parameters): many small tensors of mixed size.

Everything is seeded: the same ``build(name)`` call gives the same weights and the same
batches on every rank and every run.

Usage::

    model, make_batch, loss_fn = build("mlp")
    x, y = make_batch(64)
    loss = loss_fn(model(x), y)
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]
BatchFn = Callable[[int], Batch]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

MODEL_NAMES = ("mlp", "convnet", "transformer")

#: Default per-rank batch sizes, chosen so a 2-rank gloo step on a 2-core CPU VM with
#: ``torch.set_num_threads(1)`` per rank takes roughly 30-300 ms.
DEFAULT_BATCH_SIZE = {"mlp": 32, "convnet": 32, "transformer": 16}

SEED = 1234

# MLP shape.
MLP_IN, MLP_HIDDEN, MLP_OUT = 1024, 2048, 10
# Convnet shape.
IMG_CHANNELS, IMG_SIZE, NUM_CLASSES = 3, 32, 10
# Transformer shape.
VOCAB, SEQ_LEN, D_MODEL, N_HEAD, D_FF, N_LAYERS = 2000, 64, 128, 4, 512, 3


def _mlp() -> nn.Module:
    """Four Linear layers 1024 -> 2048 -> 2048 -> 1024 -> 10 (~8.4 M parameters)."""
    return nn.Sequential(
        nn.Linear(MLP_IN, MLP_HIDDEN),
        nn.ReLU(),
        nn.Linear(MLP_HIDDEN, MLP_HIDDEN),
        nn.ReLU(),
        nn.Linear(MLP_HIDDEN, MLP_IN),
        nn.ReLU(),
        nn.Linear(MLP_IN, MLP_OUT),
    )


def _conv_block(cin: int, cout: int, pool: bool) -> list[nn.Module]:
    """Conv 3x3 + ReLU, optionally followed by 2x2 max-pooling."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel_size=3, padding=1), nn.ReLU()]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return layers


def _convnet() -> nn.Module:
    """Four 3x3 conv layers (32-64-128-128 channels) and a two-layer head (~0.77 M params)."""
    return nn.Sequential(
        *_conv_block(IMG_CHANNELS, 32, pool=False),
        *_conv_block(32, 64, pool=True),  # 16x16
        *_conv_block(64, 128, pool=True),  # 8x8
        *_conv_block(128, 128, pool=True),  # 4x4
        nn.Flatten(),
        nn.Linear(128 * 4 * 4, 256),
        nn.ReLU(),
        nn.Linear(256, NUM_CLASSES),
    )


class TinyTransformer(nn.Module):
    """Token + learned position embedding, a TransformerEncoder stack and a vocabulary head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Parameter(torch.zeros(1, SEQ_LEN, D_MODEL))
        layer = nn.TransformerEncoderLayer(
            D_MODEL, N_HEAD, dim_feedforward=D_FF, dropout=0.0, batch_first=True
        )
        # enable_nested_tensor only matters for padded inference; keep the plain path.
        self.encoder = nn.TransformerEncoder(layer, N_LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Map ``[B, T]`` token ids to ``[B, T, VOCAB]`` logits."""
        h = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        return self.head(self.encoder(h))


def _batch_fn(name: str) -> BatchFn:
    """A deterministic synthetic-batch generator for model ``name``."""
    gen = torch.Generator().manual_seed(SEED + 1)

    def mlp_batch(batch_size: int) -> Batch:
        x = torch.randn(batch_size, MLP_IN, generator=gen)
        return x, torch.randint(0, MLP_OUT, (batch_size,), generator=gen)

    def conv_batch(batch_size: int) -> Batch:
        x = torch.randn(batch_size, IMG_CHANNELS, IMG_SIZE, IMG_SIZE, generator=gen)
        return x, torch.randint(0, NUM_CLASSES, (batch_size,), generator=gen)

    def lm_batch(batch_size: int) -> Batch:
        tokens = torch.randint(0, VOCAB, (batch_size, SEQ_LEN + 1), generator=gen)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    return {"mlp": mlp_batch, "convnet": conv_batch, "transformer": lm_batch}[name]


def _lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over every position of a ``[B, T, V]`` logit tensor."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def build(name: str) -> tuple[nn.Module, BatchFn, LossFn]:
    """Return ``(model, make_batch, loss_fn)`` for ``name`` (one of :data:`MODEL_NAMES`).

    Weights are initialised from a fixed seed, so every rank starts identical.
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODEL_NAMES)}")
    torch.manual_seed(SEED)
    factories: dict[str, Callable[[], nn.Module]] = {
        "mlp": _mlp,
        "convnet": _convnet,
        "transformer": TinyTransformer,
    }
    model = factories[name]()
    loss_fn: LossFn = _lm_loss if name == "transformer" else nn.functional.cross_entropy
    return model, _batch_fn(name), loss_fn


def num_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
