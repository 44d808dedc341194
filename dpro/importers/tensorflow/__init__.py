"""A TensorFlow recording of `dpro profile` (one ``rank<r>.json.gz`` + ``rank<r>.meta.json`` per
rank, written by :mod:`dpro.profiler.tensorflow`) -> gTrace.

:mod:`.read` checks and reads one rank's recording (the executed graphs and each op's
execution per step); :mod:`.convert` builds each rank's DFG from the graph and the trace
(:func:`collect_tf`); :mod:`.horovod` adds Horovod's all-reduces from rank 0's timeline,
with the fusion-atom model of :mod:`dpro.importers.horovod`.
"""

from dpro.importers.tensorflow.convert import collect_tf
from dpro.importers.tensorflow.read import RankRecording, read_rank

__all__ = ["RankRecording", "collect_tf", "read_rank"]
