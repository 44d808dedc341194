"""A platform file (``dpro calibrate -o platform.json``) and the units of the what-if options.

Format (JSON, µs and bytes)::

    {"format": "dpro-platform", "version": 1,
     "backend": "gloo", "processes": 2, "host": "...",
     "allreduce": {"alpha_us": 35.1, "beta_us_per_byte": 0.0021, "fit_error": 0.04},
     "samples": [{"bytes": 4096, "us": 81.0}, ...]}

A flat ``{"alpha_us": .., "beta_us_per_byte": ..}`` (what ``dpro oracle --platform`` reads)
is taken as the all-reduce cost. ``allreduce`` is the per-ring-step cost of the backend's all-reduce (a ring all-reduce of
B bytes over N ranks takes ``2(N-1) * (alpha + beta*B/N)``); an optional ``ps`` entry of
the same shape is the cost of one parameter-server message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dpro.errors import DproInputError
from dpro.whatif.models import Transfer

FORMAT = "dpro-platform"

_BW = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
       "b/s": 8, "kb/s": 8e3, "mb/s": 8e6, "gb/s": 8e9, "bps": 1, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9}
_T = {"ns": 1e-3, "us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6}


def parse_bandwidth(text: str) -> float:
    """``10Gbit``, ``200Mbit``, ``1.25GB/s`` -> bytes per µs (ValueError: one line)."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?\d+)?)\s*([A-Za-z/]+)\s*", text)
    unit = m and _BW.get(m.group(2).lower())
    if not m or unit is None:
        raise ValueError(f"bandwidth {text!r}: expected a number and a unit ({', '.join(['Gbit', 'Mbit', 'GB/s', 'MB/s'])})")
    bits = float(m.group(1)) * unit
    if bits <= 0:
        raise ValueError(f"bandwidth {text!r} must be > 0")
    return bits / 8 / 1e6


def parse_time_us(text: str) -> float:
    """``5us``, ``1.5ms``, ``200ns`` -> µs (ValueError: one line)."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?\d+)?)\s*([a-zµ]+)\s*", text)
    unit = m and _T.get(m.group(2))
    if not m or unit is None:
        raise ValueError(f"latency {text!r}: expected a number and a unit (ns, us, ms, s)")
    return float(m.group(1)) * unit


def parse_workers(text: str) -> list[int]:
    """``4`` or ``2,4,8`` -> [..] (each >= 1)."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"workers {text!r}: expected N or a list N1,N2,...") from None
    if not out or any(n < 1 for n in out):
        raise ValueError(f"workers {text!r}: every count must be >= 1")
    return out


@dataclass
class Platform:
    """The measured costs of a platform."""

    backend: str
    processes: int
    allreduce: Transfer | None
    ps: Transfer | None = None
    source: str = ""

    def transfer(self, kind: str) -> Transfer:
        t = self.allreduce if kind == "allreduce" else (self.ps or self.allreduce)
        if t is None:
            raise DproInputError(self.source, f"the platform file has no {kind} cost")
        return t


def _transfer(d, path, key) -> Transfer | None:
    if d is None:
        return None
    ok = isinstance(d, dict) and all(isinstance(d.get(k), (int, float)) and d[k] >= 0
                                     for k in ("alpha_us", "beta_us_per_byte"))
    if not ok:
        raise DproInputError(path, f"not a platform file: '{key}' needs alpha_us and beta_us_per_byte >= 0")
    return Transfer(float(d["alpha_us"]), float(d["beta_us_per_byte"]))


def load_platform(path: str | Path) -> Platform:
    """Read a platform file (bad input: :class:`DproInputError`, one line)."""
    from dpro.jsonio import read_json

    p = Path(path)
    d = read_json(p)
    if isinstance(d, dict) and "format" not in d and "alpha_us" in d and "beta_us_per_byte" in d:
        # the flat link cost `dpro oracle --platform` reads: the all-reduce's per-ring-step cost
        return Platform("?", 0, _transfer(d, p, "link cost"), None, str(p))
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise DproInputError(p, f"not a platform file (expected \"format\": \"{FORMAT}\"; write one with dpro calibrate)")
    ar, ps = _transfer(d.get("allreduce"), p, "allreduce"), _transfer(d.get("ps"), p, "ps")
    if ar is None and ps is None:
        raise DproInputError(p, "not a platform file: neither 'allreduce' nor 'ps' costs")
    return Platform(str(d.get("backend", "?")), int(d.get("processes", 0) or 0), ar, ps, str(p))
