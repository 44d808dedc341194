"""Sizes given on the command line (``8GiB``, ``500MB``): parsed to bytes, without importing the CLI."""

from __future__ import annotations

from dpro.errors import DproInputError

_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30}
#: ``--max-input-bytes``'s default (:data:`dpro.jsonio.DEFAULT_MAX_INPUT_BYTES` bytes)
DEFAULT_MAX_INPUT = "2GiB"


def parse_size(text: str, option: str) -> int:
    """Bytes from ``8GiB``, ``500MB``, ``1.5g``, ``123456`` (k/m/g alone: binary units)."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _SIZE_UNITS or float(m.group(1)) <= 0:
        raise DproInputError(None, f"{option}: {text!r} is not a size (e.g. 8GiB, 500MB, 123456 bytes)")
    return int(float(m.group(1)) * _SIZE_UNITS[unit])
