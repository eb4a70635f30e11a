"""Attention-mask builders as opaque graph calls.

transformers builds its attention masks in ``transformers.masking_utils`` (``create_causal_mask``,
``create_bidirectional_mask``, ...). The models import those functions by name, so for the
duration of one trace every ``transformers.*`` module attribute that *is* such a builder is
replaced by a wrapper. When called with traced values, the wrapper records one
``call_function`` node: its keyword arguments are the traced values, and everything else (the
config, ``None`` caches, Python flags) is bound in a small function object. The node's target
carries the fixed name :data:`MASK_LEAF_NAME`, so one op rule covers every builder: the mask
depends on the shapes of its inputs, never on their feature dimensions.

The node's value at trace time is the builder run on meta tensors, which count as traced
for that call (the builders skip their data-dependent shortcuts for traced values).

A builder whose trace-time value is ``None`` (Bamba's and Qwen3-Next's
``create_recurrent_attention_mask`` without an attention mask: no padding to zero) gives the
model a plain ``None`` (fxsym's tracer does so for every call of value ``None``), so its
``mask is not None`` checks answer as they do when it runs. That value is computed with meta
tensors counting as traced, so it follows from the builder's static arguments and the
inputs' shapes only, which the trace fixes anyway, never from the inputs' values.

The builders may return ``None`` at run time when no padding is seen (a shortcut for SDPA's
``is_causal``), while the traced attention was recorded with an explicit mask. The leaf
therefore always asks for the mask (``allow_is_causal_skip=False``,
``allow_is_bidirectional_skip=False``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.fx

from .namespaces import replaced

#: ``module.qualname`` of every recorded mask leaf (the op-rule key)
MASK_LEAF_NAME = f"{__name__}.mask_leaf"
_NO_SKIP = {"allow_is_causal_skip": False, "allow_is_bidirectional_skip": False}


def mask_builders() -> dict[str, Callable[..., Any]]:
    """The public ``create_*mask*`` functions of ``transformers.masking_utils``."""
    import transformers.masking_utils as mu

    return {name: fn for name, fn in vars(mu).items()
            if name.startswith("create_") and "mask" in name and inspect.isfunction(fn)
            and fn.__module__ == mu.__name__}


class MaskLeaf:
    """The callable of one recorded mask node: the builder with its non-traced arguments."""

    def __init__(self, builder: Callable[..., Any], static: dict[str, Any]) -> None:
        self.builder = builder
        self.static = static
        # torch.fx names the node's target from these; the op rule is keyed on them
        self.__module__ = __name__
        self.__name__ = self.__qualname__ = "mask_leaf"

    def __call__(self, **traced: Any) -> Any:
        if any(isinstance(v, torch.Tensor) and v.is_meta for v in traced.values()):
            with meta_counts_as_traced():
                return self.builder(**self.static, **traced)
        return self.builder(**self.static, **traced)

    def __repr__(self) -> str:
        return f"mask_leaf({self.builder.__name__})"


@contextmanager
def meta_counts_as_traced() -> Iterator[None]:
    """While a mask's trace-time value is computed (or :mod:`.cachepath`'s forward without a
    cache runs a meta copy), meta tensors count as traced: the builders then skip their
    data-dependent shortcuts (``(mask[:, -1] == 0).all()``), as they do for fx proxies."""
    import transformers.masking_utils as mu

    namespace = vars(mu)  # the builders look up ``is_tracing`` here (imported, not exported)
    original: Callable[..., bool] = namespace["is_tracing"]

    def is_tracing(tensor: Any = None) -> bool:
        return (isinstance(tensor, torch.Tensor) and tensor.is_meta) or original(tensor)

    namespace["is_tracing"] = is_tracing
    try:
        yield
    finally:
        namespace["is_tracing"] = original


def _leaf_wrapper(builder: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(builder)
    var_kw = next((p.name for p in sig.parameters.values() if p.kind is p.VAR_KEYWORD), None)
    no_skip = {k: v for k, v in _NO_SKIP.items() if k in sig.parameters}

    @functools.wraps(builder)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        flat = dict(bound.arguments)
        if var_kw is not None:
            flat.update(flat.pop(var_kw, {}))
        traced = {k: v for k, v in flat.items() if isinstance(v, torch.fx.Proxy)}
        if not traced:
            return builder(*args, **kwargs)
        static = {k: v for k, v in flat.items() if k not in traced}
        static.update(no_skip)
        tracer = next(iter(traced.values())).tracer
        return tracer.create_proxy("call_function", MaskLeaf(builder, static), (), traced)

    return wrapper


@contextmanager
def mask_builders_as_leaves() -> Iterator[None]:
    """Replace every imported mask builder by its leaf wrapper; always restore."""
    builders = {id(fn): fn for fn in mask_builders().values()}
    with replaced({fn: _leaf_wrapper(fn) for fn in builders.values()}):
        yield
