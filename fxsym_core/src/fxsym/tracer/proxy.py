"""Shape-aware proxies.

When example inputs are given, every node of the traced graph carries its value, computed on
the ``meta`` device as the node is created (``node.meta["val"]``: a meta tensor, an int, a
``torch.Size``, a dtype, ...). :class:`ShapeProxy` uses that value to answer the questions
Python asks of a value outside the graph — truth, length, index, iteration, ``dim()``,
``ndim`` and ``dtype`` — so that shape-dependent control flow such as ``if x.shape[1] == 3:``
resolves at trace time while arithmetic on sizes stays in the graph (``x.view(x.size(0), -1)``
keeps following the input's batch size).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx

from ..errors import TraceError
from .questions import record_guard, record_size_guard

_MISSING = object()

#: attributes answered with a Python value instead of a graph node
CONCRETE_ATTRIBUTES = frozenset({"ndim", "dtype", "is_cuda", "is_sparse", "is_quantized", "layout"})
#: methods answered with a Python value instead of a graph node
CONCRETE_METHODS = frozenset({"dim", "ndimension", "is_floating_point", "is_complex",
                              "element_size", "is_contiguous"})


def value_of(node: torch.fx.Node) -> Any:
    """The value recorded for ``node`` at trace time, or ``_MISSING``."""
    return node.meta.get("val", _MISSING)


class ShapeProxy(torch.fx.Proxy):
    """A Proxy that answers shape, length, truth and dtype questions from its node's value.

    A proxy made by :meth:`deferred` has no node until it is first used (an argument, an
    operand, a question): a module's int attributes are read as sizes this way, and most of
    them (strides, flags, counts) its forward never reads."""

    _create: Callable[[ShapeProxy], torch.fx.Node] | None = None
    #: what a deferred proxy's value is read from (``"layer1.0.stride"``)
    source = ""

    @classmethod
    def deferred(cls, tracer: torch.fx.proxy.TracerBase,
                 create: Callable[[ShapeProxy], torch.fx.Node], source: str) -> ShapeProxy:
        """A proxy whose node ``create(proxy)`` makes when it is first used."""
        proxy = cls.__new__(cls)
        proxy.tracer, proxy._create, proxy.source = tracer, create, source
        return proxy

    #: kept in ``__dict__``, where torch.fx keeps a Proxy's node (its copies read it there)
    @functools.cached_property
    def node(self) -> torch.fx.Node:  # type: ignore[override]
        assert self._create is not None, "a proxy is given its node or made deferred"
        return self._create(self)

    @property
    def pending(self) -> bool:
        """Whether this is a deferred proxy whose node is not made (yet, or again)."""
        return self._create is not None and "node" not in vars(self)

    def forget(self) -> None:
        """Drop a deferred proxy's node (it was erased): the next use makes it again."""
        if self._create is not None:
            vars(self).pop("node", None)

    def _value(self, question: str) -> Any:
        val = value_of(self.node)
        if val is _MISSING:
            if getattr(self.tracer, "with_values", False):  # computing it failed: see report
                hint = "Mark the module doing this as a leaf"
            else:
                hint = ("Pass example_inputs so that fxsym can compute shapes, or mark the "
                        "module doing this as a leaf")
            raise TraceError(
                f"cannot answer {question} for node {self.node.name!r} at trace time: its value "
                f"is unknown. {hint} (a leaf policy or SymMap.register)."
            )
        if isinstance(val, (int, float)):
            record_guard(self.node, question, val, self._where())
        return val

    def _where(self) -> str:
        scope = getattr(self.tracer, "scope", None)
        return str(getattr(scope, "module_path", "") or "")

    def _length(self, question: str) -> int:
        """``len()`` of the value; of a tensor, a question asked of its first dim's size."""
        val = self._value(question)
        if isinstance(val, torch.Tensor) and val.dim():
            record_size_guard(self.node, 0, question, len(val), self._where())
        return len(val)

    def __bool__(self) -> bool:
        return bool(self._value("bool()"))

    def __len__(self) -> int:
        return self._length("len()")

    def __index__(self) -> int:
        val = int(self._value("an integer index"))
        pending = getattr(self.tracer, "index_questions", None)
        if isinstance(pending, list):
            pending.append(self.node)
        return val

    def __int__(self) -> int:
        return int(self._value("int()"))

    def __float__(self) -> float:
        return float(self._value("float()"))

    def __iter__(self) -> Iterator[Any]:
        val = value_of(self.node)
        if val is _MISSING:
            return super().__iter__()
        n = self._length("iteration") if isinstance(val, torch.Tensor) else len(val)
        # torch.fx.Proxy gets __getitem__ at run time (its magic methods are not declared)
        return (self[i] for i in range(n))  # type: ignore[index]

    def __setitem__(self, index: Any, value: Any) -> None:
        """``x[index] = value``: an ``operator.setitem`` node, a write into ``x`` that the
        graph runs where the model does (torch.fx keeps it: it has a side effect); the op
        rules see ``value`` enter the indexed part of ``x``."""
        self.tracer.create_proxy("call_function", operator.setitem, (self, index, value), {})

    def __getattr__(self, name: str) -> Any:
        if name in CONCRETE_ATTRIBUTES or name in CONCRETE_METHODS:
            val = value_of(self.node)
            if isinstance(val, torch.Tensor):
                attr = getattr(val, name)
                return attr if name in CONCRETE_ATTRIBUTES else _Constant(attr)
        if not (self.pending or isinstance(self, torch.fx.proxy.Attribute)):
            val = value_of(self.node)
            if isinstance(val, torch.Tensor) and not hasattr(val, name) and not hasattr(
                    _held(self), name):
                # what the value answers (``hasattr(weight, "SCB")`` is False for a tensor)
                raise AttributeError(f"{type(val).__name__!r} object has no attribute {name!r}")
        return ShapeAttribute(self, name)


def _held(proxy: ShapeProxy) -> Any:
    """The object a ``get_attr`` proxy reads (a parameter may carry attributes its meta value
    does not: bitsandbytes' ``SCB``); ``None`` for any other proxy."""
    read = getattr(proxy.tracer, "attribute_object", None)
    if proxy.node.op != "get_attr" or read is None:
        return None
    try:
        return read(str(proxy.node.target))
    except AttributeError:
        return None


class _Constant:
    """A method of a traced value answered with a Python value (``x.dim()``)."""

    def __init__(self, method: Any) -> None:
        self._method = method

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._method(*args, **kwargs)


class ShapeAttribute(ShapeProxy, torch.fx.proxy.Attribute):
    """An attribute of a traced value (``x.shape``); its node is created on first use."""

    node = torch.fx.proxy.Attribute.node
