"""A small CNN and its seven parallel decompositions over torch.distributed (gloo).

Every strategy starts from the same serial model (``build_serial(seed)``) and slices it, so
that with one seed every strategy computes the same loss as the serial model (and as data
parallelism) on the same global batch: ``tests/test_oracle_examples.py`` checks it.
The layer names (``conv1`` ... ``fc``) are the same in every strategy, so that dpro's
recorder annotates the same layers (``dpro.layer::<name>``) and the oracle's per-layer
predictions can be put next to what each strategy measures (docs/oracle.md).

* data: DDP, each rank B/p samples;
* filter: each rank F/p filters (output channels) of every conv and fc, an all-gather of
  the activations after each block (backward: an all-reduce of the input gradient);
* channel: each rank C/p input channels, an all-reduce of the partial outputs in the
  forward pass (backward: an all-gather of the input gradient);
* spatial: each rank H/p rows of every sample, a halo exchange (send/recv) before each
  3x3 conv, an all-gather of the rows before the (replicated) fc, an all-reduce of the conv
  gradients;
* pipeline: contiguous stages of layers, GPipe (all forward micro-batches, then all
  backward) with send/recv of activations and gradients;
* data+filter, data+spatial: p1 data groups of p2 ranks (``--p2``), the model strategy
  inside a group, gradients averaged across the groups.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

STRATEGIES = ("data", "filter", "channel", "spatial", "pipeline", "data+filter", "data+spatial")
IN_CHANNELS, SIZE, CLASSES = 4, 16, 8
#: layers whose weights are sliced by filter / channel parallelism
WEIGHTED = ("conv1", "conv2", "conv3", "fc")


def build_serial(seed: int, width: int = 32) -> nn.Sequential:
    """The reference CNN: three 3x3 convs (one 2x2 max-pool), a linear classifier."""
    torch.manual_seed(seed)
    half = max(1, width // 2)
    return nn.Sequential(OrderedDict([
        ("conv1", nn.Conv2d(IN_CHANNELS, half, 3, padding=1)), ("relu1", nn.ReLU()),
        ("conv2", nn.Conv2d(half, width, 3, padding=1)), ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
        ("conv3", nn.Conv2d(width, width, 3, padding=1)), ("relu3", nn.ReLU()),
        ("flatten", nn.Flatten()), ("fc", nn.Linear(width * (SIZE // 2) ** 2, CLASSES)),
    ]))


def make_batch(seed: int, step: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step (the same on every rank)."""
    g = torch.Generator().manual_seed(seed * 1000 + step)
    return torch.randn(batch, IN_CHANNELS, SIZE, SIZE, generator=g), torch.randint(0, CLASSES, (batch,), generator=g)


