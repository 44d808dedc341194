"""dpro: profile, replay and optimize distributed DNN training.

The package does no work at import time; import the submodules you need
(`dpro.gtrace`, `dpro.importers.kineto`, `dpro.graph`, `dpro.replayer`).
"""

__version__ = "0.1.0"

__all__ = ["Recorder", "profile"]


def __getattr__(name: str):
    """``dpro.Recorder`` / ``dpro.profile`` without importing any framework at ``import dpro``."""
    if name in ("Recorder", "profile"):
        from dpro.profiler import recorder

        return getattr(recorder, name)
    raise AttributeError(f"module 'dpro' has no attribute {name!r}")
