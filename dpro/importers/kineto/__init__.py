"""Import torch.profiler (Kineto) Chrome traces, one file per rank, into gTrace.

See docs/kineto.md for how the local DFG is derived from the trace.
"""

from dpro.importers.kineto.convert import import_kineto, is_kineto_path

__all__ = ["import_kineto", "is_kineto_path"]
