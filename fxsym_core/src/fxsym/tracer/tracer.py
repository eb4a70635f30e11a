"""The hook-driven tracer.

:class:`FxsymTracer` is a ``torch.fx.Tracer`` whose decisions come from the registry:

* **leaf policy** — plugin policies vote first (the first ``True``/``False`` wins), then a
  registered SymInfo makes a module a leaf, then torch.fx's own rule (``torch.nn`` modules);
* **robust tracing** — a non-leaf submodule whose forward cannot be traced is rolled back out
  of the graph, kept as one ``call_module`` node and recorded in the trace report;
* **values** — with example inputs, each node's value is computed on the ``meta`` device when
  the node is created (``node.meta["val"]``), which is what :class:`ShapeProxy` answers from;
* **proxy factory** — the class of each proxy is chosen by the type of its value (plugins may
  give a value type its own ``ShapeProxy`` subclass);
* **root call** — a root ``forward`` hidden behind ``functools.wraps`` decorators or taking
  ``*args``/``**kwargs`` is called with keyword arguments (placeholders only for the example
  inputs), so decorators run as ordinary Python; a ``Mapping`` output of another type (a
  dataclass-like output object) is returned as a plain ``dict``;
* **buffers** used in ``forward`` become ``get_attr`` nodes even when indexed or expanded
  with traced sizes; a module built inside ``forward`` (not a submodule) is traced through;
* **names are data** — torch.fx writes each ``call_module``/``get_attr`` target into its
  generated Python, a part that is not an identifier between double quotes as it is
  (``getattr(self.blocks, "0")``); a traced model with a name that would not read back as
  itself there (a quote, a backslash, a line break: a hostile ``ModuleDict`` key) is refused
  with a :class:`~fxsym.errors.TraceError` before any code is generated.

:func:`trace` wraps it: it loads plugins, fills default example inputs from the
``fxsym_example_inputs`` hook, enters every ``fxsym_trace_context``, concretizes unused
arguments to their defaults, and returns a ``GraphModule`` with a ``trace_report``. It runs
a shadow of the model's module tree (:mod:`.shadow`), so it never writes into the model; the
shadows answer ``hash``, ``==`` and ``id()`` as the user's modules for the model's code
(:mod:`.identity`), and a trace whose model code reaches a user's module itself is refused
(:mod:`.escapes`).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import inspect
import operator
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.fx
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.fx._symbolic_trace import _assert_is_none, _Patcher
from torch.nn.utils import parametrize
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import ModelError, PluginError, TraceError
from ..plugins import calls as plugin_calls
from ..plugins.manager import active_plugins
from ..registry import ValueFn, get_registry
from .configs import config_sizes
from .deferred import DeferredGraphModule
from .escapes import UserModuleReached, reached, reached_from_code, reads_watched
from .guard import (
    TRACE_LOCK,
    ModuleGuard,
    forward_hooked,
    gc_paused,
    tracing_here,
    tracing_thread,
)
from .hooksites import HookSite, node_names
from .identity import identity_kept
from .proxy import ShapeProxy, value_of
from .questions import ATTRIBUTE_META, CONCRETE_META, drop_index_questions
from .report import TraceReport
from .shadow import ShadowTree
from .values import op_value

ExampleInputs = tuple[Any, ...] | dict[str, Any]

_FAILED = object()


def to_meta(value: Any) -> Any:
    """``value`` with every tensor moved to the meta device (parameters become plain tensors)."""
    if isinstance(value, torch.Tensor):
        return _tensor_to_meta(value)
    return pytree.tree_map(_tensor_to_meta, value)


def _tensor_to_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        t = x.detach() if x.requires_grad else x
        return t if t.is_meta else t.to("meta")
    return x


#: what :func:`_tensor_kinds` finds: meta tensors, other tensors, tensors requiring grad, and
#: 0-dim tensors on the CPU not requiring grad (numbers, which torch lets meet meta tensors)
_META, _REAL, _GRAD, _NUMBER = 1, 2, 4, 8
_SCALARS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device})


def _tensor_kinds(value: Any) -> int:
    """The kinds of tensors inside ``value`` (or-ed :data:`_META`, :data:`_REAL`,
    :data:`_GRAD`), walking tuples, lists and dicts directly and anything else that pytree
    opens through pytree. Every tensor pytree reaches is reached, so "no ``_REAL``" means
    :func:`to_meta` would change nothing."""
    kind = type(value)
    if kind in _SCALARS:
        return 0
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            return _GRAD | (_META if value.is_meta else _REAL)
        if value.is_meta:
            return _META
        return _NUMBER if value.dim() == 0 and value.device.type == "cpu" else _REAL
    found = 0
    if isinstance(value, (tuple, list)):
        for item in value:
            found |= _tensor_kinds(item)
    elif isinstance(value, dict):
        for item in value.values():
            found |= _tensor_kinds(item)
    elif not pytree.tree_is_leaf(value):
        for item in pytree.tree_leaves(value):
            found |= _tensor_kinds(item)
    return found


class FxsymTracer(torch.fx.Tracer):
    """A torch.fx Tracer whose leaf, proxy and fallback decisions are hooks."""

    #: buffers become get_attr nodes, so ``self.ids[:, :n]`` follows a traced ``n``
    proxy_buffer_attributes = True

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
    @contextlib.contextmanager
    def _owncall(self) -> Iterator[None]:
        """fxsym's own code handed the user's modules runs in the block (not the model's)."""
        self._own += 1
        try:
            yield
        finally:
            self._own -= 1

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

    # -- sizes read from attributes ----------------------------------------------------------
    @property
    def attribute_values(self) -> dict[str, int | tuple[int, ...]]:
        """The value of each int (or tuple of ints) read as a ``get_attr`` node (an attribute,
        a config field), by target; what such a node's value is computed from."""
        return self._attribute_values

    def reading_sizes(self) -> bool:
        """Whether a size read now is the traced model's own code (not a node's value being
        computed, nor a module run quietly, nor another thread)."""
        return not (self._quiet or self._evaluating) and tracing_here()

    @contextlib.contextmanager
    def _attribute_sizes(self, m: nn.Module, path: str) -> Any:
        """While ``m``'s forward is traced, its int attributes read as graph values.

        Each public attribute holding an ``int`` (not a ``bool``) is replaced in
        ``m.__dict__`` by the proxy of a ``get_attr`` node carrying the int
        (``node.meta[ATTRIBUTE_META]`` is ``(path, name)``); a tuple of ints by a tuple of
        proxies of ``getitem`` nodes on such a node, element ``i`` marked ``(path,
        "name[i]")``. So ``x.reshape(n, self.hidden_dim, -1)`` records where the size came
        from; the analysis ties the attribute to the dim it sizes. Python questions about
        its value are answered (:class:`ShapeProxy`) and recorded on the node. The ints are
        put back when the forward returns or raises; without example inputs nothing is
        replaced. Reads Python makes of the int elsewhere (a leaf module's own forward,
        which is not traced into) are untouched.
        """
        if not self.with_values or id(m) in self._sizing:
            yield
            return
        state = vars(m)
        names = [k for k, v in state.items() if (type(v) is int or (
            type(v) is tuple and _int_tuple(v))) and not k.startswith("_")]
        originals = {name: state[name] for name in names}
        proxies: dict[str, Any] = {}
        entry = _AttributeEntry(self.graph._root.prev, self.module_stack.copy(),
                                (self.scope.module_path, self.scope.module_type))
        self._sizing.add(id(m))
        try:
            for slot, name in enumerate(names):
                target = f"{path}.{name}" if path else name
                value = originals[name]
                self._attribute_values[target] = value
                read = self._attribute_read(entry, (slot, 0), "get_attr", target, (),
                                            (path, name))
                if type(value) is int:
                    proxies[name] = read
                    continue
                # a tuple of ints, read element by element (``normalized_shape``)
                proxies[name] = tuple(
                    self._attribute_read(entry, (slot, i + 1), "call_function",
                                         operator.getitem, (read, i), (path, f"{name}[{i}]"))
                    for i in range(len(value)))
            state.update(proxies)
            yield
        finally:
            self._sizing.discard(id(m))
            for name, proxy in proxies.items():
                if state.get(name) is proxy:  # the forward may rebind it (the guard restores)
                    state[name] = originals[name]

    def _attribute_read(self, entry: _AttributeEntry, key: tuple[int, int], kind: str,
                        target: Any, args: tuple[Any, ...], where: tuple[str, str]
                        ) -> torch.fx.Proxy:
        """The proxy of an int attribute (``kind``, ``target`` and ``args`` of its node), its
        node marked ``node.meta[ATTRIBUTE_META] = where``.

        The node is made when the forward first uses the value: most modules hold ints their
        forward never reads (strides, flags, counts), which then cost no node. It is made as it
        would have been when the forward began (:class:`_AttributeEntry`), so the graph is the
        one an eager read gives, less the unused reads. A plugin giving ints a proxy class of
        its own gets the node at once."""

        def create(proxy: ShapeProxy | None = None) -> torch.fx.Node:
            node_args = tuple(a.node if isinstance(a, torch.fx.Proxy) else a for a in args)
            after = entry.anchor
            for made_key, made in sorted(entry.made.items()):
                if made_key < key and made in self._attribute_nodes:  # (not erased since)
                    after = made
            asked, self.index_questions = self.index_questions, []  # not the model's next node
            try:
                with self.graph.inserting_after(after):
                    node = self.create_node(kind, target, node_args, {})
            finally:
                self.index_questions = asked
            node.meta[ATTRIBUTE_META] = where
            if entry.stack:
                node.meta["nn_module_stack"] = entry.stack.copy()
            else:
                node.meta.pop("nn_module_stack", None)
            self.node_name_to_scope[node.name] = entry.scope
            entry.made[key] = node
            self._attribute_nodes[node] = proxy
            return node

        if self.registry.proxy_class(int) is not None:
            return self.proxy(create())
        owner, name = where
        return ShapeProxy.deferred(self, create, f"{owner}.{name}" if owner else name)

    # -- values ----------------------------------------------------------------------------
    def create_proxy(self, kind: str, target: Any, args: tuple[Any, ...],
                     kwargs: dict[str, Any], name: str | None = None,
                     type_expr: Any | None = None, proxy_factory_fn: Any = None) -> Any:
        """A proxy of the new node; plain ``None`` for a call whose value is ``None`` (a leaf
        returning ``(out, None)``, a mask builder finding no mask). A proxy there would pass
        the model's ``x is not None`` checks, which the value does not, and the branch taken
        would then fail (``None[...]``); ``None`` allows nothing but identity checks, which it
        answers as the model does. The node stays in the graph (the call may write state)."""
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr,
                                     proxy_factory_fn)
        node = getattr(proxy, "node", None)
        if (kind in ("call_function", "call_method", "call_module") and node is not None
                and "val" in node.meta and node.meta["val"] is None):
            return None
        return proxy

    def create_node(
        self,
        kind: str,
        target: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str | None = None,
        type_expr: Any | None = None,
    ) -> torch.fx.Node:
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        drop_index_questions(self.index_questions, node)
        if self.with_values and kind != "output":
            self._evaluating, was = True, self._evaluating
            try:
                value = self._compute(node)
            finally:
                self._evaluating = was
            if value is not _FAILED:
                node.meta["val"] = value
        return node

    def _compute(self, node: torch.fx.Node) -> Any:
        if node.op == "placeholder":
            assert self.placeholder_values is not None
            if node.target in self.placeholder_values:
                return self.placeholder_values[node.target]
            return to_meta(node.args[0]) if node.args else _FAILED
        if node.op == "get_attr":
            if node.target in self._attribute_values:
                return self._attribute_values[str(node.target)]
            obj = self.attribute_object(str(node.target))
            if _tensor_kinds(obj) == _NUMBER:  # a number kept as a tensor (``self.stride[i]``):
                return obj  # its value, which a fill or a scale may need (``new_full``)
            return to_meta(obj)
        try:
            args, kwargs = torch.fx.node.map_aggregate((node.args, node.kwargs), self._arg_value)
        except _UnknownValue:
            return _FAILED
        kinds = _tensor_kinds((args, kwargs))
        if (kinds & (_REAL | _GRAD | _NUMBER) and node.op == "call_module") or (
                kinds & _META and kinds & _REAL):
            # a factory given traced sizes ran for real (``torch.arange(n)``): its value stays
            # real while only real values meet it, and meets meta ones on the meta device
            args, kwargs = to_meta((args, kwargs))
        try:
            return self._evaluate(node, args, kwargs)
        except (ModelError, PluginError):
            raise
        except Exception as exc:
            where = self.scope.module_path or "<root>"
            if node.op == "call_module":
                where = str(node.target)
            if self._needs_data(node, args, kwargs, exc):
                self.report.add("unknown-value", where,
                                f"node {node.name}: {type(exc).__name__}: {exc}")
                return _FAILED
            if (node.op == "call_module" and str(node.target) in self.fallback_leaves
                    and not isinstance(exc, _MODEL_RAISED)):  # it already failed to trace
                self.report.add("unknown-value", where,
                                f"node {node.name}: {type(exc).__name__}: {exc}")
                return _FAILED
            raise ModelError(
                f"the model raised at node {node.name!r} ({where}) on the example inputs: "
                f"{type(exc).__name__}: {exc}. Check that example_inputs have the shapes and "
                "dtypes the model expects."
            ) from exc

    def _evaluate(self, node: torch.fx.Node, args: Any, kwargs: Any) -> Any:
        target = node.target
        if node.op == "call_module":
            return self._run_leaf(node, args, kwargs)
        if node.op not in ("call_function", "call_method"):
            return _FAILED
        value = op_value(node.op, target, args, kwargs)
        if value is not None:
            return value
        with torch.no_grad():
            key = _op_key(node.op, target, args, kwargs)
            if key is not None and key in self._leaf_values:
                return _fresh_copy(self._leaf_values[key], args)
            if node.op == "call_function":
                assert callable(target)
                value = target(*args, **kwargs)
            else:
                assert isinstance(target, str)
                value = getattr(args[0], target)(*args[1:], **kwargs)
            if key is not None:
                recorded = _recorded(value, args)
                if recorded is not None:
                    self._leaf_values[key] = recorded
            return value

    def _needs_data(self, node: torch.fx.Node, args: Any, kwargs: Any, exc: Exception) -> bool:
        """Whether ``exc`` means "the value cannot be known without data" rather than "the
        model raised on these inputs".

        By type: a missing meta kernel or a copy out of a meta tensor (``NotImplementedError``)
        and torch's data-dependent errors (:data:`_VALUE_UNKNOWN`). Anything else is run once
        more under :class:`_DataDependence`, which raises :class:`_NeedsData` at the first op
        whose result depends on a meta tensor's data (``.item()``, ``bool(t)``, ``nonzero``):
        meta kernels report those with a plain ``RuntimeError``, as they do a shape mismatch.
        """
        if _value_unknown_type(exc):
            return True
        try:
            with _DataDependence():  # type: ignore[no-untyped-call]
                self._evaluate(node, args, kwargs)
        except _NeedsData:
            return True
        except Exception:  # the same failure again: the model's own
            return False
        return False

    def _arg_value(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            v = value_of(a)
            if v is _FAILED or "val" not in a.meta:
                raise _UnknownValue
            return v
        if isinstance(a, torch.Tensor):
            return to_meta(a)
        return a

    def _run_leaf(self, node: torch.fx.Node, args: Any, kwargs: Any) -> Any:
        """A leaf's value: what its family's value rule gives, else its input's for a
        shape-preserving family (no need to run it), else the module run on a shallow copy
        whose tensors are on the meta device."""
        mod = self._submodule(str(node.target))
        rule = self._value_rule(mod)
        if rule is not None and not forward_hooked(mod) and "forward" not in vars(mod):
            was, self._quiet = self._quiet, True  # the module's attributes read as they are
            self._own += 1
            try:
                value = rule(self.original(mod), args, kwargs)
            except Exception:
                value = None
            finally:
                self._quiet = was
                self._own -= 1
            if value is not None:
                return value
        if self._shape_preserving(mod) and args and isinstance(args[0], torch.Tensor):
            return args[0]
        key = self._leaf_key(mod, args, kwargs)
        if key is not None and key in self._leaf_values:
            return _fresh_copy(self._leaf_values[key], args)
        clone = self._meta_modules.get(id(mod))
        if clone is None:
            clone = self._meta_modules[id(mod)] = meta_copy(mod)
        with self._quietly(), torch.no_grad():
            value = clone(*args, **kwargs)
        if self.shadows is not None:
            self.shadows.ran_as_leaf(mod, clone)
        if key is not None:
            recorded = _recorded(value, args)
            if recorded is not None:
                self._leaf_values[key] = recorded
        return value

    def _leaf_key(self, mod: nn.Module, args: Any, kwargs: Any) -> Any:
        """What the value of torch.nn leaf ``mod`` on these inputs depends on: its class, its
        plain attributes, its tensors' and its inputs' metadata (``None``: something else may
        matter, run it). Two modules with one key give values of the same metadata."""
        if id(mod) not in self._module_keys:
            self._module_keys[id(mod)] = _module_key(mod)
        module = self._module_keys[id(mod)]
        if module is None:
            return None
        inputs = _plain_key((args, kwargs))
        return None if inputs is None else (module, inputs, _global_key())

    def _submodule(self, path: str) -> nn.Module:
        """The submodule at ``path``: the one :meth:`path_of_module` named so, looked up in a
        table rather than through the attribute reads torch.fx patches while it traces."""
        if self._modules_by_path is None:
            self._modules_by_path = {p: m for m, p in (self.submodule_paths or {}).items()}
        found = self._modules_by_path.get(path)
        if found is not None:
            return found
        with self._quietly():
            return self.root.get_submodule(path)

    def _value_rule(self, mod: nn.Module) -> ValueFn | None:
        """The value rule of ``mod``'s family (``register(..., value=rule)``)."""
        try:
            return self._value_rules[id(mod)]
        except KeyError:
            pass
        entry = self.registry.sym_info_entry(type(mod))
        rule = self._value_rules[id(mod)] = entry.value if entry is not None else None
        return rule

    def _shape_preserving(self, mod: nn.Module) -> bool:
        known = self._preserving.get(id(mod))
        if known is None:
            entry = self.registry.sym_info_entry(type(mod))
            with self._owncall():
                known = bool(entry is not None
                             and entry.factory(self.original(mod)).is_shape_preserving)
            self._preserving[id(mod)] = known
        return known

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


#: operators whose result on tensors is a new tensor computed from their metadata alone
_PURE_OPERATORS = frozenset({operator.add, operator.sub, operator.mul, operator.truediv,
                             operator.matmul, operator.neg})
#: modules of torch's own functions (``torch.relu``, ``F.adaptive_avg_pool2d``, ...)
_TORCH_MODULES = frozenset({"torch", "torch.nn.functional", "torch._C._nn",
                            "torch._C._VariableFunctions", "torch.functional"})


def _op_key(op: str, target: Any, args: Any, kwargs: Any) -> Any:
    """What the value of a torch function or ``Tensor`` method on meta tensors depends on,
    like :meth:`FxsymTracer._leaf_key`; ``None`` for anything else (in-place ops, other
    functions, no meta tensor among the arguments)."""
    if op == "call_method":
        if (not isinstance(target, str) or target.endswith("_") or not args
                or type(args[0]) is not torch.Tensor or not args[0].is_meta):
            return None
    elif target not in _PURE_OPERATORS:
        name = getattr(target, "__name__", "")
        if (getattr(target, "__module__", None) not in _TORCH_MODULES or name.endswith("_")
                or name.startswith("_")):
            return None
        if not _tensor_kinds((args, kwargs)) & _META:
            return None
    inputs = _plain_key((args, kwargs))
    return None if inputs is None else (op, target, inputs, _global_key())


#: hook tables and the like: a module holding anything in them is not keyed
_TABLES = frozenset({"_parameters", "_buffers", "_modules"})


def _module_key(mod: nn.Module) -> Any:
    """A key that determines the metadata of what ``mod``'s forward returns on given inputs,
    or ``None``. Only modules of torch.nn itself (their forward reads nothing but their
    attributes, tensors and submodules), whose attributes are all plain values (ints,
    floats, strings, tuples and lists of them, ...) and whose hook tables are empty."""
    cls = type(mod)
    if not cls.__module__.startswith("torch.nn."):
        return None
    parts: list[Any] = [cls]
    for name, value in vars(mod).items():
        if name in _TABLES:
            continue
        if type(value) in _HOOK_TABLES:
            if value:
                return None
            continue
        plain = _plain_key(value)
        if plain is None:
            return None
        parts.append((name, plain))
    for name, tensor in (*mod._parameters.items(), *mod._buffers.items()):
        parts.append((name, None if tensor is None else _tensor_key(tensor)))
    for name, child in mod._modules.items():
        sub = None if child is None else _module_key(child)
        if child is not None and sub is None:
            return None
        parts.append((name, sub))
    return tuple(parts)


#: the types of a module's hook tables (``OrderedDict``) and its set of non-persistent
#: buffer names
_HOOK_TABLES = frozenset({OrderedDict, set, dict})


def _tensor_key(t: torch.Tensor) -> Any:
    return (type(t), tuple(t.shape), t.stride(), t.dtype, t.device, t.storage_offset(),
            t.requires_grad)


_SEQUENCES = frozenset({tuple, list, torch.Size, torch.fx.immutable_collections.immutable_list})
_MAPPINGS = frozenset({dict, torch.fx.immutable_collections.immutable_dict})


def _plain_key(value: Any) -> Any:
    """A hashable key equal for equal plain values (with their types, so ``2`` and ``2.0``
    differ), tensors by metadata; ``None`` if ``value`` holds anything else."""
    kind = type(value)
    if kind in _SCALARS:
        return (kind, value)
    if isinstance(value, torch.Tensor):
        return _tensor_key(value)
    if kind in _SEQUENCES:
        items = [_plain_key(v) for v in value]
        return None if any(i is None for i in items) else (kind, tuple(items))
    if kind in _MAPPINGS:
        pairs = [(k, _plain_key(v)) for k, v in value.items()]
        if any(type(k) is not str or v is None for k, v in pairs):
            return None
        return (kind, tuple(pairs))
    return None


def _global_key() -> Any:
    """The process state a torch.nn forward may read: default dtype, grad and autocast."""
    return (torch.get_default_dtype(), torch.is_grad_enabled(),
            torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))


