"""The one exception type the CLI turns into a one-line message."""

from __future__ import annotations

from pathlib import Path


class DproInputError(Exception):
    """Bad input: names the file (or directory) and the problem.

    ``str(err)`` is the one line the CLI prints, ``"<path>: <problem>"``; it exits with
    ``exit_code``.
    """

    exit_code = 2

    def __init__(self, path: str | Path | None, problem: str) -> None:
        self.path = str(path) if path is not None else None
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)
