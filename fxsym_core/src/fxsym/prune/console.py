"""Tables and progress for people at a terminal, plain text for pipes and files.

Design. Everything fxsym prints for a person goes through here: the command line's tables
(``fxsym analyze``, ``plugins``, ``passes``) and the benchmark scripts'. At a terminal they
are drawn by `rich <https://github.com/Textualize/rich>`_ (boxed tables, spinners, progress
bars on stderr); when the stream is not a terminal — piped into ``grep``, redirected to a
file, captured by a test — the same rows come out as plain, aligned, uncoloured columns and
progress is one line per step on stderr, so output stays stable to parse. ``rich`` is
imported only when a terminal is there to draw on.

Imports from fxsym: nothing (every room may use it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any, TypeVar

__all__ = ["format_table", "is_terminal", "print_table", "render_table", "status", "steps",
           "track"]

T = TypeVar("T")


def is_terminal(file: IO[str] | None = None) -> bool:
    """Whether ``file`` (default: stdout) is an interactive terminal."""
    stream = sys.stdout if file is None else file
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def format_table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """Plain aligned columns: the first left-aligned, the others right-aligned, a dashed rule
    under the header."""
    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths))).rstrip()
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_table(rows: Sequence[Sequence[Any]], header: Sequence[str], *,
                title: str | None = None, file: IO[str] | None = None) -> None:
    """Print a table: drawn by rich at a terminal, :func:`format_table` otherwise."""
    stream = sys.stdout if file is None else file
    print(render_table(rows, header, title=title, terminal=is_terminal(stream)), file=stream)


def render_table(rows: Sequence[Sequence[Any]], header: Sequence[str], *,
                 title: str | None = None, terminal: bool | None = None) -> str:
    """The table as text: drawn by rich (with colour codes) when ``terminal`` (default:
    stdout is a terminal), :func:`format_table` under ``title`` otherwise."""
    if not (is_terminal() if terminal is None else terminal):
        return (f"{title}\n" if title else "") + format_table(rows, header)
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", header_style="bold")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right", overflow="fold")
    for row in rows:
        table.add_row(*(Text(str(c)) for c in row))
    console = Console(force_terminal=True)
    with console.capture() as captured:
        console.print(table)
    return captured.get().rstrip("\n")


@contextmanager
def status(message: str, *, file: IO[str] | None = None) -> Iterator[None]:
    """A spinner with ``message`` while the block runs (a terminal), else the line
    ``message ...`` on stderr before it."""
    stream = sys.stderr if file is None else file
    if not is_terminal(stream):
        print(f"{message} ...", file=stream, flush=True)
        yield
        return
    from rich.console import Console

    with Console(file=stream).status(message):
        yield


def track(items: Iterable[T], *, total: int | None = None, description: str = "",
          label: Any = None, file: IO[str] | None = None) -> Iterator[T]:
    """Iterate over ``items`` with a progress bar on stderr (a terminal), else one line
    ``[i/total] label(item)`` per item. ``label`` names an item (default: ``str``)."""
    seq = list(items)
    name = label if callable(label) else str
    with steps(len(seq) if total is None else total, description=description,
               file=file) as step:
        for item in seq:
            step(name(item))
            yield item


@contextmanager
def steps(total: int, *, description: str = "", file: IO[str] | None = None
          ) -> Iterator[Callable[[str], None]]:
    """A progress bar of ``total`` steps on stderr while the block runs (a terminal), else one
    line ``[i/total] label`` per step; the block calls the function yielded with a step's
    label as the step starts (for work that is not a loop of its own: a library's callback)."""
    stream = sys.stderr if file is None else file
    count = 0
    if not is_terminal(stream):
        def line(label: str) -> None:
            nonlocal count
            count += 1
            print(f"[{count}/{total}] {label}", file=stream, flush=True)

        yield line
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[item]}"))
    with Progress(*columns, console=Console(file=stream), transient=False) as progress:
        task = progress.add_task(description, total=total, item="")

        def bar(label: str) -> None:
            nonlocal count
            if count:
                progress.advance(task)
            count += 1
            progress.update(task, item=label)

        yield bar
        if count:
            progress.advance(task)