def _recorded(value: Any, args: tuple[Any, ...]) -> Any:
    """How to give ``value`` again for other inputs with the same key: its tensors as
    ``(shape, stride, dtype)``, a view of a tensor made inside the module as that tensor and
    the view's geometry, an input given back as its position; ``None`` if it holds anything
    else (a view of an input, a tensor not of plain type)."""
    if isinstance(value, torch.Tensor):
        for i, a in enumerate(args):
            if value is a:
                return ("arg", i)
        if type(value) is not torch.Tensor or not value.is_meta or value.requires_grad:
            return None
        base = value._base
        if base is None:
            if value.storage_offset() != 0:
                return None
            return ("tensor", tuple(value.shape), value.stride(), value.dtype)
        if any(base is a or base is getattr(a, "_base", None) for a in args):
            return None  # a view of an input
        whole = _recorded(base, ())
        if whole is None or whole[0] != "tensor":
            return None
        return ("view", whole, tuple(value.shape), value.stride(), value.storage_offset())
    if type(value) is tuple:
        items = [_recorded(v, args) for v in value]
        return None if any(i is None for i in items) else ("tuple", tuple(items))
    if value is None:
        return ("none",)
    return None


def _fresh_copy(recorded: Any, args: tuple[Any, ...]) -> Any:
    """A value like the one :func:`_recorded` described, sharing no tensor with it."""
    kind = recorded[0]
    if kind == "tensor":
        return torch.empty_strided(recorded[1], recorded[2], dtype=recorded[3], device="meta")
    if kind == "view":  # of a tensor made inside the module, as a fresh one
        return _fresh_copy(recorded[1], args).as_strided(recorded[2], recorded[3], recorded[4])
    if kind == "arg":
        return args[recorded[1]]
    if kind == "tuple":
        return tuple(_fresh_copy(r, args) for r in recorded[1])
    return None


