"""Framework hooks that record a gTrace: the two-line API ``Recorder`` + ``profile``.

Nothing is imported from a framework until a Recorder is built.
"""

from dpro.profiler.recorder import Recorder, profile

__all__ = ["Recorder", "profile"]
