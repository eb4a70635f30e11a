"""The module tree a trace runs: a shadow of the user's, so the user's is never written.

Tracing runs a model's Python code, and the tracer itself puts graph values where the code
reads sizes (int attributes, config fields). Done on the user's modules, every such write is
visible to another thread running the model meanwhile, even if it is undone afterwards. So
:func:`shadow_tree` builds, for one trace, a *shadow* of every module of the tree: an object of
the module's own class whose ``__dict__`` is a copy of the module's, with

* the same parameters and buffers (the tensor objects are shared, so parameter identity, the
  qualified names and what ``get_attr`` nodes read are those of the model);
* child modules replaced by their shadows wherever the tree holds them (``_modules``, other
  attributes, containers; a module shared by two parents has one shadow);
* every dict, list and set copied, recursively (a ``self.cache[key] = ...`` fills the copy);
  a dict keyed by modules and a set of modules hold their shadows (inserted again once the
  tree is live, :meth:`ShadowTree.rehash`, when shadows hash as the user's modules:
  :mod:`.identity`);
* each ``config`` object (:data:`~fxsym.tracer.configs.CONFIG_ATTRIBUTES`) copied, with the
  configs of its own family it holds, so a trace context overriding a field (``use_cache``)
  overrides it in the copy; modules sharing a config share its copy. A config
  ``object.__new__`` cannot build (a dict subclass) is copied with ``copy.copy``; one that
  cannot be copied is refused (:class:`~fxsym.errors.TraceError`), never shared;
* methods, ``functools.partial`` objects (function, arguments and keywords), functions
  closing over (or defaulting to) a module of the tree, and weak references to one, pointing
  to its shadow instead (a ``forward`` set on the instance, as accelerate's hooks do; a
  lambda kept in a dict that calls a child). A module reached any other way is the user's:
  :mod:`.escapes` refuses a trace whose model code reaches one;
* the hook tables holding only hooks that are part of the computation, as plugins declare
  them (:mod:`fxsym.plugins.hookroles`): those that compute (``fxsym_hook_computes``;
  transformers' capturing hooks carry hidden states to heads) and those that derive tensors
  of their module (``fxsym_derived_tensors``; ``weight_norm``'s pre-hook computes the weight
  the module uses). The other hooks do not run while a model is traced; those nobody
  declared harmless are listed (:attr:`ShadowTree.hidden_hooks`, for the trace report) and
  the shadows holding them noted (:attr:`ShadowTree.unseen`): the trace does not see their
  effect, so the analysis pins what they could change.

The tree answers which original a shadow stands for (:meth:`ShadowTree.original`; during
the trace also :func:`original_module`), what a plugin deciding by identity (a leaf policy,
a trace context's record) and the traced GraphModule (which holds the user's modules) need.

**Derived state.** A dict attribute holding tensors that are neither a parameter nor a buffer
of the tree (``attention_bias_cache`` after an eval forward) holds state derived from the
model. In the shadow it is given *empty*; if the traced forward fills it again (or, for a
leaf, its forward run for the leaf's value), the forward recomputes it when missing: it is a
*cache*, and a resize may clear it. A dict the forward fills from empty is a cache too. A
tensor-holding dict the forward does not refill, or an attribute the forward sets to a traced
value (however deeply inside lists, tuples, dicts and sets), is *derived* state that is not
proven recomputable. :meth:`ShadowTree.derived_state`
reports both by qualified name; a resize reads it (:mod:`fxsym.resizing.engine`).
:meth:`ShadowTree.written` names the graph nodes of the values the forward set attributes to,
so that the analysis can tell derived state no resize changes (:mod:`fxsym.analysis.derived`).

Imports from fxsym: errors, modstate, plugins.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import functools
import operator
import threading
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

from ..errors import TraceError
from ..modstate import CACHE, DERIVED
from ..plugins.hookroles import DerivedTensors, describe_hook
from .configs import CONFIG_ATTRIBUTES
from .proxy import ShapeProxy

_FORWARD_HOOKS = ("_forward_hooks", "_forward_pre_hooks")
_BACKWARD_HOOKS = ("_backward_hooks", "_backward_pre_hooks")
#: what a module's ``__dict__`` holds that torch itself manages
_TORCH_TABLES = frozenset({
    "_parameters", "_buffers", "_modules", "_non_persistent_buffers_set",
    "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
    "_backward_pre_hooks", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks"})
#: the tables copied as they are (the forward may fill them; the user's stay as they are)
_COPIED_TABLES = _TORCH_TABLES - {"_modules", *_FORWARD_HOOKS, *_BACKWARD_HOOKS}
_ATOMS = frozenset({bool, int, float, str, type(None), torch.Tensor, nn.Parameter,
                    torch.dtype, torch.device})
_PLAIN = frozenset({dict, OrderedDict, list, set})


#: ``vote(module, hook)``: whether a forward hook of the user's ``module`` is part of how the
#: model computes (``True``), changes no value (``False``), or ``None`` (nobody says)
HookVote = Callable[[nn.Module, Any], "bool | None"]
#: ``derives(module, hook)``: what a forward pre-hook computes from the module's tensors
#: (:class:`~fxsym.plugins.hookroles.DerivedTensors`), or ``None``
DerivedVote = Callable[[nn.Module, Any], "DerivedTensors | None"]
_KINDS = {"_forward_pre_hooks": "forward pre-hook", "_forward_hooks": "forward hook"}


class ShadowTree:
    """The shadows of every module of ``root``'s tree (see the module docstring)."""

    def __init__(self, root: nn.Module, *, empty_derived: bool = True,
                 vote: HookVote | None = None, derives: DerivedVote | None = None) -> None:
        self._empty_derived = empty_derived
        self._vote = vote
        self._derives = derives
        #: by qualified name, the forward hooks the shadows leave out that nobody declared
        #: harmless, and the derived tensors no resize can keep entries of: ``(kind, report
        #: line)``
        self.hidden_hooks: dict[str, list[tuple[str, str]]] = {}
        #: ids of the shadows holding forward hooks a plugin declares part of the computation
        #: (``fxsym_hook_computes``), which run only if the module is traced into
        self.hooked: set[int] = set()
        #: by id of a shadow, why the groups of its calls and sizes are pinned: the hooks
        #: whose effect the trace does not see (:mod:`fxsym.plugins.hookroles`)
        self.unseen: dict[int, list[str]] = {}
        #: why every module call is pinned: process-wide hooks (``register_module_forward_hook``)
        #: nobody declared harmless, which do not run in the graph of a leaf
        self.global_unseen: list[str] = self._global_hooks()
        self._shadows: dict[int, nn.Module] = {}
        #: the user's object behind each shadow and each config copy, by id
        self._originals: dict[int, Any] = {}
        #: the user's module behind each shadow, by the shadow's id
        self._users: dict[int, nn.Module] = {}
        #: the copied dicts and sets holding shadows as keys (:meth:`rehash`)
        self._keyed: list[dict[Any, Any] | set[Any]] = []
        self._copies: dict[int, Any] = {}
        #: registered tensors of the tree, by id: tensors that are not derived state
        self._registered: set[int] = set()
        #: (shadow, attribute, whether it held derived tensors, whether it was given empty)
        self._watched: list[tuple[nn.Module, str, bool, bool]] = []
        #: (id of a shadow, attribute) given empty that a run of the leaf's copy filled
        self._filled: set[tuple[int, str]] = set()
        self._names: dict[int, str] = {}
        #: each shadow by the qualified name of its module (the first, for a module held
        #: under several)
        self.paths: dict[str, nn.Module] = {}
        #: each shadow's keys and values as filled, and its attributes holding copies (what
        #: :meth:`written` needs to look into when the forward rebound none)
        self._as_filled: dict[int, tuple[tuple[str, ...], tuple[Any, ...], list[str]]] = {}
        order: list[nn.Module] = []
        self._make(root, "", order)
        for mod in order:
            self._registered.update(map(id, mod._parameters.values()))
            self._registered.update(map(id, mod._buffers.values()))
        for mod in order:
            self._fill(mod)
        self.root = self._shadows[id(root)]

    def _make(self, mod: nn.Module, name: str, order: list[nn.Module]) -> None:
        if id(mod) in self._shadows:
            return
        shadow = object.__new__(type(mod))
        self._shadows[id(mod)] = shadow
        self._originals[id(shadow)] = mod
        self._users[id(shadow)] = mod
        self._names[id(mod)] = name
        self.paths[name] = shadow
        order.append(mod)
        for key, child in mod._modules.items():
            if child is not None:
                self._make(child, f"{name}.{key}" if name else key, order)

    def _fill(self, mod: nn.Module) -> None:
        shadow = self._shadows[id(mod)]
        source = vars(mod)
        state = vars(shadow)
        state.update(source)  # atoms and shared objects as they are; the rest replaced below
        copied: list[str] = []
        for key, value in source.items():
            kind = type(value)
            if kind in _ATOMS or key in _TORCH_TABLES or (
                    kind is tuple and all(map(_ATOMS.__contains__, map(type, value)))):
                continue
            if key in CONFIG_ATTRIBUTES and _is_object(value):
                new = self._config(mod, value, type(value).__mro__[-2])
            elif isinstance(value, dict) and not isinstance(value, nn.Module):
                new = self._dict_attribute(shadow, key, value)
            else:
                new = self._copy(value)
            state[key] = new
            if new is not value:
                copied.append(key)
        for key in _COPIED_TABLES.intersection(source):
            state[key] = source[key].copy()
        for key in _FORWARD_HOOKS:
            hooks = source.get(key)
            if hooks is not None:
                state[key] = self._hooks(mod, shadow, key, hooks) if hooks else OrderedDict()
        for key in _BACKWARD_HOOKS:
            if key in source:
                state[key] = OrderedDict()
        if "_modules" in source:
            state["_modules"] = {k: None if m is None else self._shadows[id(m)]
                                 for k, m in source["_modules"].items()}
        self._as_filled[id(shadow)] = (tuple(state), tuple(state.values()), copied)

    def _hooks(self, mod: nn.Module, shadow: nn.Module, key: str, hooks: dict[int, Any]
               ) -> Any:
        """The forward hooks of ``mod`` that are part of the computation: those a plugin
        declares computing, or deriving tensors (see :mod:`fxsym.plugins.hookroles`). Those
        left out that nobody declared harmless, and derived tensors without a way to keep
        entries, are noted (:attr:`hidden_hooks`, :attr:`unseen`)."""
        kept: OrderedDict[int, Any] = OrderedDict()
        name = self._names[id(mod)]
        for k, hook in hooks.items():
            derived = None if self._derives is None or key != "_forward_pre_hooks" else (
                self._derives(mod, hook))
            if derived is not None:
                kept[k] = hook
                if derived.keep is None:
                    self._unseen(shadow, name, "derived-weight", f"its {', '.join(derived.names)}"
                                 f" is computed by {_KINDS[key]} {describe_hook(hook)}: "
                                 f"{derived.reason or 'no resize rule keeps entries of it'}")
                continue
            answer = None if self._vote is None else self._vote(mod, hook)
            if answer:
                kept[k] = hook
                self.hooked.add(id(shadow))
            elif answer is None:
                self._unseen(shadow, name, "hidden-hook",
                             f"its {_KINDS[key]} {describe_hook(hook)} does not run while "
                             "traced (no plugin declares it part of the computation or "
                             "harmless, fxsym_hook_computes)")
        return kept

    def _global_hooks(self) -> list[str]:
        """The process-wide forward hooks no plugin declares harmless (asked with
        ``module=None``): a leaf's call is one node, so they do not run in the graph."""
        found = []
        for kind, table in (("pre-hook", _global_forward_pre_hooks),
                            ("hook", _global_forward_hooks)):
            for hook in list(table.values()):
                if self._vote is None or self._vote(None, hook) is not False:  # type: ignore[arg-type]
                    why = (f"global forward {kind} {describe_hook(hook)} (torch's "
                           f"register_module_forward_{kind.replace('-', '_')}) does not run "
                           "in the graph of a leaf and nobody declares it harmless "
                           "(fxsym_hook_computes with module None)")
                    found.append(why)
                    self.hidden_hooks.setdefault("", []).append((
                        "hidden-hook", f"{why}; the groups of every module call's inputs, "
                        "outputs and sizes are pinned"))
        return found

    def _unseen(self, shadow: nn.Module, name: str, kind: str, why: str) -> None:
        self.hidden_hooks.setdefault(name, []).append((
            kind, f"{why}; the groups of its inputs, outputs and sizes are pinned"))
        self.unseen.setdefault(id(shadow), []).append(why)

    def _dict_attribute(self, shadow: nn.Module, key: str, value: dict[Any, Any]) -> Any:
        """A user dict attribute, watched: given empty when it holds derived tensors (and
        the tree empties them), a cache if the traced forward fills it from empty."""
        held = bool(value) and self._holds_derived(value)
        if not value or (held and self._empty_derived):
            self._watched.append((shadow, key, held, True))
            empty = self._copy(value)
            empty.clear()
            return empty
        if held:
            self._watched.append((shadow, key, True, False))
        return self._copy(value)

    def _holds_derived(self, value: Any) -> bool:
        """Whether ``value`` (a container) holds a tensor that is not registered in the tree."""
        if isinstance(value, torch.Tensor):
            return id(value) not in self._registered
        if isinstance(value, dict) and not isinstance(value, nn.Module):
            return any(self._holds_derived(v) for v in value.values())
        if isinstance(value, (list, tuple, set)):
            return any(self._holds_derived(v) for v in value)
        return False

    def _copy(self, value: Any) -> Any:
        """``value`` with its containers copied and its modules, bound methods, partials,
        closures and weak references pointing into the shadow tree."""
        kind = type(value)
        if kind in _ATOMS:
            return value
        if kind is tuple:  # ``(self.a, self.b)`` kept aside: the shadows, in a new tuple
            if all(type(v) in _ATOMS for v in value):
                return value
            items = tuple(map(self._copy, value))
            return value if all(map(operator.is_, items, value)) else items
        if isinstance(value, nn.Module):
            return self._shadows.get(id(value), value)
        done = self._copies.get(id(value))
        if done is not None:
            return done
        if kind in _PLAIN:
            new: Any = value.copy()
        elif isinstance(value, (dict, list, set)):  # defaultdict, a user's subclass
            new = copy.copy(value)
        elif kind is types.MethodType:
            owner = self._copy(value.__self__)
            return value if owner is value.__self__ else types.MethodType(value.__func__, owner)
        elif kind is functools.partial:
            return self._partial(value)
        elif kind is types.FunctionType and (value.__closure__ or value.__defaults__
                                             or value.__kwdefaults__):
            return self._function(value)
        elif kind is weakref.ref:
            held = value()
            if isinstance(held, nn.Module) and id(held) in self._shadows:
                return weakref.ref(self._shadows[id(held)])
            return value
        else:
            return value
        self._copies[id(value)] = new
        if isinstance(new, dict):
            for k, v in new.items():
                if type(v) not in _ATOMS:
                    new[k] = self._copy(v)
            if any(isinstance(k, nn.Module) for k in new):  # keyed by modules: by shadows
                pairs = [(self._copy(k), v) for k, v in new.items()]
                new.clear()
                new.update(pairs)
                self._keyed.append(new)
        elif isinstance(new, list):
            for i, v in enumerate(new):
                if type(v) not in _ATOMS:
                    new[i] = self._copy(v)
        elif isinstance(new, set):
            members = [self._copy(v) for v in new]
            new.clear()
            new.update(members)
            if any(isinstance(m, nn.Module) for m in members):
                self._keyed.append(new)
        return new

    def _partial(self, value: functools.partial[Any]) -> Any:
        """A partial whose function, arguments or keywords hold a module of the tree (or a
        method, partial or closure of one): the same partial over their shadows."""
        func = self._copy(value.func)
        args = tuple(map(self._copy, value.args))
        keywords = {k: self._copy(v) for k, v in value.keywords.items()}
        if func is value.func and all(map(operator.is_, args, value.args)) and all(
                keywords[k] is v for k, v in value.keywords.items()):
            return value
        return functools.partial(func, *args, **keywords)

    def _function(self, value: types.FunctionType) -> Any:
        """A function closing over (or defaulting to) a module of the tree, a container
        holding one, ...: the same code over new cells holding their shadows (a lambda kept in
        a dict, calling a child, calls the child's shadow). Any other function: itself."""
        cells = value.__closure__ or ()
        contents = [_cell_contents(cell) for cell in cells]
        self._copies[id(value)] = value  # a function reaching itself: itself, for now
        copied = [c if c is _EMPTY else self._copy(c) for c in contents]
        defaults = self._copy(value.__defaults__) if value.__defaults__ else value.__defaults__
        kwdefaults = (self._copy(value.__kwdefaults__) if value.__kwdefaults__
                      else value.__kwdefaults__)
        if (all(map(operator.is_, copied, contents)) and defaults is value.__defaults__
                and kwdefaults is value.__kwdefaults__):
            return value
        new_cells = tuple(types.CellType() if c is _EMPTY else types.CellType(c)
                          for c in copied)
        new = types.FunctionType(value.__code__, value.__globals__, value.__name__,
                                 defaults, new_cells)
        new.__kwdefaults__ = kwdefaults
        new.__qualname__ = value.__qualname__
        new.__dict__.update(value.__dict__)
        functools.update_wrapper(new, value, assigned=("__module__", "__doc__"), updated=())
        self._copies[id(value)] = new
        return new

    def _config(self, owner: nn.Module, config: Any, family: type) -> Any:
        """A copy of a config object and of the configs of its family it holds: built with
        ``object.__new__`` (no code of the config's runs), else with ``copy.copy`` (a dict
        subclass, a class with its own ``__new__``), its fields copied as any other state of
        the tree; one that cannot be copied is refused (:class:`~fxsym.errors.TraceError`),
        never shared."""
        done = self._copies.get(id(config))
        if done is not None:
            return done
        try:
            new = object.__new__(type(config))
        except TypeError:  # a dict subclass, a class with its own __new__: copy's way
            try:
                new = copy.copy(config)
            except Exception as exc:
                raise TraceError(
                    f"the config of {self._names[id(owner)] or type(owner).__name__} "
                    f"({type(config).__name__}) cannot be copied ({type(exc).__name__}: {exc}); "
                    "fxsym traces a copy of it so that nothing the trace does writes into the "
                    "model. Make it copyable (copy.copy) or hold it under another name than "
                    "'config'") from exc
            if not hasattr(new, "__dict__") or new is config:
                raise TraceError(
                    f"the config of {self._names[id(owner)] or type(owner).__name__} "
                    f"({type(config).__name__}) cannot be copied (copy.copy gave it back "
                    "itself); fxsym traces a copy of it so that nothing the trace does writes "
                    "into the model. Make it copyable or hold it under another name") from None
            vars(new).clear()
        self._copies[id(config)] = new
        self._originals[id(new)] = config
        state = vars(new)
        for key, value in vars(config).items():
            if family is not object and isinstance(value, family) and _is_object(value):
                state[key] = self._config(owner, value, family)
            else:
                state[key] = self._copy(value)
        return new

    @contextlib.contextmanager
    def live(self) -> Iterator[None]:
        """Make :func:`original_module` answer from this tree in this thread for the block."""
        was = getattr(_live, "tree", None)
        _live.tree = self
        try:
            yield
        finally:
            _live.tree = was

    def rehash(self) -> None:
        """Insert the shadows held as dict keys and set members again: called once the
        tree is live and shadows hash as the user's modules (:mod:`.identity`), so that
        ``self.a in self.skip`` finds the shadow there as the model finds its module."""
        for table in self._keyed:
            if isinstance(table, dict):
                items = list(table.items())
                table.clear()
                table.update(items)
            else:
                members = list(table)
                table.clear()
                table.update(members)

    def original(self, obj: Any) -> Any:
        """The user's module a shadow stands for, the user's config a copy stands for (any
        other object: itself)."""
        return self._originals.get(_real_id(obj), obj)

    def user_module(self, obj: object) -> nn.Module | None:
        """The user's module ``obj`` is the shadow of, or ``None`` (not a shadow)."""
        return self._users.get(_real_id(obj))

    def users_by_id(self) -> dict[int, nn.Module]:
        """The user's module behind each shadow, by the shadow's ``id`` (read only)."""
        return self._users

    def is_user_module(self, obj: object) -> bool:
        """Whether ``obj`` is one of the user's modules of the tree (not a shadow)."""
        shadow = self._shadows.get(_real_id(obj))
        return shadow is not None and shadow is not obj

    def name_of(self, module: nn.Module) -> str:
        """The qualified name of the user's ``module`` (or of the module a shadow stands
        for) in the tree."""
        return self._names.get(id(self.original(module)), "")

    def shadows(self) -> Iterator[tuple[nn.Module, nn.Module]]:
        """Each (shadow, original) pair."""
        for shadow in self._shadows.values():
            yield shadow, self._originals[id(shadow)]

    def ran_as_leaf(self, shadow: nn.Module, clone: nn.Module) -> None:
        """Note the dicts given empty that a run of ``clone`` (a copy of the leaf ``shadow``,
        run for its value) filled: the leaf's forward recomputes them when missing."""
        for watched, key, _, emptied in self._watched:
            if watched is shadow and emptied and vars(clone).get(key):
                self._filled.add((id(shadow), key))

    def _was_filled(self, shadow: nn.Module, key: str) -> bool:
        return bool(vars(shadow).get(key)) or (id(shadow), key) in self._filled

    def unfilled(self) -> list[str]:
        """The dicts given empty although they held derived tensors that the traced forward
        did not fill again (``qualname.attribute``): a trace that failed may have needed them."""
        return [f"{self._names[id(self.original(shadow))]}.{key}"
                for shadow, key, held, emptied in self._watched
                if held and emptied and not self._was_filled(shadow, key)]

    def derived_state(self, written: dict[str, dict[str, list[str]]] | None = None
                      ) -> dict[str, dict[str, str]]:
        """After the trace: by module qualified name, each attribute holding state the model
        derives, :data:`CACHE` (a dict the forward filled from empty) or :data:`DERIVED` (a
        dict of derived tensors not shown to be refilled, an attribute the forward set to a
        traced value). ``written`` is what :meth:`written` gives, if the caller has it."""
        found: dict[str, dict[str, str]] = {}
        for shadow, key, held, emptied in self._watched:
            name = self._names[id(self.original(shadow))]
            if emptied and self._was_filled(shadow, key):
                found.setdefault(name, {})[key] = CACHE
            elif held:
                found.setdefault(name, {})[key] = DERIVED
        for name, attrs in (self.written() if written is None else written).items():
            for key in attrs:
                found.setdefault(name, {}).setdefault(key, DERIVED)
        return found

    def written(self) -> dict[str, dict[str, list[str]]]:
        """After the trace: by module qualified name, each attribute the forward set to a
        traced value (not a dict given empty), with the names of the graph nodes of the values
        it holds (what :mod:`fxsym.analysis.derived` asks whether a resize changes; an int
        attribute's value the forward passed on unused has no node and stays derived).

        A shadow whose attributes are the objects it was filled with (the forward rebound
        none, the usual case) is looked into only where it holds copies (a container the
        forward may have filled); any other shadow, attribute by attribute."""
        given = {(id(shadow), key) for shadow, key, _, _ in self._watched}
        found: dict[str, dict[str, list[str]]] = {}
        for shadow, original in self.shadows():
            state = vars(shadow)
            keys, values, copied = self._as_filled[id(shadow)]
            unchanged = (len(state) == len(keys) and all(map(operator.is_, state, keys))
                         and all(map(operator.is_, state.values(), values)))
            mine = vars(original)
            for key in copied if unchanged else list(state):
                value = state[key]
                if (key in _TORCH_TABLES or (id(shadow), key) in given
                        or mine.get(key) is value):
                    continue
                nodes: list[str] = []
                _proxy_nodes(value, nodes)
                if nodes:
                    found.setdefault(self._names[id(original)], {})[key] = nodes
        return found