class _AttributeEntry:
    """Where the int attributes of a module read as sizes belong, for one call of its forward:
    after ``anchor`` (the newest node when the forward began), in the order of the module's
    attributes (an element of a tuple after the tuple), with the call's module ``stack`` and
    ``scope`` (path and type); ``made``: the nodes made so far, by place in that order."""

    __slots__ = ("anchor", "made", "scope", "stack")

    def __init__(self, anchor: torch.fx.Node, stack: OrderedDict[str, Any],
                 scope: tuple[str, Any]) -> None:
        self.anchor = anchor
        self.stack = stack
        self.scope = scope
        self.made: dict[tuple[int, int], torch.fx.Node] = {}


class _UnknownValue(Exception):
    pass


class _NeedsData(Exception):
    """An op asked for the data of a meta tensor."""


# torch leaves TorchDispatchMode.__init_subclass__ and __init__ untyped
class _DataDependence(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Raise :class:`_NeedsData` at an op whose output depends on a meta tensor's data."""

    _TAGS = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if any(tag in func.tags for tag in self._TAGS) and any(
            isinstance(a, torch.Tensor) and a.is_meta for a in pytree.tree_leaves((args, kwargs))
        ):
            raise _NeedsData(str(func))
        return func(*args, **kwargs)


#: errors a model raises to reject its inputs: with example inputs given, the model raised
_MODEL_RAISED = (ValueError, AssertionError)

#: errors that mean "the value is unknown" (not "the model raised"): no meta kernel, no data
#: to copy out of a meta tensor, torch's data-dependent errors
_VALUE_UNKNOWN: tuple[type[Exception], ...] = (
    NotImplementedError,
    DataDependentOutputException,
    DynamicOutputShapeException,
    _NeedsData,
)


def _value_unknown_type(exc: Exception) -> bool:
    """``exc`` is one of :data:`_VALUE_UNKNOWN`, or torch's ``GuardOnDataDependentSymNode``
    (looked up only if its module is loaded: importing it costs most of a second)."""
    if isinstance(exc, _VALUE_UNKNOWN):
        return True
    shapes = sys.modules.get("torch.fx.experimental.symbolic_shapes")
    guard = getattr(shapes, "GuardOnDataDependentSymNode", None)
    return guard is not None and isinstance(exc, guard)


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


def _int_tuple(value: Any) -> bool:
    """A short tuple of ints (``self.normalized_shape = (hidden,)``): read as sizes."""
    return type(value) is tuple and 0 < len(value) <= 8 and all(type(v) is int for v in value)


def _needs_keyword_call(fn: Callable[..., Any]) -> bool:
    """torch.fx patches the code of the outer function but reads the signature of the inner
    one: a decorated ``forward``, or one with ``*args``/``**kwargs``, is called by keyword."""
    if inspect.unwrap(fn) is not fn:
        return True
    kinds = {p.kind for p in inspect.signature(fn).parameters.values()}
    return bool(kinds & {inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL})


#: factories torch's argument parser refuses traced sizes in (``*size``, ``torch.tensor(n)``)
_FACTORIES = ("ones", "zeros", "empty", "rand", "randn", "tensor", "as_tensor")


@contextlib.contextmanager
def _traced_factories() -> Any:
    """While this thread traces, ``torch.ones(b, s)`` or ``torch.tensor(n)`` with traced sizes
    records a node instead of failing.

    The replacements are installed with torch.fx's own patcher (undone on exit, not stacked
    by a nested trace) and hand every call from a thread that is not tracing, or without a
    Proxy among its arguments, to the original function.
    """
    with _Patcher() as patcher:
        for name in _FACTORIES:
            patcher.patch(vars(torch), name, _traced_factory(getattr(torch, name)))
        yield


def _traced_factory(fn: Callable[..., Any]) -> Callable[..., Any]:
    def factory(*args: Any, **kwargs: Any) -> Any:
        if tracing_here():
            proxy = _find_proxy((args, kwargs))
            if proxy is not None:
                return proxy.tracer.create_proxy("call_function", fn, args, kwargs)
        return fn(*args, **kwargs)

    return functools.wraps(fn)(factory)


def _find_proxy(value: Any) -> torch.fx.Proxy | None:
    """The first Proxy inside nested tuples, lists and dicts (sizes may come as a list)."""
    return next((a for a in pytree.tree_leaves(value) if isinstance(a, torch.fx.Proxy)), None)


def _plain_output(out: Any) -> Any:
    """A Mapping output of another type (an output dataclass) as a plain dict."""
    if isinstance(out, Mapping) and type(out) is not dict:
        return {k: v for k, v in out.items() if v is not None}
    return out


#: containers whose ``copy()`` is ``copy.copy`` (without its ``__reduce_ex__`` detour)
_PLAIN_CONTAINERS = frozenset({dict, list, set, OrderedDict})


def meta_copy(mod: nn.Module) -> nn.Module:
    """A copy of ``mod`` and its submodules whose parameters and buffers are meta tensors
    (parameters stay ``Parameter``s) and whose attribute containers are copies: running it, or
    a resize rule on it, leaves ``mod`` as it was. Not ``copy.copy``: parametrized modules
    refuse it."""
    clone = object.__new__(type(mod))
    state = vars(clone)
    for key, value in vars(mod).items():
        if type(value) in _PLAIN_CONTAINERS:
            value = value.copy()
        elif isinstance(value, (list, dict, set)):
            value = copy.copy(value)
        state[key] = value
    state["_parameters"] = {
        k: None if v is None else nn.Parameter(to_meta(v), requires_grad=False)
        for k, v in mod._parameters.items()}
    state["_buffers"] = {k: None if v is None else to_meta(v) for k, v in mod._buffers.items()}
    state["_modules"] = {k: None if v is None else meta_copy(v) for k, v in mod._modules.items()}
    return clone


def normalize_example_inputs(example_inputs: Any) -> ExampleInputs | None:
    if example_inputs is None:
        return None
    if isinstance(example_inputs, dict):
        return dict(example_inputs)
    if isinstance(example_inputs, list):
        return tuple(example_inputs)
    if isinstance(example_inputs, tuple):
        return example_inputs
    return (example_inputs,)


def resolve_example_inputs(model: nn.Module, example_inputs: Any) -> ExampleInputs | None:
    """The given example inputs, or a plugin's defaults for the model's family."""
    if example_inputs is None:
        example_inputs = plugin_calls.example_inputs(model)
    return normalize_example_inputs(example_inputs)


def _bind(
    model: nn.Module, example_inputs: ExampleInputs | None, concrete_args: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, dict[str, Any], set[str]]:
    """Placeholder values by name, the concrete args to trace with, and the auto-concretized."""
    sig = inspect.signature(model.forward)  # follows decorators; a bound method has no self
    params = sig.parameters
    concrete = dict(concrete_args or {})
    values: dict[str, Any] | None = None
    given: set[str] = set(concrete)
    if example_inputs is not None:
        try:
            if isinstance(example_inputs, dict):
                bound = sig.bind_partial(**example_inputs)
            else:
                bound = sig.bind_partial(*example_inputs)
        except TypeError as exc:
            raise TraceError(
                f"example_inputs do not match {type(model).__name__}.forward{sig}: {exc}"
            ) from exc
        values = {}
        for name, val in bound.arguments.items():
            kind = params[name].kind
            if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise TraceError(
                    f"example input {name!r} lands in *args/**kwargs of "
                    f"{type(model).__name__}.forward; pass it by a named parameter"
                )
            if isinstance(val, torch.Tensor):
                values[name] = to_meta(val)
            else:
                concrete[name] = val
            given.add(name)
    auto: set[str] = set()
    for name, p in params.items():
        if name in given:
            continue
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            concrete["**" + name] = {}
        elif p.kind is inspect.Parameter.VAR_POSITIONAL:
            concrete["*" + name] = ()
        elif example_inputs is not None and p.default is not inspect.Parameter.empty:
            concrete[name] = p.default
            auto.add(name)
    return values, concrete, auto


def trace(
    model: nn.Module,
    *,
    example_inputs: Any = None,
    concrete_args: dict[str, Any] | None = None,
) -> torch.fx.GraphModule:
    """Trace ``model`` into a ``GraphModule`` carrying a ``trace_report``.

    ``example_inputs`` is a tuple of positional arguments, a dict of keyword arguments, or a
    single tensor. With them every node carries its meta value and shape questions resolve at
    trace time; parameters not given are fixed to their defaults. Without them (and without
    plugin defaults) tracing is plain torch.fx with robust leaf fallback.

    The model is never written: a shadow of its module tree is traced (``shadow.py``), with
    :class:`ModuleGuard` as the safety net; its hooks do not run, and traces are serialised
    by :data:`TRACE_LOCK` (see ``guard.py``). ``gm.derived_state`` holds the derived state the
    trace found (:meth:`~fxsym.tracer.shadow.ShadowTree.derived_state`), ``gm.derived_writes``
    the nodes of the values the forward set attributes to (:meth:`~.ShadowTree.written`).
    """
    with _guarded(model):
        return _trace(model, example_inputs, concrete_args, torch.fx.GraphModule)


def trace_deferred(
    model: nn.Module,
    *,
    example_inputs: Any = None,
    concrete_args: dict[str, Any] | None = None,
) -> DeferredGraphModule:
    """:func:`trace`, returning a :class:`DeferredGraphModule` (its Python code generated on
    first use) for callers that only read the graph and the module tree."""
    with _guarded(model):
        gm = _trace(model, example_inputs, concrete_args, DeferredGraphModule)
    assert isinstance(gm, DeferredGraphModule)
    return gm


@contextlib.contextmanager
def _guarded(model: nn.Module) -> Iterator[None]:
    """What surrounds every trace: one at a time (:data:`TRACE_LOCK`), the collector paused,
    this thread marked as tracing, and ``model`` put back as it was (:class:`ModuleGuard`)."""
    if not isinstance(model, nn.Module):
        raise TraceError(f"expected a torch.nn.Module, got {type(model).__name__}")
    with TRACE_LOCK, gc_paused(), tracing_thread(), ModuleGuard(model):
        yield


def _trace(
    model: nn.Module, example_inputs: Any, concrete_args: dict[str, Any] | None,
    graph_module_cls: type[torch.fx.GraphModule],
) -> torch.fx.GraphModule:
    """Trace a shadow of ``model`` (:class:`~fxsym.tracer.shadow.ShadowTree`) with its dicts
    of derived tensors given empty; if that fails, or a module fell back to a leaf, while such
    a dict stayed empty, the forward may need it: trace again with it as it is."""
    pm = active_plugins()
    vote = functools.partial(plugin_calls.hook_computes, pm=pm)
    derives = functools.partial(plugin_calls.derived_tensors, pm=pm)
    inputs = resolve_example_inputs(model, example_inputs)
    values, concrete, auto = _bind(model, inputs, concrete_args)
    shadows = ShadowTree(model, vote=vote, derives=derives)
    try:
        gm = _trace_tree(model, shadows, inputs, values, concrete, auto, graph_module_cls)
    except Exception:
        if not shadows.unfilled():
            raise
        gm = None
    if gm is None or (shadows.unfilled() and any(
            e.kind == "leaf-fallback" for e in gm.trace_report.entries)):  # type: ignore[union-attr]
        shadows = ShadowTree(model, empty_derived=False, vote=vote, derives=derives)
        gm = _trace_tree(model, shadows, inputs, values, concrete, auto, graph_module_cls)
    written = shadows.written()
    gm.derived_state = shadows.derived_state(written)  # type: ignore[assignment]
    gm.derived_writes = written  # type: ignore[assignment]
    return gm


def _trace_tree(
    model: nn.Module, shadows: ShadowTree, inputs: ExampleInputs | None,
    values: dict[str, Any] | None, concrete: dict[str, Any], auto: set[str],
    graph_module_cls: type[torch.fx.GraphModule],
) -> torch.fx.GraphModule:
    """One trace of the shadow tree; the GraphModule holds the user's modules."""
    report = TraceReport()
    for name, hooks in shadows.hidden_hooks.items():
        for kind, line in hooks:
            report.add(kind, name or type(model).__name__, line)
    tracer = FxsymTracer(values, report, defaults=auto)
    tracer.shadows = shadows
    with shadows.live(), identity_kept(shadows), plugin_calls.trace_contexts(shadows.root, inputs):
        shadows.rehash()
        try:
            graph = tracer.trace(shadows.root, concrete_args=concrete or None)
        except (TraceError, PluginError):
            raise
        except _MODEL_RAISED as exc:
            if inputs is None:
                raise _trace_error(model, exc, inputs) from exc
            raise ModelError(
                f"{type(model).__name__} raised on the example inputs: "
                f"{type(exc).__name__}: {exc}. Check that example_inputs have the shapes "
                "and dtypes the model expects."
            ) from exc
        except Exception as exc:
            if tracer.escaped is not None:  # the model's code caught it and went on
                raise tracer.escaped from exc
            raise _trace_error(model, exc, inputs) from exc
        if tracer.escaped is not None:
            raise tracer.escaped
        _check_code_names(graph)
        _drop_concretization_checks(graph, auto)  # before the GraphModule compiles its code
        gm = _graph_module(graph_module_cls, graph, type(model).__name__, shadows)
    tracer.release()
    gm.trace_report = report  # type: ignore[assignment]
    gm.hook_sites = tracer.hook_sites  # type: ignore[assignment]
    gm.example_inputs = inputs  # type: ignore[assignment]
    return gm


def _graph_module(cls: type[torch.fx.GraphModule], graph: torch.fx.Graph, class_name: str,
                  shadows: ShadowTree) -> torch.fx.GraphModule:
    """What ``cls(shadows.root, graph, class_name)`` builds, holding the user's module at each
    ``call_module`` target (see :func:`_held`), built with plain dict operations: torch.fx
    copies each target by walking both trees with ``getattr`` and ``setattr``, whose lookups of
    missing names raise inside ``nn.Module.__getattr__`` and whose ``isinstance`` checks go
    through ``Parameter``'s metaclass (about a tenth of a CNN's trace).

    As torch.fx does, targets are installed in the order the graph first names them, each
    under plain ``nn.Module`` intermediates, a target inside one installed already is not
    installed again (an intermediate is replaced where a target names it), and a tensor that
    is not a parameter is a buffer, persistent as it was where it came from. A module called
    inside a target installed already (a shadow the GraphModule holds) is put there too."""
    shell = torch.fx.Graph(tracer_cls=graph._tracer_cls, tracer_extras=graph._tracer_extras)
    gm = cls({}, shell, class_name)
    gm.training = shadows.root.training
    built: dict[str, nn.Module] = {"": gm}  # the intermediates, and the root
    installed: set[str] = set()
    for target, (value, owner) in _held(graph, shadows).items():
        parent_path, _, field = target.rpartition(".")
        if _inside(parent_path, installed):
            parent = gm.get_submodule(parent_path)
            held = parent._modules.get(field)
            if isinstance(value, nn.Module) and held is not value and shadows.original(
                    held) is value:
                parent._modules[field] = value  # a module called there: the user's
            continue
        to_module = _intermediate(built, parent_path)
        if type(value) is not nn.Parameter and isinstance(value, torch.Tensor) and (
                not isinstance(value, nn.Parameter)):
            to_module.register_buffer(
                field, value, persistent=field not in owner._non_persistent_buffers_set)
        elif _free_name(to_module, field) and isinstance(value, nn.Module):
            to_module._modules[field] = value  # what setattr does for a name not held
        elif _free_name(to_module, field) and type(value) is nn.Parameter:
            to_module._parameters[field] = value
        else:
            setattr(to_module, field, value)
        built.pop(target, None)  # an intermediate replaced: nothing more goes into it
        installed.add(target)
    gm.graph = graph
    return gm


def _held(graph: torch.fx.Graph, shadows: ShadowTree) -> dict[str, tuple[Any, nn.Module]]:
    """By ``call_module``/``get_attr`` target, in the order the graph first names them: the
    object the GraphModule holds there and the module of the traced tree it is read from.
    That object is the one at that path of the traced (shadow) tree, but for a
    ``call_module`` target, which is the user's module (decisions by identity, a resize and
    the user see the user's modules; a shadow lives for one trace), and for an attribute the
    forward rebound to a traced value (Swin's ``self.window_size = ...``), which is the
    user's value, the one the trace read."""
    found = dict(shadows.paths)
    held: dict[str, tuple[Any, nn.Module]] = {}
    calls: set[str] = set()
    for node in graph.nodes:
        op = node.op
        if op == "call_module" or op == "get_attr":
            target = str(node.target)
            if op == "call_module":
                calls.add(target)
            if target not in held:
                parent_path, _, field = target.rpartition(".")
                owner = _attribute_at(found, parent_path)
                value = found.get(target)
                if value is None:
                    value = getattr(owner, field)
                    if isinstance(value, torch.fx.Proxy):  # a size the forward rebound
                        value = getattr(shadows.original(owner), field)
                held[target] = (value, owner)
    for target in calls:
        value, owner = held[target]
        held[target] = (shadows.original(value), owner)
    return held


def _attribute_at(found: dict[str, Any], path: str) -> Any:
    """The object at ``path`` below ``found[""]``, remembered in ``found`` with the objects
    on the way."""
    obj = found.get(path)
    if obj is None:
        parent_path, _, name = path.rpartition(".")
        obj = found[path] = getattr(_attribute_at(found, parent_path), name)
    return obj


def _free_name(mod: nn.Module, name: str) -> bool:
    """Whether ``mod`` holds nothing named ``name`` (``setattr`` then only adds it)."""
    return not (name in vars(mod) or name in mod._modules or name in mod._parameters
                or name in mod._buffers or hasattr(type(mod), name))


def _inside(path: str, installed: set[str]) -> bool:
    """Whether ``path`` or a path above it is in ``installed``."""
    while path:
        if path in installed:
            return True
        path = path.rpartition(".")[0]
    return False


def _intermediate(built: dict[str, nn.Module], path: str) -> nn.Module:
    """The module at ``path`` of the GraphModule ``built[""]`` being built, a plain
    ``nn.Module`` created (with its parents) where none is yet."""
    mod = built.get(path)
    if mod is None:
        parent_path, _, name = path.rpartition(".")
        parent = _intermediate(built, parent_path)
        mod = built[path] = nn.Module()
        if _free_name(parent, name):
            parent._modules[name] = mod
        else:
            setattr(parent, name, mod)
    return mod


def _trace_error(model: nn.Module, exc: Exception, inputs: Any) -> TraceError:
    """A trace that cannot proceed; example inputs are suggested only when none were given."""
    hint = ("Pass example_inputs so that shape-dependent code resolves, or make "
            "the failing module a leaf" if inputs is None else "Make the failing module a leaf")
    return TraceError(f"tracing {type(model).__name__} failed: {type(exc).__name__}: {exc}. "
                      f"{hint} (a leaf policy or SymMap.register).")


def _check_code_names(graph: torch.fx.Graph) -> None:
    """Refuse a graph with a target that torch.fx's generated code would not name verbatim
    (see the module docstring): generating it would raise ``SyntaxError`` at best and run the
    text of the name at worst."""
    for node in graph.nodes:
        if node.op not in ("call_module", "get_attr", "call_method"):
            continue
        for part in str(node.target).split("."):
            if part.isidentifier() or _reads_back(part):
                continue
            raise TraceError(
                f"the name {part!r} (in {str(node.target)!r}) holds a quote, a backslash or a "
                "control character, which torch.fx would write into its generated Python code "
                "as it is; rename that submodule or attribute (a ModuleDict key, say)")


@functools.lru_cache(maxsize=4096)
def _reads_back(part: str) -> bool:
    """Whether ``"part"`` is a Python string literal whose value is ``part`` (parsed, never
    run: ``ast.literal_eval`` refuses anything but a literal). Remembered: the same names
    (``0``, ``1``, ... of every ``Sequential``) come back in every trace."""
    try:
        return bool(ast.literal_eval(f'"{part}"') == part)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def _drop_concretization_checks(graph: torch.fx.Graph, auto: set[str]) -> None:
    """Remove the placeholders and asserts torch.fx adds for arguments fixed to defaults,
    and the shape questions answered at trace time that nothing in the graph uses."""
    auto_prefixes = tuple(f"{a}_" for a in auto)
    checks = {torch._assert, _assert_is_none}
    answered = {operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge,
                operator.not_, operator.getitem, getattr, operator.is_, operator.is_not,
                operator.and_, operator.or_, operator.add, operator.sub, operator.mul,
                operator.floordiv, operator.mod, len}
    for node in reversed(list(graph.nodes)):
        if node.users:
            continue
        if node.op == "call_function" and node.target in checks:
            graph.erase_node(node)
        elif node.op == "call_function" and node.target in answered and _not_tensor(node):
            graph.erase_node(node)
        elif node.op == "call_method" and node.target in ("size", "dim", "numel") and _not_tensor(
                node):
            graph.erase_node(node)
        elif node.op == "placeholder" and str(node.target).startswith(auto_prefixes):
            graph.erase_node(node)
    graph.lint()


def _not_tensor(node: torch.fx.Node) -> bool:
    return not isinstance(node.meta.get("val"), torch.Tensor)
