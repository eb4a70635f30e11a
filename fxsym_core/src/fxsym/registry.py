"""What fxsym knows about module families and ops, gathered from users and plugins.

Two layers: registrations made in the application (``SymMap.register``, highest precedence,
one table for the process) and contributions of plugins, collected by calling each plugin's
registration hooks once per change of the plugin set. Each plugin manager has its own
:class:`Registry` (:func:`get_registry` answers for the current one, see
:func:`fxsym.plugins.use_plugins`), so two managers never see each other's contributions.
Lookups by class are answered from a cached table that is dropped whenever either layer
changes.

Whether a module is a leaf is also asked of the plugins per module (the ``fxsym_leaf_module``
decision hook, :meth:`Registry.leaf_vote`), before the SymInfo registration's ``leaf``.

Imports from fxsym: errors, naming, plugins.

SymInfo precedence for a module class ``C``:

1. a user registration for ``C`` or a base of ``C`` (most specific first);
2. a plugin registration for ``C`` or a base of ``C`` (most specific first).

A registration for a base class applies to ``C`` only if ``C`` does not override ``forward``
(a subclass that computes something else must not inherit a SymInfo that no longer fits);
otherwise the tracer traces into ``C``.

A plugin whose registration hook or leaf policy raises is disabled (see
:mod:`fxsym.plugins.calls`): none of its contributions is kept, from any hook.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from torch import nn

from .errors import PluginWarning
from .naming import qualname
from .plugins.calls import call_each, leaf_vote
from .plugins.contracts import ImportanceFn as ImportanceFn
from .plugins.contracts import ResizeFn as ResizeFn
from .plugins.contracts import ValueFn as ValueFn
from .plugins.manager import PLUGIN_ERRORS, PluginManager, get_plugin_manager

T = TypeVar("T")


@dataclass(frozen=True)
class SymInfoEntry:
    """How one module family is described and resized."""

    cls: type | str  # a dotted name for a class of an optional package
    factory: Callable[[nn.Module], Any]
    leaf: bool = True
    resize: ResizeFn | None = None
    importance: ImportanceFn | None = None
    source: str = "<user>"
    value: ValueFn | None = None


@dataclass
class Contributions:
    """Everything the plugins contributed, by plugin name."""

    sym_infos: dict[Any, SymInfoEntry] = field(default_factory=dict)
    op_rules: dict[Any, tuple[Callable[..., Any], str]] = field(default_factory=dict)
    proxies: dict[type, tuple[type, str]] = field(default_factory=dict)
    patterns: list[tuple[Any, str]] = field(default_factory=list)

    def by_plugin(self) -> dict[str, dict[str, list[str]]]:
        out: dict[str, dict[str, list[str]]] = {}

        def add(src: str, kind: str, what: str) -> None:
            out.setdefault(src, {}).setdefault(kind, []).append(what)

        for cls, entry in self.sym_infos.items():
            add(entry.source, "sym_infos", cls if isinstance(cls, str) else qualname(cls))
        for target, (_, src) in self.op_rules.items():
            add(src, "op_rules", target if isinstance(target, str) else qualname(target))
        for vtype, (pcls, src) in self.proxies.items():
            add(src, "proxies", f"{qualname(vtype)} -> {qualname(pcls)}")
        for item, src in self.patterns:
            add(src, "patterns", getattr(item, "name", None) or qualname(item))
        return out


class UserRegistrations:
    """The application's own registrations (``SymMap.register``), shared by every
    registry; ``version`` counts the changes."""

    def __init__(self) -> None:
        self.entries: dict[type | str, SymInfoEntry] = {}
        self.version = 0

    def add(self, entry: SymInfoEntry) -> None:
        self.entries[entry.cls] = entry
        self.version += 1

    def remove(self, cls: type | str) -> None:
        del self.entries[cls]
        self.version += 1


USER = UserRegistrations()


class Registry:
    """User registrations plus one plugin manager's contributions, with cached lookups."""

    def __init__(self, pm: PluginManager) -> None:
        self._manager = weakref.ref(pm)  # the manager owns its registry, not the reverse
        self._user = USER.entries
        self._plugins = Contributions()
        self._generation = -1
        self._user_version = -1
        self._sym_cache: dict[type, SymInfoEntry | None] = {}
        self._shadow_cache: dict[type, type | None] = {}
        self._proxy_cache: dict[type, type | None] = {}
        self._derived: dict[Callable[[Contributions], Any], Any] = {}

    @property
    def plugin_manager(self) -> PluginManager:
        pm = self._manager()
        if pm is None:
            raise RuntimeError("the plugin manager of this registry no longer exists")
        return pm

    # -- user layer -------------------------------------------------------------------------
    def register_user(
        self,
        cls: type[nn.Module],
        factory: Callable[[nn.Module], Any],
        *,
        leaf: bool = True,
        resize: ResizeFn | None = None,
        importance: ImportanceFn | None = None,
        value: ValueFn | None = None,
    ) -> None:
        """Register ``cls`` for the whole process (every registry sees it)."""
        USER.add(SymInfoEntry(cls, factory, leaf, resize, importance, "<user>", value))

    def unregister_user(self, cls: type[nn.Module]) -> None:
        USER.remove(cls)

    # -- plugin layer -----------------------------------------------------------------------
    @property
    def contributions(self) -> Contributions:
        self._refresh()
        return self._plugins

    def derived(self, build: Callable[[Contributions], T]) -> T:
        """``build(contributions)``, computed once per set of this registry's plugin
        contributions (the pass catalog and op table of :mod:`fxsym.passes` are such)."""
        self._refresh()
        try:
            return self._derived[build]  # type: ignore[no-any-return]
        except KeyError:
            value = self._derived[build] = build(self._plugins)
            return value

    def invalidate(self) -> None:
        """Collect the plugins' registrations again at the next lookup: for a plugin whose
        contributions grow with what it has seen (classes discovered in a model)."""
        self._generation = -1

    def _refresh(self) -> None:
        if USER.version != self._user_version:
            self._user_version = USER.version
            self._forget()
        pm = self.plugin_manager
        if pm.generation == self._generation:
            return
        plugins = _collect(pm)  # may disable plugins, which changes the generation
        self._generation = pm.generation
        self._plugins = plugins
        self._forget()
        self._proxy_cache.clear()
        self._derived.clear()

    @property
    def stamp(self) -> tuple[int, int]:
        """Changes whenever what the lookups answer may change (a user registration, a
        plugin added, disabled or contributing anew)."""
        return USER.version, self.plugin_manager.generation

    # -- lookups ----------------------------------------------------------------------------
    def sym_info_entry(self, cls: type) -> SymInfoEntry | None:
        """The SymInfo registration that applies to ``cls`` (see the module docstring)."""
        self._refresh()
        try:
            return self._sym_cache[cls]
        except KeyError:
            pass
        entry = _lookup(cls, self._user) or _lookup(cls, self._plugins.sym_infos)
        self._sym_cache[cls] = entry
        return entry

    def _forget(self) -> None:
        self._sym_cache.clear()
        self._shadow_cache.clear()

    def shadowed_base(self, cls: type) -> type | None:
        """The registered base class whose SymInfo ``cls`` does not inherit because it
        overrides ``forward`` (``None`` if there is none, or if ``cls`` has its own)."""
        if self.sym_info_entry(cls) is not None:
            return None
        try:
            return self._shadow_cache[cls]
        except KeyError:
            pass
        found = None
        for base in cls.__mro__[1:]:
            name = qualname(base)
            if any(base in t or name in t for t in (self._user, self._plugins.sym_infos)):
                found = base
                break
        self._shadow_cache[cls] = found
        return found

    def leaf_vote(self, module: nn.Module, qualname: str) -> bool | None:
        """The plugins' answer on whether ``module`` is a leaf (``fxsym_leaf_module``), or
        ``None``. An implementation that raises disables its plugin."""
        return leaf_vote(module, qualname, self.plugin_manager)

    def op_rule(self, target: Any) -> Callable[..., Any] | None:
        """The rule for a node target: the callable itself, a method name, or the callable's
        dotted ``module.qualname`` (so plugins can name functions of optional packages)."""
        self._refresh()
        rules = self._plugins.op_rules
        try:
            found = rules.get(target)
        except TypeError:  # unhashable target
            return None
        if found is None and not isinstance(target, str):
            found = rules.get(qualname(target))
        return found[0] if found else None

    def proxy_class(self, value_type: type) -> type | None:
        self._refresh()
        try:
            return self._proxy_cache[value_type]
        except KeyError:
            pass
        found = None
        for base in value_type.__mro__:
            if base in self._plugins.proxies:
                found = self._plugins.proxies[base][0]
                break
        self._proxy_cache[value_type] = found
        return found


