"""Progress bars for long work, on stderr and only when it is a terminal."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Tick = Callable[[str], None]


def _noop(label: str) -> None:
    return None


@contextmanager
def progress_bar(total: int, description: str, *, enabled: bool | None = None) -> Iterator[Tick]:
    """Yield ``tick(label)``, which advances a rich progress bar by one of ``total``."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled or total <= 1:
        yield _noop
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[label]}"), console=Console(stderr=True), transient=True,
    ) as bar:
        task = bar.add_task(description, total=total, label="")
        yield lambda label: bar.update(task, advance=1, label=label)


@contextmanager
def progress_pulse(description: str, *, enabled: bool | None = None) -> Iterator[Tick]:
    """Like :func:`progress_bar` for work of unknown length (a pulsing bar with the last label)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield _noop
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), TextColumn("{task.fields[label]}"),
        console=Console(stderr=True), transient=True,
    ) as bar:
        task = bar.add_task(description, total=None, label="")
        yield lambda label: bar.update(task, label=label)
