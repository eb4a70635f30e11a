"""A shadow answers "which module are you?" as the user's module does.

A trace runs a shadow of the module tree (:mod:`.shadow`): another object than the user's
module. A forward that asks which module it is — ``self in REGISTRY`` (a ``WeakSet``),
``TABLE[self]`` (a dict keyed by modules), ``self == other``, ``id(self) in TABLE`` — would
get the answer for the shadow, which no table of the user's holds, and take the other branch:
the trace would describe another program than the one the model runs.

So while a shadow tree is traced (:func:`identity_kept`) a shadow

* hashes as the user's module (``__hash__`` of the tree's classes),
* compares equal to it (``__eq__``),
* has its ``id`` for the model's code (``builtins.id``; fxsym's own code, torch's and the
  standard library's copy/pickle/weakref machinery see the shadow's own id, so their tables
  of shadows keep one entry per shadow).

These are installed for the duration of the trace on the classes of the tree's modules (not
on ``nn.Module``: setting an attribute there updates every subclass torch and transformers
define, milliseconds a trace) and in ``builtins``, as torch.fx installs its
``nn.Module.__call__``; only the tracing thread holds shadows, so another thread, and every
object that is not a shadow, gets the usual answers, the same values as without them. A class
that defines its own ``__hash__`` or ``__eq__`` keeps it.

What no object can answer as another does is ``is``: ``self is OTHER`` where ``OTHER`` is the
user's module reached from outside the tree (a global, a closure); :mod:`.escapes` refuses
those forwards.

Imports from fxsym: nothing (the tree comes from :mod:`.shadow`).
"""

from __future__ import annotations

import builtins
import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

from torch import nn

from .shadow import ShadowTree

_real_id = builtins.id
_MISSING = object()
#: modules whose ``id()`` of a shadow is the shadow's own (their tables hold shadows)
_OWN = ("fxsym", "torch", "copy", "copyreg", "pickle", "weakref", "_weakrefset", "pluggy",
        "functools", "inspect", "typing", "collections", "abc", "threading")
#: the user's module behind each shadow of the tree traced now (the innermost), by its id
_users: dict[int, nn.Module] = {}


def _hash(self: nn.Module) -> int:
    user = _users.get(_real_id(self))
    return object.__hash__(self if user is None else user)


def _eq(self: nn.Module, other: Any) -> Any:
    if self is other:
        return True
    if not isinstance(other, nn.Module):
        return NotImplemented
    if _users.get(_real_id(self), self) is _users.get(_real_id(other), other):
        return True
    return NotImplemented  # Python then compares by identity: False


def _id(obj: Any) -> int:
    real = _real_id(obj)
    user = _users.get(real)
    if user is None:
        return real
    frame = inspect.currentframe()
    try:  # a frame held in its own locals is a cycle: it and all it holds outlive the call
        caller = frame.f_back if frame is not None else None
        name = "" if caller is None else caller.f_globals.get("__name__", "")
    finally:
        del frame, caller
    return real if name.startswith(_OWN) else _real_id(user)


_SLOTS = {"__hash__": _hash, "__eq__": _eq}


@contextlib.contextmanager
def identity_kept(tree: ShadowTree) -> Iterator[None]:
    """Shadows of ``tree`` hash, compare and have the ``id`` of the user's modules for the
    block; what was there before is put back after (a nested trace's tree, then the outer
    one's again)."""
    global _users
    classes = {type(shadow) for shadow, _ in tree.shadows()}
    saved: list[tuple[type, str, Any]] = []
    for cls in classes:
        for name, fn in _SLOTS.items():
            mine = next((vars(k)[name] for k in cls.__mro__ if name in vars(k)), None)
            if mine is not fn and mine is not vars(object)[name]:
                continue  # the class's own (or a base's; ``None``: unhashable): kept
            saved.append((cls, name, vars(cls).get(name, _MISSING)))
            setattr(cls, name, fn)
    was_users, was_id = _users, builtins.id
    _users = tree.users_by_id()
    builtins.id = _id
    try:
        yield
    finally:
        _users = was_users
        builtins.id = was_id
        for cls, name, value in reversed(saved):
            if value is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, value)


__all__ = ["identity_kept"]
