"""The op table of the moment: built-in aliases plus what the plugins contribute.

Below the catalog (:mod:`fxsym.passes.catalog`), so that the pattern engine and the core
passes read the table without importing the catalog that lists them.
"""

from __future__ import annotations

from typing import Any

from ..registry import Contributions, get_registry
from .ops import ModuleSemantics, OpAlias, OpTable, builtin_table


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
    (built once per set of plugin contributions of the current plugin manager)."""
    return get_registry().derived(_build_op_table)


def _build_op_table(contributions: Contributions) -> OpTable:
    table = builtin_table()
    for item, _src in contributions.patterns:
        _add(table, item)
    return table