def chunk(n: int, p: int, i: int) -> slice:
    """The i-th of p equal parts of range(n) (n divisible by p)."""
    if n % p:
        raise ValueError(f"{n} is not divisible by {p}")
    return slice(i * n // p, (i + 1) * n // p)


@dataclass
class Groups:
    """This rank's place: the model-parallel group (size p2) and the data group (size p1)."""

    model: object  # ProcessGroup
    model_rank: int
    p2: int
    data: object
    data_rank: int
    p1: int


def make_groups(p2: int) -> Groups:
    """p1 = world / p2 data groups of p2 consecutive ranks (every rank creates every group)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % p2:
        raise ValueError(f"--p2 {p2} does not divide the world size {world}")
    p1 = world // p2
    model_groups = [dist.new_group(list(range(d * p2, (d + 1) * p2))) for d in range(p1)]
    data_groups = [dist.new_group(list(range(f, world, p2))) for f in range(p2)]
    return Groups(model_groups[rank // p2], rank % p2, p2, data_groups[rank % p2], rank // p2, p1)


# ------------------------------------------------------------------ autograd collectives
class _GatherChannels(torch.autograd.Function):
    """Forward: all-gather along dim 1. Backward: all-reduce (sum of the partial input
    gradients of the ranks' filter slices) unless ``reduce`` is off, then this rank's slice."""

    @staticmethod
    def forward(ctx, x, group, rank, p, reduce):
        ctx.group, ctx.rank, ctx.p, ctx.reduce = group, rank, p, reduce
        parts = [torch.empty_like(x) for _ in range(p)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        if ctx.reduce:
            dist.all_reduce(g, group=ctx.group)
        return g[:, chunk(g.shape[1], ctx.p, ctx.rank)].contiguous(), None, None, None, None


class _SliceChannels(torch.autograd.Function):
    """Forward: this rank's slice of dim 1. Backward: all-gather of the slices' gradients."""

    @staticmethod
    def forward(ctx, x, group, rank, p):
        ctx.group, ctx.p = group, p
        return x[:, chunk(x.shape[1], p, rank)].contiguous()

    @staticmethod
    def backward(ctx, g):
        parts = [torch.empty_like(g) for _ in range(ctx.p)]
        dist.all_gather(parts, g.contiguous(), group=ctx.group)
        return torch.cat(parts, dim=1), None, None, None


class _AllReduce(torch.autograd.Function):
    """Forward: sum of the ranks' partial outputs. Backward: identity (the gradient is
    the same on every rank)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherRows(torch.autograd.Function):
    """Forward: all-gather along dim 2 (rows). Backward: this rank's rows (what follows is
    replicated, so every rank has the whole gradient)."""

    @staticmethod
    def forward(ctx, x, group, rank, p):
        ctx.rank, ctx.p = rank, p
        parts = [torch.empty_like(x) for _ in range(p)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, g):
        return g[:, :, chunk(g.shape[2], ctx.p, ctx.rank)].contiguous(), None, None, None


def _exchange(send: dict[int, torch.Tensor], recv: dict[int, torch.Tensor], ranks: list[int]) -> None:
    """Post every send and receive to the neighbours (group-local index -> tensor), wait."""
    reqs = [dist.isend(t.contiguous(), ranks[i]) for i, t in send.items()]
    reqs += [dist.irecv(t, ranks[i]) for i, t in recv.items()]
    for r in reqs:
        r.wait()


class _Halo(torch.autograd.Function):
    """Forward: add ``h`` rows above and below from the neighbours (zeros at the image's
    border). Backward: send the halo rows' gradients back to their owners and add theirs."""

    @staticmethod
    def forward(ctx, x, ranks, rank, h):
        ctx.ranks, ctx.rank, ctx.h = ranks, rank, h
        p = len(ranks)
        top = torch.zeros_like(x[:, :, :h])
        bottom = torch.zeros_like(x[:, :, -h:])
        send, recv = {}, {}
        if rank > 0:
            send[rank - 1], recv[rank - 1] = x[:, :, :h], top
        if rank < p - 1:
            send[rank + 1], recv[rank + 1] = x[:, :, -h:], bottom
        _exchange(send, recv, ranks)
        return torch.cat([top, x, bottom], dim=2)

    @staticmethod
    def backward(ctx, g):
        h, rank, p = ctx.h, ctx.rank, len(ctx.ranks)
        gx = g[:, :, h:-h].clone()
        from_up, from_down = torch.zeros_like(gx[:, :, :h]), torch.zeros_like(gx[:, :, -h:])
        send, recv = {}, {}
        if rank > 0:
            send[rank - 1], recv[rank - 1] = g[:, :, :h], from_up
        if rank < p - 1:
            send[rank + 1], recv[rank + 1] = g[:, :, -h:], from_down
        _exchange(send, recv, ctx.ranks)
        gx[:, :, :h] += from_up
        gx[:, :, -h:] += from_down
        return gx, None, None, None


# ------------------------------------------------------------------ the sliced models
def _sliced_conv_or_fc(m: nn.Module, out: slice | None = None, inp: slice | None = None, bias: bool = True) -> nn.Module:
    w = m.weight.detach()
    w = w[out] if out is not None else w
    w = w[:, inp] if inp is not None else w
    if isinstance(m, nn.Conv2d):
        new: nn.Module = nn.Conv2d(w.shape[1], w.shape[0], m.kernel_size, m.stride, m.padding, bias=bias)
    else:
        new = nn.Linear(w.shape[1], w.shape[0], bias=bias)
    with torch.no_grad():
        new.weight.copy_(w)
        if bias:
            new.bias.copy_(m.bias.detach()[out] if out is not None else m.bias.detach())
    return new


class FilterNet(nn.Module):
    """F/p filters of every weighted layer; all-gather after each block (conv + its ReLU/pool)."""

    def __init__(self, serial: nn.Sequential, group, rank: int, p: int) -> None:
        super().__init__()
        self.group, self.rank, self.p = group, rank, p
        for name, m in serial.named_children():
            if name in WEIGHTED:
                m = _sliced_conv_or_fc(m, out=chunk(m.weight.shape[0], p, rank))
            self.add_module(name, m)
        self.gather_after = {"relu1": True, "pool2": True, "relu3": True, "fc": False}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name, m in self.named_children():
            x = m(x)
            if name in self.gather_after:
                x = _GatherChannels.apply(x, self.group, self.rank, self.p, self.gather_after[name])
        return x


class ChannelNet(nn.Module):
    """C/p input channels of every weighted layer; all-reduce of the partial outputs.
    The bias is added once (by the group's rank 0); ReLU and pool run on the whole tensor."""

    def __init__(self, serial: nn.Sequential, group, rank: int, p: int) -> None:
        super().__init__()
        self.group, self.rank, self.p = group, rank, p
        for name, m in serial.named_children():
            if name in WEIGHTED:
                m = _sliced_conv_or_fc(m, inp=chunk(m.weight.shape[1], p, rank), bias=rank == 0)
            self.add_module(name, m)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name, m in self.named_children():
            if name in WEIGHTED:
                x = _SliceChannels.apply(x, self.group, self.rank, self.p)
                x = _AllReduce.apply(m(x), self.group)
            else:
                x = m(x)
        return x


class SpatialNet(nn.Module):
    """H/p rows of every sample; a halo exchange before each 3x3 conv (which then pads the
    width only), an all-gather of the rows before the flatten; the fc is replicated."""

    def __init__(self, serial: nn.Sequential, ranks: list[int], group, rank: int) -> None:
        super().__init__()
        self.ranks, self.group, self.rank = ranks, group, rank
        for name, m in serial.named_children():
            if isinstance(m, nn.Conv2d):
                new = nn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, m.stride, (0, m.padding[1]))
                new.load_state_dict(m.state_dict())
                m = new
            self.add_module(name, m)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = len(self.ranks)
        x = x[:, :, chunk(x.shape[2], p, self.rank)]
        for name, m in self.named_children():
            if isinstance(m, nn.Conv2d):
                x = _Halo.apply(x, self.ranks, self.rank, m.kernel_size[0] // 2)
            if name == "flatten":
                x = _GatherRows.apply(x, self.group, self.rank, p)
            x = m(x)
        return x

    def spatial_parameters(self) -> list[nn.Parameter]:
        """The conv parameters: their gradients are partial sums over the rows."""
        return [q for n, q in self.named_parameters() if not n.startswith("fc.")]


def balanced_stages(costs: list[float], p: int, allowed: list[int] | None = None) -> list[int]:
    """Cut points (first layer index of stages 1..p-1) of the contiguous split of ``costs``
    into p stages that minimises the largest stage (exhaustive over the ``allowed`` cut
    points, default every layer boundary: few layers)."""
    from itertools import combinations

    n = len(costs)
    allowed = list(range(1, n)) if allowed is None else [a for a in allowed if 0 < a < n]
    if p - 1 > len(allowed):
        raise ValueError(f"{p} stages for {n} layers")
    best, best_cuts = float("inf"), allowed[:p - 1]
    for cuts in combinations(allowed, p - 1):
        b = [0, *cuts, n]
        worst = max(sum(costs[b[i]:b[i + 1]]) for i in range(p))
        if worst < best:
            best, best_cuts = worst, list(cuts)
    return best_cuts


def stage_of(serial: nn.Sequential, cuts: list[int], stage: int) -> nn.Sequential:
    """The layers of one pipeline stage (same names as the serial model)."""
    b = [0, *cuts, len(serial)]
    items = list(serial.named_children())[b[stage]:b[stage + 1]]
    return nn.Sequential(OrderedDict(items))


def gpipe_step(stage: nn.Sequential, rank: int, p: int, x: torch.Tensor, y: torch.Tensor, micro: int,
               out_shapes: list[tuple[int, ...]]) -> float:
    """One GPipe iteration of ``stage`` (rank = stage index): every micro-batch forward,
    then every micro-batch backward, send/recv between neighbouring stages. ``out_shapes``:
    the activation shape each stage sends, per micro-batch. Returns the loss (last stage; 0 elsewhere)."""
    xs, ys = x.chunk(micro), y.chunk(micro)
    saved = []
    total = 0.0
    for j in range(micro):
        if rank == 0:
            inp = xs[j]
        else:
            inp = torch.empty(out_shapes[rank - 1])
            dist.recv(inp, rank - 1)
            inp.requires_grad_(True)
        out = stage(inp)
        if rank == p - 1:
            out = F.cross_entropy(out, ys[j]) * (len(ys[j]) / len(y))
            total += float(out)
        else:
            dist.send(out.detach().contiguous(), rank + 1)
        saved.append((inp, out))
    for inp, out in saved:
        if rank == p - 1:
            out.backward()
        else:
            g = torch.empty_like(out)
            dist.recv(g, rank + 1)
            out.backward(g)
        if rank > 0:
            dist.send(inp.grad.contiguous(), rank - 1)
    return total


def allreduce_grads(params: list[nn.Parameter], group, scale: float = 1.0) -> None:
    """Sum the gradients of ``params`` over ``group`` as one flat tensor (one bucket), times ``scale``."""
    grads = [q.grad for q in params if q.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    if scale != 1.0:
        flat.mul_(scale)
    off = 0
    for g in grads:
        g.copy_(flat[off:off + g.numel()].view_as(g))
        off += g.numel()