_live = threading.local()
#: ``id`` as Python gives it: :mod:`.identity` answers ``id(shadow)`` with the user's module's
#: for the model's code while a trace runs
_real_id = builtins.id


def original_module(module: nn.Module) -> nn.Module:
    """The user's module behind ``module`` while this thread traces a shadow of it (plugins
    keeping records by module, such as a trace context's hooks, record the user's); any other
    module, or outside a trace, is returned as is."""
    tree: ShadowTree | None = getattr(_live, "tree", None)
    return module if tree is None else tree.original(module)


def _proxy_nodes(value: Any, into: list[str], seen: set[int] | None = None) -> None:
    """Append the name of the node of every Proxy ``value`` holds (in lists, tuples, dicts,
    sets, at any depth; each container once) to ``into``; of an int attribute's proxy the
    forward never used (it has no node), what it reads, which names no node."""
    if isinstance(value, ShapeProxy) and value.pending:
        into.append(value.source)
    elif isinstance(value, torch.fx.Proxy):
        into.append(value.node.name)
    elif isinstance(value, (list, tuple, set, frozenset)) or (
            isinstance(value, dict) and not isinstance(value, nn.Module)):
        seen = set() if seen is None else seen
        if id(value) in seen:
            return
        seen.add(id(value))
        for item in value.values() if isinstance(value, dict) else value:
            _proxy_nodes(item, into, seen)


_EMPTY = object()


def _cell_contents(cell: Any) -> Any:
    """What a closure cell holds (:data:`_EMPTY` for a cell not filled yet)."""
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY


def _is_object(value: Any) -> bool:
    """An object of a class (with a ``__dict__``), not a module, class or callable."""
    return (hasattr(value, "__dict__") and not isinstance(value, (nn.Module, type))
            and not callable(value))


__all__ = ["ShadowTree", "original_module"]
