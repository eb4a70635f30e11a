"""The op table of the moment: built-in aliases plus what the plugins contribute.

Below the catalog (:mod:`fxsym.passes.catalog`), so that the pattern engine and the core
passes read the table without importing the catalog that lists them.
"""

from __future__ import annotations

from typing import Any

from ..plugins.manager import get_plugin_manager
from ..registry import get_registry
from .ops import ModuleSemantics, OpAlias, OpTable, builtin_table

_CACHE: tuple[int, OpTable] | None = None


def _add(table: OpTable, item: Any) -> None:
    if isinstance(item, (list, tuple)):
        for sub in item:
            _add(table, sub)
    elif isinstance(item, OpAlias):
        table.add_alias(item)
    elif isinstance(item, ModuleSemantics):
        table.add_semantics(item)


def op_table() -> OpTable:
    """Built-in aliases plus the plugins' :class:`OpAlias` and :class:`ModuleSemantics`
    (rebuilt when the set of plugins changes)."""
    global _CACHE
    contributions = get_registry().contributions  # refreshes on a plugin change
    generation = get_plugin_manager().generation
    if _CACHE is not None and _CACHE[0] == generation:
        return _CACHE[1]
    table = builtin_table()
    for item, _src in contributions.patterns:
        _add(table, item)
    _CACHE = (generation, table)
    return table
