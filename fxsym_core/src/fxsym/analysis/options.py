"""Choices between sound descriptions of what a plugin's rules see, made for one analysis.

Some module families or ops can change in two ways, each exact in its own sense, that one
group table cannot hold at once; the plugin describing them declares an *analysis option*
(``fxsym_analysis_options``: a :class:`~fxsym.plugins.contracts.AnalysisOption`, a keyword
and its values, the default first) and its rules read the value of the analysis running
(:func:`analysis_option`). The nn plugin declares two:

* ``norm_groups``: a group norm of ``G`` groups over ``C`` channels loses a whole norm group
  at a time (``"follow"``, the default: ``num_groups`` follows) or keeps ``num_groups`` and
  loses as many channels in each (``"keep"``; a shrink is then *not* the model with the
  dropped channels zeroed, so the value oracle leaves such groups unchecked);
* ``routing_groups``: a router viewing ``E`` experts' scores as ``n_group`` routing groups
  (DeepSeek-V3) drops whole routing groups (``"follow"``) or keeps ``n_group`` and the same
  expert positions in each (``"keep"``).

The second is a mechanism of the kernel's own: a group whose entries are picked by value
(``topk``, :meth:`OpContext.pick_by_value`) split by a view into blocks either loses whole
blocks, or keeps the number of blocks (:func:`picked_blocks_kept`): its unit is then one
position of every block, a pick over the blocks' equal copies picks from each, and the view's
blocks reading (:meth:`OpContext.offer_alternative`) is taken wherever it would keep a picked
group. An option declares the value that asks for it (``keeps_picked_blocks``); this module
names no option. The declarations are gathered by :mod:`fxsym.plugins.analysis_options`.

:func:`fxsym.analyze` checks the options it is given against the declarations
(:func:`checked_options`) and sets them for the analysis it runs (:func:`options_set`); the
SymMap keeps them (:attr:`fxsym.SymMap.analysis_options`) so a plan records them and a saved
plan is replayed the same way.

Imports from fxsym: errors, plugins.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from ..errors import AnalysisError
from ..plugins.analysis_options import declared_options, keeps_picked_blocks


@dataclass(frozen=True)
class _Running:
    """The options of the analysis running: the values given, and the option whose value
    keeps the blocks of picked groups (``name='value'``; ``None``: they follow)."""

    values: Mapping[str, str]
    keeps_picked_blocks: str | None


_RUNNING: ContextVar[_Running | None] = ContextVar("fxsym_analysis_options", default=None)


def analysis_option(name: str) -> str | None:
    """The value of option ``name`` in the analysis running now, ``None`` where it was not
    given (its default) or outside an analysis."""
    running = _RUNNING.get()
    return None if running is None else running.values.get(name)


def picked_blocks_kept() -> bool:
    """Whether the analysis running keeps the number of blocks a view splits a group picked
    by value into (an option given its ``keeps_picked_blocks`` value), rather than dropping
    whole blocks."""
    running = _RUNNING.get()
    return running is not None and running.keeps_picked_blocks is not None


def picked_blocks_keeper() -> str | None:
    """The option keeping the blocks of picked groups in the analysis running, written
    ``name='value'`` (for messages), or ``None``."""
    running = _RUNNING.get()
    return None if running is None else running.keeps_picked_blocks


def checked_options(**options: str) -> dict[str, str]:
    """The analysis options ``options``, checked against the plugins' declarations; only
    those that differ from their defaults."""
    if not options:
        return {}
    declared = declared_options()
    out: dict[str, str] = {}
    for name, value in options.items():
        option = declared.get(name)
        if option is None:
            raise AnalysisError(
                f"unknown analysis option {name!r}: the plugins declare "
                f"{', '.join(sorted(declared)) or 'none'} (fxsym_analysis_options)")
        if value not in option.values:
            raise AnalysisError(f"{name} must be one of {', '.join(map(repr, option.values))}, "
                                f"got {value!r}")
        if value != option.values[0]:
            out[name] = value
    return out


@contextmanager
def options_set(options: Mapping[str, Any]) -> Iterator[None]:
    """Run an analysis with ``options`` (as :func:`checked_options` returns them)."""
    values = {str(k): str(v) for k, v in options.items()}
    token = _RUNNING.set(_Running(values, keeps_picked_blocks(values)))
    try:
        yield
    finally:
        _RUNNING.reset(token)


__all__ = [
    "analysis_option",
    "checked_options",
    "declared_options",
    "keeps_picked_blocks",
    "options_set",
    "picked_blocks_keeper",
    "picked_blocks_kept",
]