def _lookup(cls: type, table: dict[Any, SymInfoEntry]) -> SymInfoEntry | None:
    """Most specific registration for ``cls``: by class, or by dotted ``module.qualname``
    (which lets a plugin describe classes of optional packages without importing them)."""
    if not table:
        return None
    forward = getattr(cls, "forward", None)
    for base in cls.__mro__:
        entry = table.get(base) or table.get(qualname(base))
        if entry is not None:
            return entry if (base is cls or getattr(base, "forward", None) is forward) else None
    return None


def _collect(pm: PluginManager) -> Contributions:
    """Call every plugin's registration hooks, attributing each contribution to its plugin.

    Registrations are recorded per plugin first and applied once every hook has run. If a
    plugin is disabled meanwhile (its hook, a wrapper around it, or one of its registrations
    raised), everything is collected again without it: half of a broken plugin never takes
    part, and conflict warnings only name plugins that stay.

    Within each hook the plugins' registrations are applied in the reverse of pluggy's call
    order, so the one applied last, which wins a conflict, is the one pluggy calls first
    (``tryfirst`` plugins, then the latest registered)."""
    generation = pm.generation
    contrib = Contributions()
    sym_owner: dict[Any, str] = {}
    recorded: list[tuple[str, str, Callable[[], None]]] = []

    def run(hook_name: str, make_register: Callable[[str], Callable[..., None]]) -> None:
        by_plugin: list[list[tuple[str, str, Callable[[], None]]]] = []

        def kwargs_for(name: str) -> dict[str, Any]:
            calls: list[tuple[str, str, Callable[[], None]]] = []
            by_plugin.append(calls)
            apply = make_register(name)

            def record(*args: Any, **kwargs: Any) -> None:
                calls.append((name, hook_name, lambda: apply(*args, **kwargs)))

            return {"register": record}

        for _ in call_each(pm, hook_name, kwargs_for):
            pass
        for calls in reversed(by_plugin):
            recorded.extend(calls)

    def sym_infos(src: str) -> Callable[..., None]:
        def register(
            nn_cls: type | str | tuple[type | str, ...] | list[type | str],
            factory: Callable[[nn.Module], Any],
            *,
            leaf: bool = True,
            resize: ResizeFn | None = None,
            importance: ImportanceFn | None = None,
            value: ValueFn | None = None,
        ) -> None:
            for cls in nn_cls if isinstance(nn_cls, (tuple, list)) else (nn_cls,):
                if cls in sym_owner and sym_owner[cls] != src:
                    warnings.warn(
                        f"{cls if isinstance(cls, str) else qualname(cls)} is described by "
                        "two plugins: "
                        f"{pm.source(sym_owner[cls]).distribution!r} ({sym_owner[cls]}) and "
                        f"{pm.source(src).distribution!r} ({src}); using {src!r}",
                        PluginWarning,
                        stacklevel=2,
                    )
                sym_owner[cls] = src
                contrib.sym_infos[cls] = SymInfoEntry(cls, factory, leaf, resize, importance, src,
                                                      value)

        return register

    def op_rules(src: str) -> Callable[..., None]:
        def register(target: Any, rule: Callable[..., Any]) -> None:
            targets = target if isinstance(target, (tuple, list)) else (target,)
            for t in targets:
                contrib.op_rules[t] = (rule, src)

        return register

    def proxies(src: str) -> Callable[..., None]:
        def register(value_type: type, proxy_cls: type) -> None:
            contrib.proxies[value_type] = (proxy_cls, src)

        return register

    def patterns(src: str) -> Callable[..., None]:
        return lambda item: contrib.patterns.append((item, src))

    run("fxsym_register_sym_infos", sym_infos)
    run("fxsym_register_op_rules", op_rules)
    run("fxsym_register_proxies", proxies)
    run("fxsym_register_patterns", patterns)
    if pm.generation != generation:  # a plugin was disabled: without any of its parts
        return _collect(pm)
    for name, hook_name, apply in recorded:
        try:
            apply()
        except PLUGIN_ERRORS as exc:  # a registration with bad arguments
            pm.disable(name, exc, hook_name)
            return _collect(pm)
    return contrib


_REGISTRIES: weakref.WeakKeyDictionary[PluginManager, Registry] = weakref.WeakKeyDictionary()


def registry_of(pm: PluginManager) -> Registry:
    """The registry of plugin manager ``pm`` (made on first use)."""
    registry = _REGISTRIES.get(pm)
    if registry is None:
        registry = _REGISTRIES[pm] = Registry(pm)
    return registry


def get_registry() -> Registry:
    """The registry of the current plugin manager (see :func:`fxsym.plugins.use_plugins`)."""
    return registry_of(get_plugin_manager())
