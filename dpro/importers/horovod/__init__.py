"""Horovod's timeline (``HOROVOD_TIMELINE``, rank 0) -> the all-reduces of a recorded job.

:mod:`.timeline` parses the timeline (every collective operation, its phases and fusion
groups); :mod:`.atoms` turns its fusion groups into one COMM op per fusion atom (gradients
Horovod always reduced together) joined to every rank of a PyTorch recording
(:func:`apply_horovod_timeline`), and is the model the TensorFlow importer reuses.
"""

from dpro.importers.horovod.atoms import apply_horovod_timeline
from dpro.importers.horovod.timeline import (
    FusionGroup,
    HorovodTimeline,
    TensorOp,
    load_horovod_timeline,
    parse_horovod_timeline,
)

__all__ = [
    "FusionGroup", "HorovodTimeline", "TensorOp", "apply_horovod_timeline", "load_horovod_timeline",
    "parse_horovod_timeline",
]
