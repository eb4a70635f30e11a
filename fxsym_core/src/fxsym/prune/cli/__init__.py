"""The ``fxsym`` command line: ``analyze``, ``prune``, ``plugins`` and ``passes``.

Every failure, a usage error included, is reported as one line on stderr,
``fxsym: <what failed>``, with exit code 2 (130 when interrupted); a traceback is never shown.
An unknown option is answered with the closest one the command has; a warning is shown as one
line too, ``fxsym: <Category>: <message>``. ``fxsym prune`` only parses its flags into a
:class:`fxsym.request.PruneRequest` (:func:`prune_request`): every rule of the options is the
request's check, the one :func:`fxsym.prune_checkpoint` runs on its keyword arguments, with
the same messages in the flags' words (a refusal is the request's typed error,
``fxsym: PlanError: ...``), before torch is imported: a usage error takes no time.

One idea per module:

* :mod:`.parser` — the parser of every subcommand and :func:`main`;
* :mod:`.failure` — :class:`CliError` and a failure as one line;
* :mod:`.models` — what MODEL names (a spec, a saved or a checkpoint directory), the example
  inputs;
* :mod:`.analysis_flags` — the flags of the analysis options the plugins declare;
* :mod:`.analyze`, :mod:`.plugins`, :mod:`.passes` — ``fxsym analyze``, ``plugins``,
  ``passes``;
* :mod:`.prune` — ``fxsym prune``; :mod:`.prune_flags` its flags parsed into the request,
  :mod:`.prune_model` a model in memory, :mod:`.prune_streamed` a checkpoint directory,
  :mod:`.prune_text` the lines printed beside the plan;
* :mod:`.__main__` — ``python -m fxsym.cli``.

Every public name is re-exported here: ``fxsym.cli:main`` is the console script.

Imports from fxsym: declarations, errors, options, request (torch and the other rooms inside
each command, so ``fxsym --help`` and ``fxsym --version`` never import torch: tested in a
subprocess; the plugins' flags are read by :func:`fxsym.declarations.declared`, without torch).
"""

from __future__ import annotations

from ..options import Spelling
from .analyze import cmd_analyze
from .failure import CliError
from .models import (
    SAFE_SOURCES,
    check_spec,
    is_checkpoint_dir,
    is_saved_dir,
    load_model,
    load_saved,
)
from .parser import add_prune_parser, main
from .passes import cmd_passes
from .plugins import cmd_plugins
from .prune import check_prune_options, cmd_prune
from .prune_flags import MAX_SHARD, flags, prune_request
from .prune_model import saved_note

__all__ = [
    "FLAGS",
    "MAX_SHARD",
    "SAFE_SOURCES",
    "CliError",
    "add_prune_parser",
    "check_prune_options",
    "check_spec",
    "cmd_analyze",
    "cmd_passes",
    "cmd_plugins",
    "cmd_prune",
    "flags",
    "is_checkpoint_dir",
    "is_saved_dir",
    "load_model",
    "load_saved",
    "main",
    "prune_request",
    "saved_note",
]


def __getattr__(name: str) -> Spelling:
    if name == "FLAGS":  # ``fxsym prune``'s flags as the plugins declare them now
        return flags()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
