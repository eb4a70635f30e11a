"""Rotary position embeddings whose cache update depends on data.

The default rope traces through: ``cos``/``sin`` are computed once from ``inv_freq`` and the
position ids. The ``dynamic`` and ``longrope`` types wrap ``forward`` in an update that asks
``max(position_ids) + 1 > max_seq_len_cached`` and rewrites ``inv_freq``: data-dependent
control flow that neither torch.fx nor the meta device can follow.

Such a module (recognized by structure: an ``inv_freq`` buffer and a ``forward(x,
position_ids)``) becomes a leaf. In the graph it is one ``call_module`` node, so the traced
model runs the real update at run time. Its value at trace time is computed by the undecorated
``forward``. For the duration of the trace, the instance's ``forward`` takes that path when it
is given meta tensors. The leaf reads only the dtype and device of ``x``: its symbol ``hidden``
consumes ``x``'s last dim without constraining it, and resizing it changes nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from fxsym import Symbol, SymInfo

from .modules import IN


def rotary_forward(cls: type) -> bool:
    """Whether ``cls.forward`` takes a rotary embedding's ``(x, position_ids)``."""
    try:
        params = inspect.signature(inspect.unwrap(cls.forward)).parameters  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return False
    return {"x", "position_ids"} <= set(params)


def is_rotary(module: nn.Module) -> bool:
    return "inv_freq" in module._buffers and rotary_forward(type(module))


def data_dependent(module: nn.Module) -> bool:
    """Whether the module's rope type updates its frequencies from the data."""
    rope = getattr(module, "rope_type", "default")
    types = rope.values() if isinstance(rope, dict) else [rope]
    return any(isinstance(t, str) and ("dynamic" in t or t == "longrope") for t in types)


def rotary_info(module: nn.Module) -> SymInfo:
    if not (is_rotary(module) and data_dependent(module)):
        return SymInfo()
    return SymInfo(hidden=Symbol(cl_type=IN, elastic_dims={-1}))


def no_resize(module: Any, name: str, index: torch.Tensor) -> None:
    """``x`` is read for its dtype and device only."""


def _is_meta(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_meta


@contextmanager
def meta_friendly(model: nn.Module) -> Iterator[None]:
    """Data-dependent rotary modules of ``model`` skip their update on meta tensors."""
    patched: list[tuple[nn.Module, Any]] = []
    try:
        for mod in model.modules():
            if not (is_rotary(mod) and data_dependent(mod)):
                continue
            plain = inspect.unwrap(type(mod).forward)
            decorated = mod.forward
            patched.append((mod, vars(mod).get("forward")))

            def forward(x: Any, position_ids: Any, *args: Any, _mod: nn.Module = mod,
                         _plain: Any = plain, _decorated: Any = decorated,
                         **kwargs: Any) -> Any:
                if _is_meta(x) or _is_meta(position_ids):
                    with torch.no_grad():
                        return _plain(_mod, x, position_ids, *args, **kwargs)
                return _decorated(x, position_ids, *args, **kwargs)

            mod.forward = forward
        yield
    finally:
        for mod, previous in reversed(patched):
            if previous is None:
                vars(mod).pop("forward", None)
            else:
                mod.forward = previous
