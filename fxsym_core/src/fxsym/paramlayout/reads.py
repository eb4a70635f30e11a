"""Which of a module's own attributes a resize rule reads (:func:`reading`), so that modules
alike in all but attributes their rule never reads (a transformer layer's ``layer_idx``) share
one trial run of it.

While a rule runs on a trial copy, the copy's class is a subclass of its own made for this
(same name, qualified name and module; its ``__getattribute__`` first), which records every
attribute name looked up on the instance: ``self.flip``, ``getattr(self, "flip", None)``,
``hasattr``. ``__dict__`` (``vars(self)``, ``self.__dict__``) is then a view of the instance's
dict that records the keys looked up in it (``.get(name)``, ``[name]``, ``name in``) and writes
through; going over all of it (``items()``, iterating, ``len``) counts as reading every
attribute. Lookups made by ``nn.Module``'s own ``__getattr__``, ``__setattr__`` and
``__delattr__`` (which read ``__dict__`` to find a parameter, a buffer or a child, or to store
one) are not recorded: the names they resolve are parameters, buffers and children, which the
signature keys on whole; a value the rule writes is not a read. The class is put back after
the run. Only the module itself is recorded, not its children (their attributes stay in the
key whole).

What a rule could still read unseen: ``object.__getattribute__(module, name)``, which goes
around the class; and a rule that branches on ``type(module) is C`` sees the subclass. The
derivation (:mod:`.derive`) checks a result at its first reuse for a module whose attributes
differ: that module's rule is run plainly too, and a different result ends reuse for that
rule, symbol and signature; a rule that fails under the recording class is run plainly.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

from torch import nn

#: what is being recorded in this thread: id of the copy -> names read (None: paused)
_LOCAL = threading.local()

#: a lookup of it reads every attribute
EVERYTHING = "__dict__"


def _recorder(obj: object) -> set[str] | None:
    table: dict[int, set[str] | None] | None = getattr(_LOCAL, "table", None)
    return None if table is None else table.get(id(obj))


@contextmanager
def _paused(obj: object) -> Iterator[None]:
    table: dict[int, set[str] | None] | None = getattr(_LOCAL, "table", None)
    if table is None or table.get(id(obj)) is None:
        yield
        return
    names = table[id(obj)]
    table[id(obj)] = None
    try:
        yield
    finally:
        table[id(obj)] = names


_CLASSES: dict[type, type] = {}


def _recording_class(cls: type[nn.Module]) -> type[nn.Module]:
    """The subclass of ``cls`` whose lookups are recorded (made once per class; its methods
    are its own, not a mixin's, so that an instance's class can be swapped to it)."""
    made = _CLASSES.get(cls)
    if made is not None:
        return made

    def __getattribute__(self: Any, name: str) -> Any:
        names = _recorder(self)
        if names is None:
            return cls.__getattribute__(self, name)
        if name == "__dict__":
            return _ReadDict(cls.__getattribute__(self, name), names)
        names.add(name)
        return cls.__getattribute__(self, name)

    def __getattr__(self: Any, name: str) -> Any:
        with _paused(self):
            return cls.__getattr__(self, name)

    def __setattr__(self: Any, name: str, value: Any) -> None:
        with _paused(self):
            cls.__setattr__(self, name, value)

    def __delattr__(self: Any, name: str) -> None:
        with _paused(self):
            cls.__delattr__(self, name)

    made = _CLASSES[cls] = type(cls.__name__, (cls,), {
        "__qualname__": cls.__qualname__, "__module__": cls.__module__,
        "__getattribute__": __getattribute__, "__getattr__": __getattr__,
        "__setattr__": __setattr__, "__delattr__": __delattr__})
    return made


class _ReadDict(MutableMapping[str, Any]):
    """An instance's ``__dict__`` whose lookups are recorded in ``names``; writes go through."""

    def __init__(self, state: dict[str, Any], names: set[str]) -> None:
        self._state, self._names = state, names

    def __getitem__(self, key: str) -> Any:
        self._names.add(key)
        return self._state[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._state[key] = value

    def __delitem__(self, key: str) -> None:
        del self._state[key]

    def __iter__(self) -> Iterator[str]:
        self._names.add(EVERYTHING)
        return iter(self._state)

    def __len__(self) -> int:
        self._names.add(EVERYTHING)
        return len(self._state)


@contextmanager
def reading(mod: nn.Module, names: set[str]) -> Iterator[None]:
    """Add to ``names`` the attribute names looked up on ``mod`` while the block runs (see
    the module doc); ``mod`` is of its own class again afterwards."""
    cls = type(mod)
    table: dict[int, set[str] | None] | None = getattr(_LOCAL, "table", None)
    if table is None:
        table = _LOCAL.table = {}
    mod.__class__ = _recording_class(cls)
    table[id(mod)] = names
    try:
        yield
    finally:
        del table[id(mod)]
        mod.__class__ = cls
