"""The link cost the formulas use: α (µs per message or ring step), β (µs per byte).

From a platform file (``--platform FILE``), else fitted from the trace's own collectives
(dpro/graph/comm_model.py: the replayer's ring fit). A platform file is a JSON object
``{"alpha_us": 25.0, "beta_us_per_byte": 0.0008}`` (more keys are ignored, so the file
``dpro calibrate`` writes can be given as is when it holds these two keys), optionally
with ``"cores": N``: the CPU cores of one host when the devices are processes of one
host (CPU training: p processes on fewer cores share them, so compute takes p/N longer).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dpro.errors import DproInputError

if TYPE_CHECKING:
    from dpro.job import Job


@dataclass(frozen=True, slots=True)
class Platform:
    alpha_us: float
    beta_us_per_byte: float
    source: str = ""
    #: cores shared by the devices (processes of one host), None: one device each
    cores: int | None = None

    def slowdown(self, devices: int) -> float:
        """Compute time factor of ``devices`` processes sharing :attr:`cores`."""
        return max(1.0, devices / self.cores) if self.cores else 1.0

    def to_json(self) -> dict:
        return {"alpha_us": self.alpha_us, "beta_us_per_byte": self.beta_us_per_byte, "source": self.source,
                "cores": self.cores}


def read_platform(path: str | Path) -> Platform:
    """A platform file: ``{"alpha_us": float >= 0, "beta_us_per_byte": float >= 0}``."""
    from dpro.jsonio import read_json

    d = read_json(Path(path))
    if not isinstance(d, dict):
        raise DproInputError(path, "a platform file is a JSON object {\"alpha_us\": ..., \"beta_us_per_byte\": ...}")
    vals = []
    for k in ("alpha_us", "beta_us_per_byte"):
        v = d.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise DproInputError(path, f"platform file: {k!r} must be a number >= 0 (got {v!r})")
        vals.append(float(v))
    cores = d.get("cores")
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        raise DproInputError(path, f"platform file: 'cores' must be an integer >= 1 (got {cores!r})")
    return Platform(vals[0], vals[1], str(path), cores)


def platform_of(job: Job, path: str | Path | None = None) -> Platform:
    """``path`` if given, else the ring fit of the job's collectives; DproInputError if neither."""
    if path is not None:
        return read_platform(path)
    cost = job.replay().build.link_cost
    if cost is None:
        raise DproInputError(job.path or "trace", "the trace has no collectives with sizes to fit the link cost from; "
                             "give --platform FILE with {\"alpha_us\": ..., \"beta_us_per_byte\": ...}")
    how = "fitted from the trace's collectives" + ("" if cost.latency_known else " (one shape: bandwidth only)")
    return Platform(cost.alpha, cost.beta, how)
