"""Progress bars for long report and import work, on stderr and only on a terminal.

Usage::

    with progress("writing trace", total=len(chunks)) as advance:
        for chunk in chunks:
            write(chunk)
            advance()          # or advance(n) for n units of work

Off a terminal (a pipe, a file, CI logs) nothing is drawn and ``advance`` costs one call, so
callers never need to check where their output goes. Bars are transient: they vanish when the
work is done, leaving only what the command prints itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

Advance = Callable[..., None]
"""``advance(n=1)``: mark ``n`` more units of the task done."""


def _noop(n: float = 1) -> None:
    return None


def stderr_console() -> Console:
    """The console progress bars draw on (stderr, so stdout stays clean for data)."""
    return Console(stderr=True)


@contextlib.contextmanager
def progress(
    task_name: str,
    total: float | None,
    *,
    console: Console | None = None,
    enabled: bool | None = None,
) -> Iterator[Advance]:
    """A progress bar for ``total`` units of ``task_name``; yields ``advance(n=1)``.

    ``total`` None draws an indeterminate bar. ``enabled`` None draws only when the console
    (stderr by default) is a terminal; False never draws; True draws on any console (tests).
    """
    console = console or stderr_console()
    if enabled is None:
        enabled = console.is_terminal and not console.is_dumb_terminal
    if not enabled:
        yield _noop
        return
    columns = [
        TextColumn("[progress.description]{task.description}"),
        BarColumn(bar_width=None),
        MofNCompleteColumn() if total and float(total).is_integer() else TaskProgressColumn(),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=console, transient=True, refresh_per_second=8) as bar:
        task = bar.add_task(task_name, total=total)

        def advance(n: float = 1) -> None:
            bar.advance(task, n)

        yield advance
