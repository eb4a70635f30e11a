"""Sizes read from a config object a module holds: ``x.view(b, s, self.config.hidden_size)``.

A module's attribute named ``config`` (:data:`CONFIG_ATTRIBUTES`; a Hugging Face module's
``PretrainedConfig``, or any object with a ``__dict__``) is, while the tracer traces into the
module's ``forward``, replaced by a *shadow*: an instance of a subclass of the config's own
class (so ``isinstance`` still holds) with a copy of its ``__dict__``. Reading a public int
field of the shadow (a stored field, not a property; an alias the class maps in a dict
``attribute_map``, as Hugging Face configs do, counts as the field it names) gives the proxy of
a ``get_attr`` node carrying the int, like an int attribute of the module
(:mod:`fxsym.tracer.tracer`): ``node.meta[ATTRIBUTE_META]`` is ``(path, "config.<field>")``
and ``node.meta[CONFIG_META]`` is ``(id(config), field)`` (of the user's config, not of the
copy the traced shadow holds), which the analysis uses to give every read of one field of one
config object, by whatever module, one group: a resize can change a shared field only for all
its readers at once.

Reads made while the tracer computes a node's value (a function called with the shadow bound,
such as a mask builder) and reads after the forward returned get plain ints: the shadow is
only live while its module's own code runs.

Imports from fxsym: nothing (the tracer is passed in).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from .questions import ATTRIBUTE_META

#: module attribute names holding a config object whose int fields are traced
CONFIG_ATTRIBUTES = ("config",)
#: ``node.meta`` key of a config field read: ``(id(config object), field)``
CONFIG_META = "fxsym_config"
_SHADOWS: dict[type, type] = {}
#: the reader of each live shadow, by ``id`` (kept out of the shadow's ``__dict__``, which the
#: model's code may serialise or copy)
_READERS: dict[int, Callable[[str, int], Any]] = {}


def _shadow_getattribute(self: Any, name: str) -> Any:
    cls = type(self)
    base: Any = cls.__mro__[1]
    value = base.__getattribute__(self, name)
    if type(value) is not int or name.startswith("_"):
        return value
    read = _READERS.get(id(self))
    if read is None:
        return value
    aliases = getattr(cls, "attribute_map", None)
    field = aliases.get(name, name) if isinstance(aliases, dict) else name
    return read(field, value)


def _rebuild(cls: type, state: dict[str, Any]) -> Any:
    obj: Any = object.__new__(cls)
    vars(obj).update(state)
    return obj


def _shadow_reduce(self: Any, protocol: Any) -> tuple[Any, ...]:
    """A shadow kept somewhere (a mask builder's bound config) copies and pickles as an
    instance of the config's own class."""
    return _rebuild, (type(self).__mro__[1], dict(vars(self)))


def _shadow_class(cls: type) -> type:
    shadow: type | None = _SHADOWS.get(cls)
    if shadow is None:
        shadow = type(cls.__name__, (cls,), {"__getattribute__": _shadow_getattribute,
                                             "__reduce_ex__": _shadow_reduce,
                                             "__module__": cls.__module__,
                                             "__qualname__": cls.__qualname__})
        _SHADOWS[cls] = shadow
    return shadow


def _is_config(value: Any) -> bool:
    """An object whose fields may be shadowed: not a module, class or callable, not a shadow
    already (the module's forward re-entered)."""
    return (hasattr(value, "__dict__") and not isinstance(value, (nn.Module, type))
            and not callable(value)
            and vars(type(value)).get("__getattribute__") is not _shadow_getattribute)


@contextlib.contextmanager
def config_sizes(tracer: Any, m: nn.Module, path: str) -> Iterator[None]:
    """While ``m``'s forward is traced (inside ``tracer.trace``): its config attributes are
    shadows whose int fields read as graph values (see the module docstring)."""
    state = vars(m)
    configs = {name: state[name] for name in CONFIG_ATTRIBUTES
               if name in state and _is_config(state[name])}
    if not configs or not tracer.with_values:
        yield
        return
    shadows: dict[str, Any] = {}
    for name, config in configs.items():
        fields = {k for k, v in vars(config).items()
                  if type(v) is int and not k.startswith("_")}
        shadow: Any
        try:
            shadow = object.__new__(_shadow_class(type(config)))
        except Exception:  # a class that cannot be subclassed or built so: reads stay ints
            continue
        vars(shadow).update(vars(config))
        _READERS[id(shadow)] = _reader(tracer, path, name, config, fields)
        shadows[name] = shadow
    state.update(shadows)
    try:
        yield
    finally:
        for name, shadow in shadows.items():
            _READERS.pop(id(shadow), None)  # a shadow bound somewhere reads as plain ints now
            if state.get(name) is shadow:
                state[name] = configs[name]


def _reader(tracer: Any, path: str, attr: str, config: Any, fields: set[str]
            ) -> Callable[[str, int], Any]:
    proxies: dict[str, Any] = {}

    def read(field: str, value: int) -> Any:
        if field not in fields or not tracer.reading_sizes():
            return value
        proxy = proxies.get(field)
        if proxy is None:
            dotted = f"{attr}.{field}"
            target = f"{path}.{dotted}" if path else dotted
            tracer.attribute_values[target] = vars(config)[field]
            node = tracer.create_node("get_attr", target, (), {})
            node.meta[ATTRIBUTE_META] = (path, dotted)
            node.meta[CONFIG_META] = (id(tracer.original(config)), field)
            proxy = proxies[field] = tracer.proxy(node)
        return proxy

    return read


__all__ = ["CONFIG_ATTRIBUTES", "CONFIG_META", "config_sizes"]
