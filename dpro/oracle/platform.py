"""The link cost the formulas use: α (µs per message or ring step), β (µs per byte).

From a platform file (``--platform FILE``: :mod:`dpro.graph.platform`, what ``dpro
calibrate`` writes or a flat ``{"alpha_us": 25.0, "beta_us_per_byte": 0.0008}``), else fitted
from the trace's own collectives (dpro/graph/comm_model.py: the replayer's ring fit). The
file's optional ``"cores": N`` is the CPU cores of one host when the devices are processes
of one host (CPU training: p processes on fewer cores share them, so compute takes p/N longer).
Its optional ``"oracle"`` section (dpro/oracle/calibration.py) holds the collectives' costs
measured per process count and the host costs of the model-parallel implementations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dpro.errors import DproInputError
from dpro.graph.platform import load_platform
from dpro.oracle.calibration import Calibration, read_calibration

if TYPE_CHECKING:
    from dpro.job import Job


@dataclass(frozen=True, slots=True)
class Platform:
    alpha_us: float
    beta_us_per_byte: float
    source: str = ""
    #: cores shared by the devices (processes of one host), None: one device each
    cores: int | None = None
    #: the oracle's calibration (per process count links, host costs); empty: α, β only
    calibration: Calibration = field(default_factory=Calibration)

    @property
    def shares_links(self) -> bool:
        """Whether collectives of disjoint ranks share a link (the contention penalty
        applies): the calibration's topology, "shared" unless it says "per-rank"."""
        return self.calibration.topology != "per-rank"

    def slowdown(self, devices: int) -> float:
        """Compute time factor of ``devices`` processes sharing :attr:`cores`."""
        return max(1.0, devices / self.cores) if self.cores else 1.0

    def to_json(self) -> dict:
        return {"alpha_us": self.alpha_us, "beta_us_per_byte": self.beta_us_per_byte, "source": self.source,
                "cores": self.cores, "oracle": self.calibration.to_json()}


def read_platform(path: str | Path) -> Platform:
    """The all-reduce cost (and ``cores``) of a platform file (:mod:`dpro.graph.platform`:
    what ``dpro calibrate`` writes, or the flat ``{"alpha_us", "beta_us_per_byte"}``)."""
    from dpro.jsonio import read_json

    plat = load_platform(path)
    cost = plat.transfer("allreduce")
    raw = read_json(Path(path))
    cal = Calibration()
    if isinstance(raw, dict) and raw.get("oracle") is not None:
        try:
            cal = read_calibration(raw["oracle"])
        except ValueError as e:
            raise DproInputError(path, f"platform file: 'oracle' section: {e}") from None
    return Platform(cost.alpha, cost.beta, str(path), plat.cores, cal)


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
