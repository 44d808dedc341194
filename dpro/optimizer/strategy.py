"""A strategy: how gradient units are grouped and partitioned, which ops are fused, which
blocks are recomputed and how many micro-batches a step accumulates.

Immutable, so the search can keep many candidates around; every change returns a new one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dpro.optimizer.job_model import JobModel


@dataclass(frozen=True, slots=True)
class FusedOp:
    """A chain of computation ops run as one, with its estimated duration (µs)."""

    ops: tuple[str, ...]
    dur: float


@dataclass(frozen=True, slots=True)
class OpScale:
    """Op ``op`` runs with its own time × ``time``; the blocks it keeps for later ops of the
    step and its temporaries × ``bytes`` (e.g. mixed precision: a faster kernel with
    half-size outputs)."""

    op: str
    time: float = 1.0
    bytes: float = 1.0


@dataclass(frozen=True, slots=True)
class Strategy:
    """What the optimizer changes in a job (see the module docstring)."""

    #: unit indices per synchronisation group, in launch order (tensor fusion)
    groups: tuple[tuple[int, ...], ...]
    #: pieces per group (tensor partition), same length as ``groups``
    partitions: tuple[int, ...]
    #: fused computation ops (op fusion)
    fusions: tuple[FusedOp, ...] = ()
    #: modules whose forward is recomputed in backward (activation checkpointing), by name
    recompute: tuple[str, ...] = ()
    #: micro-batches per step (gradient accumulation; 1 = none)
    accum: int = 1
    #: per-op changes of own time and kept bytes (mixed precision, a user's faster kernel)
    scales: tuple[OpScale, ...] = ()

    @staticmethod
    def from_groups(groups: list[list[int]] | tuple[tuple[int, ...], ...]) -> "Strategy":
        gs = tuple(tuple(g) for g in groups if g)
        return Strategy(gs, (1,) * len(gs))

    @staticmethod
    def as_profiled(model: JobModel) -> "Strategy":
        """The job's own grouping and partitioning."""
        st = Strategy.from_groups(model.baseline_groups)
        parts = model.baseline_partitions
        return Strategy(st.groups, tuple(parts)) if parts and len(parts) == len(st.groups) else st

    def merge_groups(self, i: int) -> "Strategy":
        """Groups i and i+1 synchronised as one (pieces: the larger of the two)."""
        g = self.groups
        merged = g[:i] + (g[i] + g[i + 1],) + g[i + 2:]
        parts = self.partitions[:i] + (max(self.partitions[i], self.partitions[i + 1]),) + self.partitions[i + 2:]
        return replace(self, groups=merged, partitions=parts)

    def with_partition(self, i: int, k: int) -> "Strategy":
        return replace(self, partitions=self.partitions[:i] + (k,) + self.partitions[i + 1:])

    def with_fusion(self, chain: tuple[str, ...], dur: float) -> "Strategy":
        """Run ``chain`` as one op of ``dur`` µs (replacing fusions it absorbs)."""
        rest = tuple(f for f in self.fusions if not set(f.ops) & set(chain))
        return replace(self, fusions=rest + (FusedOp(tuple(chain), float(dur)),))

    def with_memory(self, recompute: tuple[str, ...] | None = None, accum: int | None = None) -> "Strategy":
        """The same strategy with other memory settings (None: keep)."""
        return replace(self, recompute=self.recompute if recompute is None else tuple(recompute),
                       accum=self.accum if accum is None else int(accum))

    def with_scales(self, scales: tuple[OpScale, ...]) -> "Strategy":
        """The same strategy with ``scales`` added (a later scale of an op replaces an earlier one)."""
        new = {sc.op for sc in scales}
        return replace(self, scales=tuple(sc for sc in self.scales if sc.op not in new) + tuple(scales))

    def fusion_of(self, op: str) -> FusedOp | None:
        for f in self.fusions:
            if op in f.ops:
                return f
        return None

    def group_of(self, unit: int) -> int:
        for i, g in enumerate(self.groups):
            if unit in g:
                return i
        raise KeyError(unit)

    def group_bytes(self, model: JobModel, i: int) -> int:
        return sum(model.units[u].bytes for u in self.groups[i])

    def key(self) -> tuple:
        return (self.groups, self.partitions, tuple(sorted(f.ops for f in self.fusions)), self.recompute, self.accum,
                tuple(sorted((sc.op, sc.time, sc.bytes) for sc in self.scales)))

    def to_json(self, model: JobModel) -> dict:
        """The strategy in the units' and ops' names (``strategy.json``'s ``best.strategy``)."""
        return {
            "groups": [
                {"units": [model.units[u].name for u in g], "bytes": self.group_bytes(model, i), "partitions": self.partitions[i]}
                for i, g in enumerate(self.groups)
            ],
            "op_fusion": [{"ops": list(f.ops), "dur_us": f.dur} for f in self.fusions],
            "recompute": list(self.recompute),
            "accumulation_steps": self.accum,
            "op_scale": [{"op": sc.op, "time": sc.time, "bytes": sc.bytes} for sc in self.scales],
        }
