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
running it again finishes the job.

Imports from fxsym: nothing (every room may use it).
"""

from __future__ import annotations

from typing import Any

from torch import nn

_CONTAINERS = (dict, list, set)
_MISSING = object()


class ModuleTreeState:
    """The state of ``root`` and all its submodules at construction time."""

    def __init__(self, root: nn.Module) -> None:
        self.attrs: list[tuple[nn.Module, dict[str, Any]]] = []
        self._contents: list[tuple[Any, Any]] = []
        seen: set[int] = set()
        for mod in root.modules():
            state = vars(mod)
            self.attrs.append((mod, dict(state)))
            for value in state.values():
                if _fresh(value, seen):
                    _record(value, seen, self._contents)

    def restore(self) -> None:
        """Put back every attribute and container content recorded at construction."""
        for mod, saved in self.attrs:
            state = vars(mod)
            for key in [k for k in state if k not in saved]:
                del state[key]
            for key, value in saved.items():
                if state.get(key, _MISSING) is not value:
                    state[key] = value
        for container, items in self._contents:
            _put_back(container, items)


def _fresh(value: Any, seen: set[int]) -> bool:
    """A container not recorded yet (shared or cyclic containers are recorded once)."""
    if not isinstance(value, _CONTAINERS) or isinstance(value, nn.Module) or id(value) in seen:
        return False
    seen.add(id(value))
    return True


def _record(container: Any, seen: set[int], out: list[tuple[Any, Any]]) -> None:
    """Append ``(container, its items)`` to ``out``, then the same for nested containers."""
    if isinstance(container, dict):
        items: Any = tuple(container.items())
        values: Any = container.values()
    elif isinstance(container, list):
        items = values = tuple(container)
    else:
        items, values = frozenset(container), ()
    out.append((container, items))
    for value in values:
        if _fresh(value, seen):
            _record(value, seen, out)


def _put_back(container: Any, items: Any) -> None:
    """Put ``items`` back into ``container`` in place, if they changed."""
    if isinstance(container, dict):
        if len(container) != len(items) or any(
            container.get(k, _MISSING) is not v for k, v in items
        ):
            container.clear()
            container.update(items)
    elif isinstance(container, list):
        if len(container) != len(items) or any(a is not b for a, b in zip(container, items)):
            container[:] = items
    elif container != items:
        container.clear()
        container.update(items)


__all__ = ["ModuleTreeState"]
