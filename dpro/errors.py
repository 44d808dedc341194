"""The one exception type the CLI turns into a one-line message."""

from __future__ import annotations

from pathlib import Path

#: control characters (C0, DEL, C1) and the Unicode line/paragraph separators -> escapes
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
_ESCAPES.update({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029", 0x85: "\\x85"})


def one_line(text: str) -> str:
    """``text`` with control characters escaped, so it prints as exactly one line."""
    return text.translate(_ESCAPES)


def brief(value: object, limit: int = 60) -> str:
    """A short, one-line, non-recursive rendering of a value taken from input data:
    scalars as ``repr`` (cut at ``limit`` characters), containers only by type and size."""
    if isinstance(value, (list, tuple, dict)):
        return f"<{type(value).__name__} of {len(value)}>"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**limit:
        return "<a very long integer>"
    text = one_line(repr(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


class DproInputError(Exception):
    """Bad input: names the file (or directory) and the problem.

    ``str(err)`` is the one line the CLI prints, ``"<path>: <problem>"`` (control characters
    escaped); it exits with ``exit_code``.
    """

    exit_code = 2

    def __init__(self, path: str | Path | None, problem: str) -> None:
        self.path = str(path) if path is not None else None
        self.problem = problem
        msg = f"{self.path}: {problem}" if self.path else problem
        super().__init__(one_line(msg))

    def __reduce__(self) -> tuple:
        """Pickle by (path, problem), so the error crosses process boundaries intact
        (the per-rank import may run in worker processes)."""
        return (type(self), (self.path, self.problem))
