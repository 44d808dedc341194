"""gTrace: dpro's on-disk trace format (see docs/gtrace.md)."""

from dpro.gtrace.schema import (
    CATEGORIES,
    FORMAT_NAME,
    FORMAT_VERSION,
    SUB_OPS,
    Event,
    GTrace,
    Manifest,
    NodeInfo,
    NodeTrace,
    Op,
    Tensor,
)
from dpro.gtrace.io import load_gtrace, write_gtrace

__all__ = [
    "CATEGORIES",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "SUB_OPS",
    "Event",
    "GTrace",
    "Manifest",
    "NodeInfo",
    "NodeTrace",
    "Op",
    "Tensor",
    "load_gtrace",
    "write_gtrace",
]
