"""Helpers shared by the bad- and hostile-input tests: read, edit and write a (gzipped)
JSON trace file in place, and check that a command failed with dpro's one-line error."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import orjson


def jload(p: Path):
    """The JSON value of ``p``, gunzipped when it starts with the gzip magic."""
    raw = p.read_bytes()
    return orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def jsave(p: Path, obj) -> None:
    """Write ``obj`` to ``p``, gzipped (reproducibly) when the name ends in ``.gz``."""
    data = orjson.dumps(obj)
    p.write_bytes(gzip.compress(data, mtime=0) if p.name.endswith(".gz") else data)


def edit(p: Path, fn: Callable) -> None:
    """Load ``p``, let ``fn`` change the value in place, write it back."""
    obj = jload(p)
    fn(obj)
    jsave(p, obj)


def one_line_error(res, *needles: str) -> str:
    """``res`` = (exit code, stdout, stderr) of a command that must fail cleanly: exit 2,
    no traceback, exactly one ``dpro: error:`` line on stderr holding every needle."""
    code, out, err = res
    assert "Traceback" not in out + err
    assert code == 2, (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("dpro: error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]
