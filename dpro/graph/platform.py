"""A platform file: the measured link costs of a cluster (``dpro calibrate -o platform.json``).

One reader for every analysis that takes ``--platform`` (what-if, oracle). Format (JSON, µs
and bytes)::

    {"format": "dpro-platform", "version": 1,
     "backend": "gloo", "processes": 2, "host": "...",
     "allreduce": {"alpha_us": 35.1, "beta_us_per_byte": 0.0021, "fit_error": 0.04},
     "samples": [{"bytes": 4096, "us": 81.0}, ...],
     "cores": 2}

``allreduce`` is the per-ring-step cost of the backend's all-reduce (a ring all-reduce of
B bytes over N ranks takes ``2(N-1) * (alpha + beta*B/N)``); an optional ``ps`` entry of
the same shape is the cost of one parameter-server message; ``allreduce`` may also hold
``cpu_alpha_us`` and ``cpu_beta_us_per_byte``, the CPU time per rank in the same form, and
``overlap_alpha_us``, ``overlap_beta_us_per_byte`` and ``overlap_compute_rate``: the same
all-reduce while every rank computes, and the computation's speed meanwhile (over alone;
:mod:`dpro.whatif.overlap`), and ``ps``
``worker_cpu_alpha_us``, ``worker_cpu_beta_us_per_byte``, ``server_cpu_alpha_us``,
``server_cpu_beta_us_per_byte``, the CPU time of one PS message on each side (``dpro calibrate
--backend ps-lite``), and ``port_efficiency``, a list of ``{"workers": N, "servers": S,
"efficiency": e}``: what the busiest server port delivers to N asynchronous senders, as a
share of that link cost (``dpro.whatif.calibrate_ps.measure_port``); the optional ``cores`` is the
CPU cores one host's processes share. A flat ``{"alpha_us": .., "beta_us_per_byte": ..}``
(optionally with ``cores``) is read as the all-reduce cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dpro.errors import DproInputError

FORMAT = "dpro-platform"


@dataclass(frozen=True)
class Transfer:
    """Per-message overhead ``alpha`` (µs) and time per byte ``beta`` (µs/byte) of a link."""

    alpha: float
    beta: float

    def us(self, nbytes: float) -> float:
        return self.alpha + self.beta * nbytes


@dataclass(frozen=True)
class PsCpu:
    """CPU time of one parameter-server message (a push or a pull of B bytes) in the worker
    and in the server: ``alpha + beta * B`` µs each."""

    worker: Transfer
    server: Transfer


@dataclass(frozen=True)
class OverlapCost:
    """The all-reduce while every rank computes (per ring step, as ``allreduce``) and the
    computation's speed meanwhile, over its speed alone (``dpro calibrate``)."""

    transfer: Transfer
    compute_rate: float


@dataclass
class Platform:
    """The measured costs of a platform."""

    backend: str
    processes: int
    allreduce: Transfer | None
    ps: Transfer | None = None
    source: str = ""
    #: CPU cores shared by one host's processes (None: unknown / one device each)
    cores: int | None = None
    #: CPU time per rank of the all-reduce, same form (``cpu_alpha_us``, ``cpu_beta_us_per_byte``)
    allreduce_cpu: Transfer | None = None
    #: CPU time of a PS message in the worker and the server (``dpro calibrate --backend ps-lite``)
    ps_cpu: PsCpu | None = None
    #: (workers, servers, efficiency) of the busiest PS server port with that many asynchronous senders
    ps_port: tuple[tuple[int, int, float], ...] = ()
    #: the all-reduce and the computation while they overlap (``overlap_*`` in ``allreduce``)
    allreduce_overlap: OverlapCost | None = None
    #: (bytes, min µs, max µs) of the sizes whose calibration tries disagreed (``unsteady``)
    unsteady: tuple[tuple[int, float, float], ...] = ()

    def transfer(self, kind: str) -> Transfer:
        t = self.allreduce if kind == "allreduce" else (self.ps or self.allreduce)
        if t is None:
            raise DproInputError(self.source, f"the platform file has no {kind} cost")
        return t


def _transfer(d: object, path: Path, key: str) -> Transfer | None:
    if d is None:
        return None
    ok = isinstance(d, dict) and all(
        not isinstance(d.get(k), bool) and isinstance(d.get(k), (int, float)) and d[k] >= 0
        for k in ("alpha_us", "beta_us_per_byte"))
    if not ok:
        raise DproInputError(path, f"not a platform file: '{key}' needs alpha_us and beta_us_per_byte, numbers >= 0")
    return Transfer(float(d["alpha_us"]), float(d["beta_us_per_byte"]))  # type: ignore[index]


