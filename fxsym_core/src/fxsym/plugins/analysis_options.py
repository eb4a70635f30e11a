"""The analysis options and size options the plugins declare (``fxsym_analysis_options``,
``fxsym_size_options``), gathered from the active plugin manager.

A plugin whose rules can describe something in two sound ways declares a keyword of
:func:`fxsym.analyze` (an :class:`~fxsym.plugins.contracts.AnalysisOption`); the analysis
checks and sets the values it is given (:mod:`fxsym.analysis.options`), the SymMap and a plan
record them. This room only gathers the declarations, so that the workflow reading a recorded
plan (which options may it name? does it keep the blocks of picked groups?) asks the plugins
without importing the analyzer.

The command line reads the same declarations through :func:`fxsym.declarations.declared`,
which asks here once the plugins are loaded.

Imports from fxsym: declarations.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..declarations import D, Declarations, first_of_each
from .calls import call_each
from .contracts import AnalysisOption, SizeOption
from .manager import PluginManager, active_plugins


def declared_options() -> dict[str, AnalysisOption]:
    """``{name: option}`` of every analysis option the enabled plugins declare (the first
    declaration of a name counts; the default manager's entry points loaded first, as a trace
    loads them: a prune checks its options before anything is traced)."""
    return _first_of_each("fxsym_analysis_options", AnalysisOption)


def declared_size_options() -> dict[str, SizeOption]:
    """``{name: option}`` of every size option the enabled plugins declare
    (``fxsym_size_options``; the first declaration of a name counts)."""
    return _first_of_each("fxsym_size_options", SizeOption)


def _first_of_each(hook: str, kind: type[D]) -> dict[str, D]:
    """``{name: declaration}`` of what the enabled plugins' ``hook`` answers, gathered by the
    rule the entry points' declarations are (:func:`fxsym.declarations.first_of_each`: the
    first declaration of a name counts, an answer of another type is refused)."""
    pm = active_plugins()
    return first_of_each(((name, pm.source(name).distribution, answer)
                          for name, answer in call_each(pm, hook, lambda _: {})), hook, kind)


def declared_by_plugin(pm: PluginManager) -> dict[str, Declarations]:
    """``{plugin name: its declarations}`` of ``pm``'s plugins that declare any (what
    ``fxsym plugins`` lists), each answer checked as :func:`_first_of_each` checks it."""
    analysis = _each_plugin(pm, "fxsym_analysis_options", AnalysisOption)
    sizes = _each_plugin(pm, "fxsym_size_options", SizeOption)
    return {name: Declarations(tuple(analysis.get(name, {}).values()),
                               tuple(sizes.get(name, {}).values()))
            for name in pm.plugin_names() if analysis.get(name) or sizes.get(name)}


def _each_plugin(pm: PluginManager, hook: str, kind: type[D]) -> dict[str, dict[str, D]]:
    """``{plugin name: {name: declaration}}`` of what each of ``pm``'s plugins' ``hook``
    answers."""
    return {name: first_of_each([(name, pm.source(name).distribution, answer)], hook, kind)
            for name, answer in call_each(pm, hook, lambda _: {})}


def keeps_picked_blocks(options: Mapping[str, Any]) -> str | None:
    """The option of ``options`` (as :attr:`fxsym.SymMap.analysis_options` holds them) that
    keeps the blocks of picked groups (its value is the declaration's
    ``keeps_picked_blocks``), written ``name='value'``, or ``None``."""
    if not options:
        return None
    declared = declared_options()
    for name, value in options.items():
        option = declared.get(name)
        if option is not None and option.keeps_picked_blocks is not None and (
                value == option.keeps_picked_blocks):
            return f"{name}={value!r}"
    return None


__all__ = ["declared_by_plugin", "declared_options", "declared_size_options",
           "keeps_picked_blocks"]
