"""Torch's factories given traced sizes record a node instead of failing.

``torch.ones(b, s)`` or ``torch.tensor(n)`` with ``b``, ``s``, ``n`` traced values fail in
torch's argument parser, which wants ints; torch.fx does not patch them. While a thread
traces, :func:`_traced_factories` replaces them (:data:`_FACTORIES`) with torch.fx's own
patcher, so the replacements are undone on exit and not stacked by a nested trace; a call
from another thread, or without a Proxy among its arguments, goes to the original function.

Imports from fxsym: nothing.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch.fx._symbolic_trace import _Patcher
from torch.utils import _pytree as pytree

from .guard import tracing_here

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
