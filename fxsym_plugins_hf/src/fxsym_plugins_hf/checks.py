"""transformers' value checks on traced values (``torch_compilable_check``).

transformers asserts conditions on the inputs' values through
``transformers.utils.import_utils.torch_compilable_check(cond, msg)``, which calls ``cond``
first when ``callable(cond)`` (a lazy condition). An fx proxy is callable to ``callable()``
(``torch.fx.Proxy`` defines ``__call__``, which records a call: no subclass can hide it), so
a traced condition was called as a function, and the trace failed (SigLIP 2's ``(spatial_shapes
> 0).all()``).

For one trace the function is replaced wherever transformers holds it (:mod:`.namespaces`):
a lazy condition that is not a proxy is called first, as transformers does, and a condition
that is a traced value is not checked: its value is data the trace does not have (under
``torch.compile`` transformers only hands such a condition to the compiler as a hint). Every
other condition is checked by transformers' own function, as outside a trace. The check has
no output, so the graph and the analysis are the model's with or without it; the model itself
still checks when it runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch.fx

from .namespaces import replaced


def _checking(check: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(check)
    def wrapper(cond: Any, *args: Any, **kwargs: Any) -> Any:
        if callable(cond) and not isinstance(cond, torch.fx.Proxy):
            cond = cond()
        if isinstance(cond, torch.fx.Proxy):
            return None  # a value the trace does not have: nothing to check
        return check(cond, *args, **kwargs)

    return wrapper


@contextmanager
def value_checks_on_proxies() -> Iterator[None]:
    """transformers' ``torch_compilable_check`` not calling traced conditions; restored on
    exit."""
    from transformers.utils import import_utils

    check = getattr(import_utils, "torch_compilable_check", None)
    if check is None:  # a transformers without it
        yield
        return
    with replaced({check: _checking(check)}):
        yield
