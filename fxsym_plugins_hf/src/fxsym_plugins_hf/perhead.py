"""Attention leaves that are handed a per-head tensor: their heads cannot move alone.

An attention leaf describes its heads as its own symbol, and fxsym's analyzer pins the
leaf's extra tensor inputs without knowing how they relate to those heads. Most masks are
``(batch, 1, query, key)`` and relate to no head. Some families add a per-head bias to the
mask before the call (BEiT's ``relative_position_bias_table``, ALiBi slopes): a
``(batch, heads, query, key)`` tensor whose head ``h`` must stay with head ``h`` of the
queries and keys. Permuting or shrinking the leaf's heads without that tensor changes the
model, so such a leaf's heads are kept constant (the tensor's own groups are pinned as an
extra input already): the bias table pins the heads group.

Which leaves get such a tensor is only known from the call, which the leaf's SymInfo does not
see. While a model is traced (:func:`watch`), a forward pre-hook on every known attention
module looks at the meta values it is run on to compute the leaf's value, and records the
module; :meth:`PerHeadInputs.reason` answers from that record when fxsym then builds the
SymInfos. The record of a module is dropped when a trace of a model holding it begins, so it
reflects that module's latest trace only.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from fxsym.tracer import original_module

from .discovery import known_attention


class PerHeadInputs:
    """The attention modules handed a per-head tensor in their latest trace, with why; one
    record per plugin instance (so per plugin manager)."""

    def __init__(self) -> None:
        self._seen: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()

    def reason(self, module: nn.Module) -> str | None:
        """Why ``module``'s heads must stay (a per-head input seen in its latest trace), or
        ``None``."""
        return self._seen.get(module)

    def _pre_hook(self, original: nn.Module, module: nn.Module, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> None:
        extra = [(f"argument {i}", a) for i, a in enumerate(args) if i > 0]
        extra += [(name, a) for name, a in kwargs.items() if name != "hidden_states"]
        for name, value in extra:
            if _per_head(value):
                self._seen[original] = (f"its {name} has {value.shape[1]} heads "
                                        f"(shape {tuple(value.shape)})")
                return

    @contextmanager
    def watch(self, model: nn.Module) -> Iterator[None]:
        """Record, for the duration of one trace, the attention modules of ``model`` that
        are called with a per-head tensor."""
        handles = []
        try:
            for mod in model.modules():
                user = original_module(mod)  # the model traced is a shadow of the user's
                self._seen.pop(user, None)
                cls: type = type(mod)
                if known_attention(cls):
                    handles.append(mod.register_forward_pre_hook(
                        functools.partial(self._pre_hook, user), with_kwargs=True))
            yield
        finally:
            for handle in handles:
                handle.remove()


def _per_head(value: Any) -> bool:
    """A ``(batch, heads, query, key)`` tensor with more than one head (proxies of a traced-
    through call are not looked at: there the graph shows the tie)."""
    return isinstance(value, torch.Tensor) and value.dim() == 4 and value.shape[1] > 1
