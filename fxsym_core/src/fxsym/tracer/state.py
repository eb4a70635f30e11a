"""What one trace's tracer holds, and how it reads the traced tree without recording.

:class:`TracerState` is the base of :class:`~fxsym.tracer.FxsymTracer`: it holds the state
every part of the tracer shares (the registry, the report, the placeholder values, the
fallback leaves, the caches of leaf decisions and node values, the shadow tree and the
sites whose hooks the trace does not see), says which user's object a shadow stands for
(:meth:`~TracerState.original`), and lets go of the traced tree when the trace is done
(:meth:`~TracerState.release`). Two blocks run fxsym's own code while torch.fx's patches are
active: :meth:`~TracerState._quietly` runs real modules without recording nodes, and
:meth:`~TracerState._owncall` marks reads of the user's modules as fxsym's, not the
model's (:mod:`.escapes`).

The tracer is one ``torch.fx.Tracer`` whose overrides share this state; its parts are
classes of one concern each, in modules of their own, combined by inheritance (torch.fx
calls them as methods of one tracer): :class:`TracerState` here, node values
(:mod:`.nodevalues`), sizes read from attributes (:mod:`.attribute_sizes`), and the leaf
policy, robust fallback, root call and proxy factory (:mod:`.tracer`).

Imports from fxsym: registry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx
from torch import nn

from ..registry import ValueFn, get_registry
from .escapes import UserModuleReached
from .hooksites import HookSite
from .proxy import ShapeProxy
from .report import TraceReport
from .shadow import ShadowTree


class TracerState(torch.fx.Tracer):
    """The state one trace shares across the parts of the tracer, and its quiet reads."""

    def __init__(
        self,
        placeholder_values: dict[str, Any] | None = None,
        report: TraceReport | None = None,
        defaults: set[str] | None = None,
    ) -> None:
        # torch annotates autowrap_modules as a 1-tuple (``Tuple[ModuleType]``)
        super().__init__(autowrap_modules=(), autowrap_functions=())  # type: ignore[arg-type]
        self.registry = get_registry()
        self.report = report if report is not None else TraceReport()
        self.placeholder_values = placeholder_values
        self.with_values = placeholder_values is not None
        self.fallback_leaves: set[str] = set()
        #: arguments fixed to their defaults (not passed on a keyword root call)
        self.defaults: set[str] = set(defaults or ())
        self._quiet = False
        self._meta_modules: dict[int, nn.Module] = {}
        self._modules_by_path: dict[str, nn.Module] | None = None
        #: key of each torch.nn leaf (:func:`_module_key`) and the values computed by key
        self._module_keys: dict[int, Any] = {}
        self._leaf_values: dict[Any, Any] = {}
        self._preserving: dict[int, bool] = {}
        self._class_leaf: dict[type, tuple[bool, type | None]] = {}
        self._class_stamp: tuple[int, int] | None = None
        self._value_rules: dict[int, ValueFn | None] = {}
        #: value of each int attribute read as a ``get_attr`` node, by target
        self._attribute_values: dict[str, int | tuple[int, ...]] = {}
        #: ids of the modules whose int attributes are proxies at the moment
        self._sizing: set[int] = set()
        #: the nodes made for int attributes, with their deferred proxies (a rollback that
        #: erases one makes its proxy forget it)
        self._attribute_nodes: dict[torch.fx.Node, ShapeProxy | None] = {}
        #: whether a node's value is being computed (the model's code is run, not traced)
        self._evaluating = False
        #: values asked ``__index__`` since the last node (:func:`.questions.drop_index_questions`)
        self.index_questions: list[torch.fx.Node] = []
        #: the decision call_module just took, which torch.fx's call_module asks for again
        self._decided: tuple[nn.Module, str, bool] | None = None
        #: the shadow tree traced in place of the user's (:mod:`.shadow`), if any
        self.shadows: ShadowTree | None = None
        #: the calls of modules whose hooks the trace does not see (:mod:`.hooksites`)
        self.hook_sites: list[HookSite] = []
        #: fxsym's own calls given the user's modules (leaf votes, value rules) under way:
        #: their reads of them are not the model's code reaching them (:mod:`.escapes`)
        self._own = 0
        #: the first time the model's code reached a user's module (:mod:`.escapes`)
        self.escaped: UserModuleReached | None = None
        self._code_checked: set[type] = set()

    def original(self, obj: Any) -> Any:
        """The user's module (or config) behind a shadow (or config copy): what plugins are
        shown and what the analysis identifies objects by."""
        return obj if self.shadows is None else self.shadows.original(obj)

    def release(self) -> None:
        """Let go of the traced module tree once the trace is done. A torch.fx tracer stays
        alive after its trace, until the cyclic collector runs (a recursive closure of
        ``Tracer.trace`` holds it), and so would every module it holds: let go, a shadow
        tree is freed as soon as the trace returns, and the collector never walks it."""
        self.root = None  # type: ignore[assignment]
        self.submodule_paths = None
        self.shadows = None
        self._modules_by_path = None
        self._meta_modules.clear()
        self._attribute_nodes.clear()
        self._decided = None

    @contextlib.contextmanager
    def _owncall(self) -> Iterator[None]:
        """fxsym's own code handed the user's modules runs in the block (not the model's)."""
        self._own += 1
        try:
            yield
        finally:
            self._own -= 1


    @contextlib.contextmanager
    def _quietly(self) -> Any:
        """Run real modules while torch.fx's patches are active, without recording nodes
        (setting ``nn.Module.__call__`` back and forth instead costs ~1 ms a call)."""
        self._quiet, was = True, self._quiet
        try:
            yield
        finally:
            self._quiet = was

    def attribute_object(self, target: str) -> Any:
        """The object the traced root holds at ``target`` (a ``get_attr`` node's), read
        without recording anything."""
        obj: Any = self.root
        with self._quietly():
            for part in target.split("."):
                obj = getattr(obj, part)
        return obj