def _cores(d: dict, path: Path) -> int | None:
    cores = d.get("cores")
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        raise DproInputError(path, f"platform file: 'cores' must be an integer >= 1 (got {cores!r})")
    return cores


def load_platform(path: str | Path) -> Platform:
    """Read a platform file (bad input: :class:`DproInputError`, one line)."""
    from dpro.jsonio import read_json

    p = Path(path)
    d = read_json(p)
    if isinstance(d, dict) and "format" not in d and "alpha_us" in d and "beta_us_per_byte" in d:
        return Platform("?", 0, _transfer(d, p, "link cost"), None, str(p), _cores(d, p))
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise DproInputError(p, f"not a platform file (expected \"format\": \"{FORMAT}\" or "
                             "{\"alpha_us\": ..., \"beta_us_per_byte\": ...}; write one with dpro calibrate)")
    ar, ps = _transfer(d.get("allreduce"), p, "allreduce"), _transfer(d.get("ps"), p, "ps")
    if ar is None and ps is None:
        raise DproInputError(p, "not a platform file: neither 'allreduce' nor 'ps' costs")
    cpu = None
    if isinstance(d.get("allreduce"), dict) and "cpu_alpha_us" in d["allreduce"]:
        a = d["allreduce"]
        cpu = _transfer({"alpha_us": a.get("cpu_alpha_us"), "beta_us_per_byte": a.get("cpu_beta_us_per_byte")},
                        p, "allreduce cpu")
    return Platform(str(d.get("backend", "?")), int(d.get("processes", 0) or 0), ar, ps, str(p), _cores(d, p), cpu,
                    _ps_cpu(d.get("ps"), p), _ps_port(d.get("ps"), p), _overlap(d.get("allreduce"), p),
                    _unsteady(d.get("unsteady"), p))


def _unsteady(d: object, path: Path) -> tuple[tuple[int, float, float], ...]:
    """``unsteady`` (dpro calibrate: the sizes whose tries disagreed); absent in older files."""
    if d is None:
        return ()
    ok = isinstance(d, list) and all(
        isinstance(x, dict) and all(not isinstance(x.get(k), bool) and isinstance(x.get(k), (int, float))
                                    and x[k] >= 0 for k in ("bytes", "min_us", "max_us")) for x in d)
    if not ok:
        raise DproInputError(path, "platform file: 'unsteady' must be a list of {bytes, min_us, max_us}, numbers >= 0")
    return tuple((int(x["bytes"]), float(x["min_us"]), float(x["max_us"])) for x in d)  # type: ignore[index]


def _overlap(d: object, path: Path) -> OverlapCost | None:
    """The ``allreduce`` entry's overlapped cost, if it has one."""
    if not isinstance(d, dict) or not any(k.startswith("overlap_") for k in d):
        return None
    t = _transfer({"alpha_us": d.get("overlap_alpha_us"), "beta_us_per_byte": d.get("overlap_beta_us_per_byte")},
                  path, "allreduce overlap")
    rate = d.get("overlap_compute_rate")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1.5:
        raise DproInputError(path, "not a platform file: 'allreduce.overlap_compute_rate' must be a number in (0, 1.5]")
    return OverlapCost(t, float(rate))  # type: ignore[arg-type]


def _ps_port(d: object, path: Path) -> tuple[tuple[int, int, float], ...]:
    """The ``ps`` entry's ``port_efficiency`` rows, if any: (workers, servers, efficiency > 0)."""
    rows = d.get("port_efficiency") if isinstance(d, dict) else None
    if rows is None:
        return ()
    out = []
    for r in rows if isinstance(rows, list) else [None]:
        ok = isinstance(r, dict) and all(isinstance(r.get(k), int) and not isinstance(r.get(k), bool) and r[k] >= 1
                                         for k in ("workers", "servers"))
        e = r.get("efficiency") if isinstance(r, dict) else None
        if not ok or isinstance(e, bool) or not isinstance(e, (int, float)) or not e > 0:
            raise DproInputError(path, "not a platform file: 'ps.port_efficiency' needs rows of workers and servers "
                                 "(integers >= 1) and efficiency (a number > 0)")
        out.append((r["workers"], r["servers"], float(e)))  # type: ignore[index]
    return tuple(out)


def _ps_cpu(d: object, path: Path) -> PsCpu | None:
    """The ``ps`` entry's CPU costs, if it has them (both sides, or none)."""
    if not isinstance(d, dict) or not any(k.endswith("_cpu_alpha_us") for k in d):
        return None
    side = {s: _transfer({"alpha_us": d.get(f"{s}_cpu_alpha_us"), "beta_us_per_byte": d.get(f"{s}_cpu_beta_us_per_byte")},
                         path, f"ps {s} cpu") for s in ("worker", "server")}
    return PsCpu(side["worker"], side["server"])  # type: ignore[arg-type]
