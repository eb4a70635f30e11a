"""A command's failure, shown as one line: :class:`CliError` (raised by the commands and the
parser, printed by :func:`fxsym.cli.main` as ``fxsym: <what failed>``) and ``_one_line``, an
exception as ``Type: message`` on one line; ``_progress``, a line on stderr.
"""

from __future__ import annotations

import sys


class CliError(Exception):
    """A command-line failure, shown as one line."""


def _one_line(exc: BaseException) -> str:
    """``Type: message`` with the message's whitespace (newlines included) collapsed."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
