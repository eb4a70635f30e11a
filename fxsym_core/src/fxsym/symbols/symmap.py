"""The :class:`SymMap`: the SymInfos of a model's modules, and what the analysis found.

A SymMap is built by walking the model's module tree and asking the registry for each
module's SymInfo (a leaf's children are not visited); :func:`fxsym.analyze` then attaches a
:class:`~fxsym.symbols.groups.GroupAnalysis`, whose searchable groups it offers. It maps
modules to their symbols (a mapping API), names modules, answers why a symbol is constant,
and is marked *stale* once a resize changed the model.

The registry and the tracer's ``TraceReport`` are higher rooms: imported inside
:meth:`SymMap.__init__` (and for annotations only), so this room imports nothing at import
time.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from torch import fx, nn

from .groups import DepthGroup, GroupAnalysis, SymGroup
from .symbol import Symbol
from .syminfo import SymInfo, SymInfoFactory

if TYPE_CHECKING:
    from ..registry import Registry
    from ..tracer.report import TraceReport


class SymMap:
    """The SymInfos of a model's modules and, once analyzed, its cross-layer groups.

    A SymMap describes the model as analyzed: after :func:`fxsym.resize` changed the model it
    is *stale* (:attr:`is_stale`) and must be computed again.
    """

    def __init__(self, model: nn.Module) -> None:
        from ..registry import get_registry
        from ..tracer.report import TraceReport

        self.model = model
        #: the registry the SymInfos came from; resizing the model looks up its rules here
        self.registry: Registry = get_registry()
        #: what :func:`fxsym.analyze` reported while tracing (fallback leaves, boundaries);
        #: empty until then
        self.trace_report: TraceReport = TraceReport()
        self._graph_module: fx.GraphModule | None = None
        #: the outputs whose sizes the analysis kept (``None``: every output); see
        #: :mod:`fxsym.analysis.outputs`
        self.output_contract: tuple[str | int, ...] | None = None
        #: the analysis options that differ from the defaults (``{"norm_groups": "keep"}``;
        #: see :mod:`fxsym.analysis.options`)
        self.analysis_options: dict[str, Any] = {}
        #: state the model derives, found by the trace: by module qualified name, each
        #: attribute and its kind (``modstate.CACHE``: cleared by a resize of the module or a
        #: submodule; ``modstate.DERIVED``: such a resize refuses while it holds tensors;
        #: ``modstate.INVARIANT``: computed from nothing a resize changes, left as it is)
        self.derived_state: dict[str, dict[str, str]] = {}
        self._map: dict[nn.Module, SymInfo] = {}
        self._mod_to_name: dict[nn.Module, str] = {}
        self._analysis: GroupAnalysis | None = None
        self._stale = False
        registry = self.registry
        stack: list[tuple[str, nn.Module]] = [("", model)]
        seen: set[int] = set()
        while stack:
            name, mod = stack.pop()
            if id(mod) in seen:
                continue
            seen.add(id(mod))
            entry = registry.sym_info_entry(type(mod))
            if entry is not None:
                self._map[mod] = entry.factory(mod)
                self._mod_to_name[mod] = name
                if entry.leaf:
                    continue
            children = list(mod.named_children())
            for cname, child in reversed(children):
                stack.append((f"{name}.{cname}" if name else cname, child))
        # keep the model's own module order
        order = {id(m): i for i, m in enumerate(model.modules())}
        self._map = dict(sorted(self._map.items(), key=lambda kv: order.get(id(kv[0]), 0)))

    @property
    def graph_module(self) -> fx.GraphModule | None:
        """The graph :func:`fxsym.analyze` traced and analyzed, as a GraphModule that runs
        like the model. Its Python code is generated on the first read here (the analysis
        itself reads only the graph: ``fxsym.tracer.DeferredGraphModule``)."""
        gm = self._graph_module
        if gm is not None and getattr(gm, "code_pending", False):
            gm.recompile()
        return gm

    @graph_module.setter
    def graph_module(self, gm: fx.GraphModule | None) -> None:
        self._graph_module = gm

    @property
    def graph(self) -> fx.Graph | None:
        """The graph :func:`fxsym.analyze` traced and analyzed, without generating the
        GraphModule's code (reading it writes nothing)."""
        return None if self._graph_module is None else self._graph_module.graph

    @property
    def example_inputs(self) -> Any:
        """The example inputs :func:`fxsym.analyze` traced the model with (``None`` without a
        trace), read without generating the GraphModule's code."""
        return getattr(self._graph_module, "example_inputs", None)

    # -- registration (the in-application way; plugins use hooks) ---------------------------
    @classmethod
    def register(
        cls,
        nn_cls: type[nn.Module] | Iterable[type[nn.Module]],
        is_explicit_leaf: bool = True,
        *,
        resize: Callable[[nn.Module, str, Any], None] | None = None,
        importance: Callable[[nn.Module, str], Any] | None = None,
        value: Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], Any] | None = None,
    ) -> Callable[[SymInfoFactory], SymInfoFactory]:
        """Decorator registering ``factory(module) -> SymInfo`` for one or more module classes.

        A user's registration beats every plugin's. ``is_explicit_leaf`` makes the tracer keep
        such modules as single ``call_module`` nodes. ``resize(module, symbol, index)`` and
        ``importance(module, symbol)`` and ``value(module, args, kwargs)`` are what the
        ``fxsym_register_sym_infos`` hook takes: without ``resize``, ``fxsym.resize`` refuses
        groups holding such a module.
        """
        from ..registry import get_registry

        classes = [nn_cls] if isinstance(nn_cls, type) else list(nn_cls)

        def decorator(factory: SymInfoFactory) -> SymInfoFactory:
            for c in classes:
                get_registry().register_user(c, factory, leaf=is_explicit_leaf, resize=resize,
                                             importance=importance, value=value)
            return factory

        return decorator

    @classmethod
    def unregister(cls, nn_cls: type[nn.Module]) -> None:
        """Remove a registration made with :meth:`register`; ``KeyError`` if there is none."""
        from ..registry import get_registry

        get_registry().unregister_user(nn_cls)

    def __deepcopy__(self, memo: dict[int, Any]) -> SymMap:
        """A deep copy that shares :attr:`registry` (it belongs to the plugin manager, not to
        the model) and the analysis' node layouts (plain immutable data, one entry per node of
        the graph: copying it for every oracle copy would cost more than the model); a
        ``memo`` that maps the registry already gives the copy that one (another manager's)."""
        memo.setdefault(id(self.registry), self.registry)
        analysis = self.__dict__.get("_analysis")
        if analysis is not None:
            memo[id(analysis.node_layouts)] = analysis.node_layouts
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            clone.__dict__[key] = copy.deepcopy(value, memo)
        return clone

    # -- mapping API ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._map)

    def __bool__(self) -> bool:
        return bool(self._map)

    def __contains__(self, key: object) -> bool:
        return key in self._map

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self._map)

    def __getitem__(self, key: nn.Module) -> dict[str, Symbol]:
        return self._map[key].symbols

    def items(self) -> Iterator[tuple[nn.Module, dict[str, Symbol]]]:
        for mod, info in self._map.items():
            yield mod, info.symbols

    def pop(self, key: nn.Module) -> dict[str, Symbol]:
        self._mod_to_name.pop(key)
        return self._map.pop(key).symbols

    def named_modules(self) -> Iterator[tuple[str, nn.Module]]:
        for mod in self._map:
            yield self._mod_to_name[mod], mod

    def named_sym_dicts(self) -> Iterator[tuple[str, dict[str, Symbol]]]:
        for mod, info in self._map.items():
            yield self._mod_to_name[mod], info.symbols

    def named_symbols(
        self,
        key: nn.Module | None = None,
        free: bool | None = None,
        dynamic: bool | None = None,
        searchable: bool | None = None,
        constant: bool | None = None,
    ) -> Iterator[tuple[str, Symbol]]:
        """Yield ``(qualified_name, symbol)``, optionally filtered by state.

        With no filter every symbol is yielded. A filter set to ``True`` selects that state
        (several ``True`` filters select their union); a filter set to ``False`` excludes it.
        """
        flags = {"free": free, "dynamic": dynamic, "searchable": searchable, "constant": constant}
        if any(v is True for v in flags.values()):
            wanted = {k for k, v in flags.items() if v is True}
        else:
            wanted = {k for k, v in flags.items() if v is not False}
        mods = self._map if key is None else {key: self._map[key]}
        for mod, info in mods.items():
            prefix = self._mod_to_name[mod]
            prefix = f"{prefix}." if prefix and key is None else ""
            for sname, sym in info.symbols.items():
                if any(getattr(sym, f"is_{state}") for state in wanted):
                    yield prefix + sname, sym

    def name_of(self, mod: nn.Module) -> str:
        """The qualified name of ``mod`` in the model; ``KeyError`` if it has no SymInfo here."""
        return self._mod_to_name[mod]

    def sym_info(self, mod: nn.Module) -> SymInfo:
        """The SymInfo of ``mod``; ``KeyError`` if it has none here."""
        return self._map[mod]

    def get_symbol(self, mod: nn.Module, name: str) -> Symbol:
        return self._map[mod].symbols[name]

    def set_symbol(self, mod: nn.Module, name: str, symbol: Symbol) -> None:
        self._map[mod].symbols[name] = symbol

    def is_shape_preserving(self, key: nn.Module) -> bool:
        return self._map[key].is_shape_preserving

    def add_sym_info(self, key: nn.Module, sym_info: SymInfo) -> None:
        """Attach a SymInfo to one module of the model by hand."""
        for name, mod in self.model.named_modules():
            if mod is key:
                self._map[mod] = sym_info
                self._mod_to_name[mod] = name
                return
        raise ValueError(f"{type(key).__name__} is not a module of this model")

    def prune(self) -> None:
        """Drop the modules whose symbols are all constant."""
        for mod in [m for m, i in self._map.items()
                    if all(s.is_constant for s in i.symbols.values())]:
            del self._map[mod]
            del self._mod_to_name[mod]

    # -- analysis ---------------------------------------------------------------------------
    def attach_analysis(self, analysis: GroupAnalysis) -> None:
        """Record what :func:`fxsym.analyze` found; :meth:`groups` offers its groups."""
        self._analysis = analysis

    @property
    def analysis(self) -> GroupAnalysis | None:
        """What :func:`fxsym.analyze` found, or ``None`` before an analysis was attached."""
        return self._analysis

    def mark_stale(self) -> None:
        """Record that the model changed since this SymMap was computed (a resize did it)."""
        self._stale = True

    @property
    def is_stale(self) -> bool:
        """Whether the model changed since this SymMap was computed; analyze it again."""
        return self._stale

    # -- groups -----------------------------------------------------------------------------
    def groups(self) -> list[SymGroup]:
        """The searchable cross-layer groups found by :func:`fxsym.analyze`, in graph order."""
        return [] if self._analysis is None else list(self._analysis.groups)

    def depth_groups(self) -> list[DepthGroup]:
        """The depth groups found by :func:`fxsym.analyze` (stacks of residual blocks whose
        blocks may be dropped), in module order; not among :meth:`groups`."""
        return [] if self._analysis is None else list(self._analysis.depth_groups)

    def depth_group(self, name: str) -> DepthGroup:
        """The depth group called ``name``; ``KeyError`` if there is none."""
        for g in self.depth_groups():
            if g.name == name:
                return g
        raise KeyError(name)

    def group(self, name: str) -> SymGroup:
        for g in self.groups():
            if g.name == name:
                return g
        raise KeyError(name)

    def why_constant(self, qualname: str, symbol: str) -> str | None:
        """Why a cross-layer symbol cannot change (the first boundary its group met), or
        ``None`` if it belongs to a searchable group."""
        analysis = self._analysis
        dim = None if analysis is None else analysis.symbol_dims.get((qualname, symbol))
        if analysis is None or dim is None:
            return "not reached by the traced graph (unused, or inside a leaf without a SymInfo)"
        table = analysis.table
        groups = [s.group for s in dim if s.group is not None]
        reasons = [table.reason(g) for g in groups]
        if not reasons:
            return "its dimension is fixed where it enters the module (a model input or a literal)"
        live = {g.id for g in analysis.groups}
        if any(table.find(g) in live for g in groups):
            return None
        return next((r for r in reasons if r), "no searchable producer feeds its group")

    def __repr__(self) -> str:
        groups = self.groups()
        lines = [f"SymMap(model={type(self.model).__name__}, groups={len(groups)})"]
        for g in groups:
            lines.append(f"  {g.name}: size={g.size} members={len(g.members)}")
        return "\n".join(lines)
