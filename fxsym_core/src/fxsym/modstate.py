"""What a module tree holds, captured and put back exactly.

Tracing runs a model's own Python code, a resize runs plugins' rules, a pass edits a
GraphModule: each may rebind what a module holds — an attribute (``self.window_size = ...``),
an entry of a container (a cache dict, ``_parameters``, ``_modules``, a hook table, a list such
as ``_flat_weights``), a child module. :class:`ModuleTreeState` records every module's
``__dict__`` and, recursively, the contents of the dicts, lists and sets it holds, and
:meth:`~ModuleTreeState.restore` puts the *same objects* back in the same containers, so
parameter identity and container identity are kept. Tensors are neither copied nor compared:
a write *into* a tensor is not undone (callers that care fingerprint them).

Restoring uses only dict, list and set operations and is idempotent: if it is interrupted,
running it again finishes the job. :meth:`~ModuleTreeState.restore_leaked` puts back only
what now holds objects a given test calls foreign (graph values that leaked out of a trace),
leaving every other change, such as another thread's, in place.

Imports from fxsym: nothing (every room may use it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable
from operator import is_
from typing import Any

import torch
from torch import nn

#: kinds of derived state a module holds (found by a trace, cleared or refused by a resize):
#: a container the forward fills again from empty, tensors the model computed that no trace
#: showed to be recomputed, and values the forward computes from nothing a resize changes
#: (the inputs, constants, sizes no group holds: a grid of cell centres), which a resize
#: leaves as they are
CACHE, DERIVED, INVARIANT = "cache", "derived", "invariant"

_CONTAINERS = (dict, list, set)
#: exact types that are containers (never modules) and that hold no container: what most
#: of a module's ``__dict__`` holds, told apart without ``isinstance``
_PLAIN_CONTAINERS = frozenset({dict, OrderedDict, list, set})
_ATOMS = frozenset({bool, int, float, str, tuple, type(None), torch.Tensor, nn.Parameter})
_MISSING = object()


class ModuleTreeState:
    """The state of ``root`` and all its submodules at construction time."""

    def __init__(self, root: nn.Module) -> None:
        self.attrs: list[tuple[nn.Module, dict[str, Any]]] = []
        #: (dict, its keys, its values), (list, its items), (set, its items), and the
        #: containers that were empty (most of a module's hook tables)
        self._dicts: list[tuple[dict[Any, Any], tuple[Any, ...], tuple[Any, ...]]] = []
        self._lists: list[tuple[list[Any], tuple[Any, ...]]] = []
        self._sets: list[tuple[set[Any], frozenset[Any]]] = []
        self._empty: list[Any] = []
        todo: list[Any] = []
        empty = self._empty
        for mod in root.modules():
            state = vars(mod)
            self.attrs.append((mod, dict(state)))
            for value in state.values():
                kind = type(value)
                if kind in _PLAIN_CONTAINERS or (kind not in _ATOMS and _is_container(value)):
                    (todo if value else empty).append(value)
        seen: set[int] = set()
        while todo:  # shared or cyclic containers are recorded once
            value = todo.pop()
            if id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value, dict):
                values = tuple(value.values())
                self._dicts.append((value, tuple(value), values))
            elif isinstance(value, list):
                values = tuple(value)
                self._lists.append((value, values))
            else:
                self._sets.append((value, frozenset(value)))
                continue
            for item in values:
                kind = type(item)
                if kind in _PLAIN_CONTAINERS or (kind not in _ATOMS and _is_container(item)):
                    (todo if item else empty).append(item)

    def restore(self) -> None:
        """Put back every attribute and container content recorded at construction."""
        for mod, saved in self.attrs:
            state = vars(mod)
            if not _same_dict(state, saved, saved.values()):
                for key in [k for k in state if k not in saved]:
                    del state[key]
                for key, value in saved.items():
                    if state.get(key, _MISSING) is not value:
                        state[key] = value
        for container, keys, values in self._dicts:
            if not _same_dict(container, keys, values):
                container.clear()
                container.update(zip(keys, values))
        for items_list, items in self._lists:
            if len(items_list) != len(items) or not all(map(is_, items_list, items)):
                items_list[:] = items
        for items_set, members in self._sets:
            if items_set != members:
                items_set.clear()
                items_set.update(members)
        for container in filter(None, self._empty):
            container.clear()


    def restore_leaked(self, leaked: Callable[[Any], bool]) -> None:
        """Put back what now holds an object ``leaked`` accepts: an attribute or a dict entry
        whose value is one (added ones are removed), a list or set holding one. What still
        holds the objects it held (the usual case) is passed over without a look."""
        for mod, saved in self.attrs:
            state = vars(mod)
            if _same_dict(state, saved, saved.values()):
                continue
            for key in [k for k, v in state.items() if saved.get(k, _MISSING) is not v
                        and leaked(v)]:
                if key in saved:
                    state[key] = saved[key]
                else:
                    del state[key]
        for container, keys, values in self._dicts:
            if _same_dict(container, keys, values):
                continue
            old = dict(zip(keys, values))
            for key in [k for k, v in container.items()
                        if old.get(k, _MISSING) is not v and leaked(v)]:
                if key in old:
                    container[key] = old[key]
                else:
                    del container[key]
        for items_list, items in self._lists:
            if (len(items_list) != len(items) or not all(map(is_, items_list, items))) and any(
                    map(leaked, items_list)):
                items_list[:] = items
        for items_set, members in self._sets:
            if any(map(leaked, items_set)):
                items_set.clear()
                items_set.update(members)
        for container in filter(None, self._empty):
            held = container.values() if isinstance(container, dict) else container
            if any(map(leaked, held)):
                container.clear()


def _is_container(value: Any) -> bool:
    """A dict, list or set (of any subclass) that is not a module (a module may subclass
    ``dict``: its state is recorded as a module's)."""
    return isinstance(value, _CONTAINERS) and not isinstance(value, nn.Module)


def _same_dict(container: dict[Any, Any], keys: Collection[Any], values: Iterable[Any]) -> bool:
    """Whether ``container`` holds the same key and value objects, in the same order (a
    mismatch found here may be a harmless reordering: the caller then rebuilds)."""
    return (len(container) == len(keys) and all(map(is_, container, keys))
            and all(map(is_, container.values(), values)))


__all__ = ["CACHE", "DERIVED", "ModuleTreeState"]


def computed_tensors(model: nn.Module, *, meta: bool = False) -> dict[int, torch.Tensor]:
    """A ``deepcopy`` memo for the tensors the modules of ``model`` hold as plain attributes
    that were computed with grad (``weight_norm``'s ``weight`` before a forward without
    grad), which ``deepcopy`` refuses: each id mapped to a detached copy (``meta``: an empty
    meta tensor of its shape). Their forward pre-hooks compute them again."""
    memo: dict[int, torch.Tensor] = {}
    for mod in model.modules():
        for value in vars(mod).values():
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                memo[id(value)] = torch.empty(value.shape, dtype=value.dtype, device="meta") \
                    if meta else value.detach().clone()
    return memo
