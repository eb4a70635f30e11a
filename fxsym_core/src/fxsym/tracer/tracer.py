"""The hook-driven tracer.

:class:`FxsymTracer` is a ``torch.fx.Tracer`` whose decisions come from the registry:

* **leaf policy** — plugin policies vote first (the first ``True``/``False`` wins), then a
  registered SymInfo makes a module a leaf, then torch.fx's own rule (``torch.nn`` modules);
* **robust tracing** — a non-leaf submodule whose forward cannot be traced is rolled back out
  of the graph, kept as one ``call_module`` node and recorded in the trace report;
* **values** — with example inputs, each node's value is computed on the ``meta`` device when
  the node is created (``node.meta["val"]``), which is what :class:`ShapeProxy` answers from
  (:mod:`.nodevalues`); a traced-into module's int attributes read as sizes
  (:mod:`.attribute_sizes`);
* **proxy factory** — the class of each proxy is chosen by the type of its value (plugins may
  give a value type its own ``ShapeProxy`` subclass);
* **root call** — a root ``forward`` hidden behind ``functools.wraps`` decorators or taking
  ``*args``/``**kwargs`` is called with keyword arguments (placeholders only for the example
  inputs), so decorators run as ordinary Python; a ``Mapping`` output of another type (a
  dataclass-like output object) is returned as a plain ``dict``;
* **buffers** used in ``forward`` become ``get_attr`` nodes even when indexed or expanded
  with traced sizes; a module built inside ``forward`` (not a submodule) is traced through;
  torch's factories given traced sizes record nodes (:mod:`.factories`);
* **the user's modules stay out** — a call or read of a user's module by the model's code
  (not a shadow's) is refused (:mod:`.escapes`).

The class is one tracer whose parts share its state (:class:`~.state.TracerState`); each
part is a class of its own module, combined by inheritance: this module holds the decisions
above, :mod:`.nodevalues` and :mod:`.attribute_sizes` the values. :func:`~.api.trace` wraps
it (:mod:`.api`): plugins, example inputs, the shadow tree, and the ``GraphModule``
(:mod:`.finish` checks the names it will write as code, :mod:`.assembly` builds it).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.nn.utils import parametrize

from ..errors import ModelError, PluginError
from .attribute_sizes import AttributeSizes
from .configs import config_sizes
from .escapes import UserModuleReached, reached, reached_from_code, reads_watched
from .factories import _traced_factories
from .guard import tracing_here
from .hooksites import HookSite, node_names
from .nodevalues import NodeValues
from .proxy import ShapeProxy, value_of
from .questions import ATTRIBUTE_META, CONCRETE_META


class FxsymTracer(NodeValues, AttributeSizes):
    """A torch.fx Tracer whose leaf, proxy and fallback decisions are hooks."""

    #: buffers become get_attr nodes, so ``self.ids[:, :n]`` follows a traced ``n``
    proxy_buffer_attributes = True

    # -- leaf policy -----------------------------------------------------------------------
    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self.fallback_leaves:
            return True
        decided, self._decided = self._decided, None
        if decided is not None and decided[0] is m and decided[1] == module_qualified_name:
            return decided[2]
        leaf = self._leaf_decision(m, module_qualified_name)
        if leaf and self.shadows is not None and id(m) in self.shadows.hooked:
            self.report.add("traced-into", module_qualified_name,
                            f"{type(m).__name__} has forward hooks that are part of the "
                            "computation (fxsym_hook_computes); traced into so that they run "
                            "on the traced values")
            return False
        return leaf

    def _leaf_decision(self, m: nn.Module, module_qualified_name: str) -> bool:
        with self._owncall():
            vote = self.registry.leaf_vote(self.original(m), module_qualified_name)
        if vote is not None:
            return vote
        if _is_parametrized(m):
            self.report.add("traced-into", module_qualified_name,
                            f"{type(m).__name__} is parametrized (its weights are computed by "
                            "torch.nn.utils.parametrize); its family's SymInfo and resize "
                            "rule do not apply, so it is traced into")
            return False
        cls = type(m)
        stamp = self.registry.stamp
        if stamp != self._class_stamp:  # a plugin disabled meanwhile: ask again
            self._class_leaf.clear()
            self._class_stamp = stamp
        by_class = self._class_leaf.get(cls)
        if by_class is None:
            by_class = self._class_leaf[cls] = self._class_decision(m)
        leaf, base = by_class
        if base is not None:
            self.report.add("traced-into", module_qualified_name,
                            f"{cls.__name__} overrides forward of {base.__name__}, whose "
                            "SymInfo therefore does not apply; traced into it")
        return leaf

    def _class_decision(self, m: nn.Module) -> tuple[bool, type | None]:
        """What decides for every module of ``m``'s class once the plugins did not and it is
        not parametrized: its SymInfo registration's ``leaf``, else tracing into it if it
        overrides the ``forward`` of a registered base (that base), else torch.fx's rule
        (``torch.nn`` modules are leaves). Asked once per class while the registry stays as
        it is (:attr:`~fxsym.registry.Registry.stamp`)."""
        entry = self.registry.sym_info_entry(type(m))
        if entry is not None:
            return entry.leaf, None
        base = self.registry.shadowed_base(type(m))
        if base is not None:
            return False, base
        return super().is_leaf_module(m, ""), None

    # -- robust tracing --------------------------------------------------------------------
    def call_module(
        self,
        m: nn.Module,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        if self.shadows is not None and self._own == 0 and tracing_here() and (
                self.shadows.is_user_module(m)):
            self._escape(m, "called")
        if self._quiet or not tracing_here():  # a leaf run for its value, another thread
            return forward(*args, **kwargs)
        try:
            path = self.path_of_module(m)
        except NameError:  # built inside forward, not a submodule: trace through it
            return forward(*args, **kwargs)
        unseen = None if self.shadows is None else (
            self.shadows.unseen.get(id(m), []) + self.shadows.global_unseen)
        if not unseen:
            return self._call_module_at(m, path, forward, args, kwargs)
        out = self._call_module_at(m, path, forward, args, kwargs)
        self.hook_sites.append(HookSite(path, tuple(unseen), node_names((args, kwargs)),
                                        node_names(out)))
        return out

    def _call_module_at(self, m: nn.Module, path: str, forward: Callable[..., Any],
                        args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._decided = None
        leaf = not path or self.is_leaf_module(m, path)
        if path:
            self._decided = (m, path, leaf)
        if leaf:
            return super().call_module(m, forward, args, kwargs)
        last = self.graph._root.prev  # the newest node before this call
        stack = self.module_stack.copy()  # torch.fx does not unwind it on an exception

        def traced_forward(*a: Any, **k: Any) -> Any:
            with self._attribute_sizes(m, path), config_sizes(self, m, path):
                return forward(*a, **k)

        self._check_code(m, path)
        try:
            return super().call_module(m, traced_forward, args, kwargs)
        except (ModelError, PluginError, UserModuleReached):
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
        self.module_stack.clear()
        self.module_stack.update(stack)
        self._rollback(last)
        self.fallback_leaves.add(path)
        self.report.add("leaf-fallback", path, f"{type(m).__name__} kept as a leaf: {reason}")
        out = super().call_module(m, forward, args, kwargs)
        if self.shadows is not None and id(m) in self.shadows.hooked:  # they ran in no graph
            self.hook_sites.append(HookSite(
                path, ("its forward hooks declared part of the computation do not run in the "
                       "graph: it fell back to a leaf",), node_names((args, kwargs)),
                node_names(out)))
        return out

    # -- the user's modules stay out (:mod:`.escapes`) -----------------------------------------
    def _escape(self, mod: nn.Module, how: str) -> None:
        """The model's code reached the user's module ``mod``: refuse (recorded too, in case
        the model's code catches the error)."""
        assert self.shadows is not None
        where = next(reversed(self.module_stack), "") if self.module_stack else ""
        error = reached(str(where), self.shadows.name_of(mod), mod, how)
        if self.escaped is None:
            self.escaped = error
        raise error

    def _shadow_classes(self) -> set[type]:
        return set() if self.shadows is None else {type(s) for s, _ in self.shadows.shadows()}

    def _read_checked(self, mod: nn.Module, attr: str) -> None:
        if (self._own == 0 and self.shadows is not None and tracing_here()
                and self.shadows.is_user_module(mod)):
            self._escape(mod, f"read its {attr!r}")

    def _check_code(self, m: nn.Module, path: str) -> None:
        """Refuse a traced class whose code reads a user's module from a global or a closure
        (:func:`.escapes.reached_from_code`), once per class."""
        cls = type(m)
        if self.shadows is None or cls in self._code_checked:
            return
        self._code_checked.add(cls)
        found = reached_from_code(cls, self.shadows.is_user_module)
        if found is not None:
            how, module = found
            error = reached(path, self.shadows.name_of(module), module, how)
            self.escaped = self.escaped or error
            raise error

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if self._quiet or not tracing_here():
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def _rollback(self, last: torch.fx.Node) -> None:
        while self.graph._root.prev is not last:
            node = self.graph._root.prev
            for user in list(node.users):
                if user.op != "output":
                    self._erase(user)
            self._erase(node)

    def _erase(self, node: torch.fx.Node) -> None:
        self.graph.erase_node(node)
        proxy = self._attribute_nodes.pop(node, None)
        if proxy is not None:  # an attribute first used inside: its node made again later
            proxy.forget()

    # -- root call -------------------------------------------------------------------------
    def create_args_for_root(
        self, root_fn: Callable[..., Any], is_module: bool, concrete_args: Any = None
    ) -> tuple[Callable[..., Any], list[Any]]:
        fn, args = self._root_args(root_fn, is_module, concrete_args)
        if not is_module:
            return fn, args

        def root_forward(*a: Any, **k: Any) -> Any:  # the root's int attributes read as sizes
            self._check_code(self.root, "")
            with self._attribute_sizes(self.root, ""), config_sizes(self, self.root, ""), \
                    reads_watched(self._shadow_classes(), self._read_checked):
                return fn(*a, **k)

        return root_forward, args

    def _root_args(
        self, root_fn: Callable[..., Any], is_module: bool, concrete_args: Any = None
    ) -> tuple[Callable[..., Any], list[Any]]:
        if not (self.with_values and is_module and _needs_keyword_call(root_fn)):
            return super().create_args_for_root(root_fn, is_module, concrete_args)
        assert self.placeholder_values is not None
        params = inspect.signature(inspect.unwrap(root_fn)).parameters
        names = [n for n in params if n in self.placeholder_values]
        static = {k: v for k, v in (concrete_args or {}).items()
                  if not k.startswith("*") and k not in self.defaults and k in params}
        placeholders = [self.create_proxy("placeholder", n, (), {}) for n in names]

        def root(module: nn.Module, *values: Any) -> Any:
            return _plain_output(root_fn(module, **dict(zip(names, values)), **static))

        return root, [self.root, *placeholders]

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> torch.fx.Graph:
        # the plugins' registrations are collected before fxsym and torch.fx patch functions
        # (the trace contexts, entered already, may have added some): a rule for
        # ``torch.zeros`` must be keyed by the function the graph records, not by the patch
        self.registry.contributions  # noqa: B018 (the property collects them)
        with _traced_factories():
            graph = super().trace(root, concrete_args)
        for node in reversed(list(graph.nodes)):  # attributes the forward did not read
            if ATTRIBUTE_META in node.meta and not node.users and CONCRETE_META not in node.meta:
                graph.erase_node(node)
        return graph

    # -- proxy factory ---------------------------------------------------------------------
    def proxy(self, node: torch.fx.Node) -> torch.fx.Proxy:
        val = value_of(node)
        cls: type[torch.fx.Proxy] = ShapeProxy
        if "val" in node.meta:
            found = self.registry.proxy_class(type(val))
            if found is not None:
                if not issubclass(found, torch.fx.Proxy):
                    raise PluginError(f"the proxy class registered for {type(val).__name__} "
                                      f"values, {found!r}, is not a ShapeProxy subclass")
                cls = found
        return cls(node, self)


_PARAMETRIZATIONS = "parametrizations"


def _is_parametrized(m: nn.Module) -> bool:
    """``parametrize.is_parametrized(m)``. Its ``getattr(m, "parametrizations", None)`` raises
    and catches an ``AttributeError`` inside ``nn.Module.__getattr__`` for the usual module; a
    module whose class looks attributes up the standard way and that holds the name nowhere
    that lookup reads (class, ``__dict__``, parameters, buffers, submodules) is not
    parametrized without asking."""
    cls = type(m)
    if (cls.__getattr__ is nn.Module.__getattr__
            and cls.__getattribute__ is object.__getattribute__
            and _PARAMETRIZATIONS not in m._modules and _PARAMETRIZATIONS not in vars(m)
            and _PARAMETRIZATIONS not in m._parameters and _PARAMETRIZATIONS not in m._buffers
            and getattr(cls, _PARAMETRIZATIONS, None) is None):
        return False
    return parametrize.is_parametrized(m)


def _needs_keyword_call(fn: Callable[..., Any]) -> bool:
    """torch.fx patches the code of the outer function but reads the signature of the inner
    one: a decorated ``forward``, or one with ``*args``/``**kwargs``, is called by keyword."""
    if inspect.unwrap(fn) is not fn:
        return True
    kinds = {p.kind for p in inspect.signature(fn).parameters.values()}
    return bool(kinds & {inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL})



def _plain_output(out: Any) -> Any:
    """A Mapping output of another type (an output dataclass) as a plain dict."""
    if isinstance(out, Mapping) and type(out) is not dict:
        return {k: v for k, v in out.items() if v is not None}
    return out

