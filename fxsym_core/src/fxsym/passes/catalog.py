"""Every pass and pattern known right now: the core's own plus the plugins' contributions.

Plugins contribute through ``fxsym_register_patterns(register)``; ``register(item)`` accepts

* a :class:`~fxsym.passes.Pass` (a named pass with ordering constraints),
* a :class:`~fxsym.passes.Pattern` (chain or subgraph), applied by the pattern pass named by
  its ``stage`` (``"patterns"`` unless set; an unknown stage gets a pattern pass of its own,
  ordered like ``"patterns"``),
* an :class:`~fxsym.passes.OpAlias` or a :class:`~fxsym.passes.ModuleSemantics`,
* a list or tuple of those.

The catalog is rebuilt when the plugin set changes (the plugin manager's generation). Two
plugins registering a pass of the same name: the later one wins, with a warning naming both.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import fx

from ..errors import PassError, PassWarning
from ..plugins.manager import get_plugin_manager
from ..registry import Contributions, get_registry
from .base import Pass
from .core.dce import dead_code_elimination
from .core.inplace import remove_inplace
from .core.noop import remove_noops
from .engine import PatternEngine
from .ops import ModuleSemantics, OpAlias, OpTable
from .pattern import Pattern
from .table import op_table

CORE = "<core>"
PATTERN_STAGE = "patterns"


class PatternPass(Pass):
    """A pass that applies, in one engine run, every pattern whose ``stage`` is its name."""

    def __init__(
        self,
        name: str = PATTERN_STAGE,
        patterns: Iterable[Pattern] = (),
        *,
        before: tuple[str, ...] | str = (),
        after: tuple[str, ...] | str = (),
        default: bool = True,
        description: str = "",
        include_registered: bool = True,
    ) -> None:
        self.own_patterns = list(patterns)
        self.include_registered = include_registered
        super().__init__(
            name,
            self._run,
            before=before,  # type: ignore[arg-type]
            after=after,  # type: ignore[arg-type]
            default=default,
            description=description or f"apply the patterns of stage {name!r}",
        )
        self.last_stats: dict[str, int] = {}

    def patterns(self) -> list[Pattern]:
        found = list(self.own_patterns)
        if self.include_registered:
            found += [p for p, _ in catalog().patterns if p.stage == self.name]
        return found

    def _run(self, gm: fx.GraphModule) -> int:
        patterns = self.patterns()
        if not patterns:
            return 0
        engine = PatternEngine(patterns, op_table())
        changes = engine.run(gm)
        self.last_stats = dict(engine.stats)
        return changes


def core_passes() -> list[Pass]:
    return [
        Pass(
            "remove_inplace",
            remove_inplace,
            before=("remove_noops", PATTERN_STAGE),
            description="rewrite in-place ops out-of-place when provably safe",
            exact=True,
        ),
        Pass(
            "remove_noops",
            remove_noops,
            after=("remove_inplace",),
            before=(PATTERN_STAGE,),
            description="drop identities, eval dropout, full slices, x*1, x+0, chained reshapes",
            exact=True,
        ),
        PatternPass(
            PATTERN_STAGE,
            after=("remove_noops",),
            before=("dce",),
            description="apply every registered pattern (indexed by anchor op)",
        ),
        Pass(
            "dce",
            dead_code_elimination,
            after=("*",),
            description="erase unused nodes that have no effect",
            exact=True,
        ),
    ]


@dataclass
class Catalog:
    """Passes by name (in registration order), patterns, op table, and who gave each."""

    passes: dict[str, Pass] = field(default_factory=dict)
    pass_sources: dict[str, str] = field(default_factory=dict)
    patterns: list[tuple[Pattern, str]] = field(default_factory=list)
    aliases: list[tuple[OpAlias, str]] = field(default_factory=list)
    semantics: list[tuple[ModuleSemantics, str]] = field(default_factory=list)
    table: OpTable = field(default_factory=op_table)




def distribution(plugin: str) -> str:
    """The distribution behind a plugin name (``<core>``/``<local>``/``<user>`` otherwise)."""
    if plugin.startswith("<"):
        return plugin
    return get_plugin_manager().source(plugin).distribution


def _add(cat: Catalog, item: Any, src: str) -> None:
    if isinstance(item, (list, tuple)):
        for sub in item:
            _add(cat, sub, src)
    elif isinstance(item, Pass):
        if item.name in cat.passes and cat.pass_sources[item.name] != src:
            old = cat.pass_sources[item.name]
            warnings.warn(
                f"pass {item.name!r} is registered by {old!r} ({distribution(old)}) and "
                f"{src!r} ({distribution(src)}); using {src!r}",
                PassWarning,
                stacklevel=2,
            )
        cat.passes.pop(item.name, None)
        cat.passes[item.name] = item
        cat.pass_sources[item.name] = src
    elif isinstance(item, Pattern):
        cat.patterns.append((item, src))
    elif isinstance(item, OpAlias):
        cat.aliases.append((item, src))  # already in the op table (fxsym.passes.table)
    elif isinstance(item, ModuleSemantics):
        cat.semantics.append((item, src))
    else:
        warnings.warn(
            f"plugin {src!r} ({distribution(src)}) registered {item!r} as a pattern; expected "
            "a Pass, a Pattern, an OpAlias or a ModuleSemantics — skipped",
            PassWarning,
            stacklevel=2,
        )


def catalog() -> Catalog:
    """The current catalog (built once per set of plugin contributions of the current plugin
    manager)."""
    return get_registry().derived(_build_catalog)


def _build_catalog(contributions: Contributions) -> Catalog:
    cat = Catalog()
    for p in core_passes():
        cat.passes[p.name] = p
        cat.pass_sources[p.name] = CORE
    for item, src in contributions.patterns:
        _add(cat, item, src)
    for stage in dict.fromkeys(p.stage for p, _ in cat.patterns):
        if stage not in cat.passes:
            cat.passes[stage] = PatternPass(
                stage, after=("remove_noops",), before=("dce",)
            )
            cat.pass_sources[stage] = CORE
    return cat


def all_passes() -> list[Pass]:
    return list(catalog().passes.values())


def get_pass(name: str) -> Pass:
    cat = catalog()
    try:
        return cat.passes[name]
    except KeyError:
        known = ", ".join(cat.passes)
        raise PassError(f"no pass named {name!r}; known passes: {known}") from None
