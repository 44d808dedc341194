"""A `dpro profile` recording directory (each rank's raw files, ``OUTPUT/raw``) -> one gTrace.

The files and keys are those of :mod:`dpro.contracts.recording`. :func:`collect` reads the
framework the ranks recorded and dispatches: PyTorch ranks are read here (their Kineto
traces by :mod:`dpro.importers.kineto`, their allocations by :mod:`.allocations`, rank 0's
Horovod timeline by :mod:`dpro.importers.horovod`, the NCCL plugin's output by
:mod:`dpro.importers.nccl`); TensorFlow and MXNet recordings by
:mod:`dpro.importers.tensorflow` and :mod:`dpro.importers.mxnet`. :func:`merge_dirs` joins
the recording directories of several hosts first.
"""

from dpro.importers.recording.allocations import attach_allocations
from dpro.importers.recording.collect import collect, merge_dirs, rank_files, recorded_framework

__all__ = ["attach_allocations", "collect", "merge_dirs", "rank_files", "recorded_framework"]
