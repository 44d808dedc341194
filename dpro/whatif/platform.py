"""The units of the what-if options; the platform file itself is :mod:`dpro.graph.platform`."""

from __future__ import annotations

import re

from dpro.graph.platform import FORMAT, OverlapCost, Platform, PsCpu, Transfer, load_platform

__all__ = ["FORMAT", "OverlapCost", "Platform", "PsCpu", "Transfer", "load_platform", "parse_bandwidth", "parse_time_us", "parse_workers"]

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
