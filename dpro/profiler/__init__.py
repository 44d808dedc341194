"""What runs inside the training job: the two-line API ``Recorder`` + ``profile``
(:mod:`.recorder`, configured by :mod:`.config`), one backend folder per framework
(:mod:`.pytorch`, :mod:`.tensorflow`, :mod:`.mxnet`) plus :mod:`.horovod`, and `dpro profile`
(:mod:`.launcher`), which runs the job and collects what it recorded with
:mod:`dpro.importers.recording`.

Nothing is imported from a framework until a Recorder is built.
"""

from dpro.profiler.recorder import Recorder, profile

__all__ = ["Recorder", "profile"]
