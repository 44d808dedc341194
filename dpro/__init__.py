"""dpro: profile, replay and optimize distributed DNN training.

    job = dpro.open("traces/")       # a prepared job (dpro.job): loaded, validated, clocks aligned
    job.replay()                     # predicted vs measured, breakdown, critical path, memory
    job.optimize()                   # a faster strategy and the settings that apply it

    recorder = dpro.Recorder(model)  # record a job: two lines in the training script
    @dpro.profile(recorder)

The package does no work at import time: each name imports what it needs when used.
"""

__version__ = "0.1.0"

__all__ = ["Job", "Recorder", "open", "profile"]


def __getattr__(name: str):
    """``dpro.open`` / ``dpro.Job`` / ``dpro.Recorder`` / ``dpro.profile``, imported on first use
    (no framework is imported by ``import dpro``)."""
    if name in ("Recorder", "profile"):
        from dpro.profiler import recorder

        return getattr(recorder, name)
    if name in ("open", "Job"):
        from dpro import job

        return job.open_job if name == "open" else job.Job
    raise AttributeError(f"module 'dpro' has no attribute {name!r}")
