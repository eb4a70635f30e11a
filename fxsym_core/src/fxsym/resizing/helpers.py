"""Building blocks for resize rules: keep some entries of a parameter or buffer.

:func:`keep_entries` reports every keep to the observer :func:`observe_keeps` installs (per
thread and task): that is how :mod:`fxsym.paramlayout` learns where a rule puts the units of a
symbol, running the rule on a copy of one module whose tensors are on the meta device, without
reading or copying a weight.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ..errors import ResizeError
from ..plugins.calls import derived_tensors
from ..plugins.hookroles import DerivedTensors, describe_hook

#: ``observer(old, dim, index, new)``: ``new`` (bound in place of ``old``) holds the entries
#: ``index`` of ``old`` along ``dim``
KeepObserver = Callable[[torch.Tensor, int, torch.Tensor, torch.Tensor], None]

_OBSERVER: contextvars.ContextVar[KeepObserver | None] = contextvars.ContextVar(
    "fxsym_keep_observer", default=None)


@contextlib.contextmanager
def observe_keeps(observer: KeepObserver) -> Iterator[None]:
    """Call ``observer`` for every :func:`keep_entries` in this thread (or task) meanwhile."""
    token = _OBSERVER.set(observer)
    try:
        yield
    finally:
        _OBSERVER.reset(token)


def keep_entries(module: nn.Module, name: str, dim: int, index: torch.Tensor) -> None:
    """Replace parameter or buffer ``name`` of ``module`` by its entries ``index`` along ``dim``.

    A parameter stays a parameter (same ``requires_grad``); ``None`` entries are left alone.
    The old tensor is never written: a new one is bound in its place, through the module's
    ``__setattr__``, which is what lets :func:`fxsym.resize` undo a failed resize.

    A tensor that a forward pre-hook computes from others (``weight`` under
    ``torch.nn.utils.weight_norm``) keeps its entries through its sources, as the plugin
    declaring the hook says (``fxsym_derived_tensors``, :mod:`fxsym.plugins.hookroles`); one
    whose sources cannot be resized so raises :class:`~fxsym.errors.ResizeError`.
    """
    if module._forward_pre_hooks and name not in module._parameters and (
            name not in module._buffers):
        derived = _derived(module, name)
        if derived is not None:
            hook, role = derived
            if role.keep is None:
                raise ResizeError(f"{name} of {type(module).__name__} is computed by its "
                                  f"forward pre-hook {describe_hook(hook)}: {role.reason}")
            role.keep(module, hook, name, dim, index)
            return
    tensor = getattr(module, name, None)
    if tensor is None:
        return
    if tensor.is_meta:  # no entries to copy: a tensor of the new shape
        shape = list(tensor.shape)
        shape[dim] = len(index)
        new = torch.empty(shape, dtype=tensor.dtype, device="meta")
    else:
        with torch.no_grad():  # a new tensor: the old one stays
            new = tensor.detach().index_select(dim, index.to(tensor.device, torch.long))
    if isinstance(tensor, nn.Parameter):
        new = nn.Parameter(new, requires_grad=tensor.requires_grad)
    observer = _OBSERVER.get()
    if observer is not None:
        observer(tensor, dim, index, new)
    setattr(module, name, new)


def _derived(module: nn.Module, name: str) -> tuple[Any, DerivedTensors] | None:
    """The forward pre-hook of ``module`` that computes its tensor ``name``, and what a plugin
    declares of it (``fxsym_derived_tensors``), if any."""
    for hook in module._forward_pre_hooks.values():
        role = derived_tensors(module, hook)
        if role is not None and name in role.names:
            return hook, role
    return None


def l1_scores(weight: torch.Tensor, dim: int) -> torch.Tensor:
    """The L1 norm of each slice of ``weight`` along ``dim``."""
    w = weight.detach().float()
    dims = [d for d in range(w.dim()) if d != dim % w.dim()]
    return w.abs().sum(dim=dims) if dims else w.abs()


def resize_projection(
    module: nn.Module,
    symbol: str,
    index: torch.Tensor,
    *,
    in_dim: int = 1,
    out_dim: int = 0,
    size_attrs: tuple[str, str] = ("in_features", "out_features"),
    per_output: tuple[str, ...] = ("bias",),
) -> None:
    """The resize rule of a linear projection described by ``in_features``/``out_features``
    symbols: keep entries ``index`` of ``weight`` along ``in_dim`` (symbol ``in_features``)
    or along ``out_dim`` together with each tensor of ``per_output`` along 0 (any other
    symbol), and set the matching attribute of ``size_attrs`` to the new length.

    ``nn.Linear`` is the default; GPT-2's transposed ``Conv1D`` is ``in_dim=0, out_dim=1,
    size_attrs=("nx", "nf")``.
    """
    if symbol == "in_features":
        keep_entries(module, "weight", in_dim, index)
        setattr(module, size_attrs[0], len(index))
        return
    keep_entries(module, "weight", out_dim, index)
    for name in per_output:
        keep_entries(module, name, 0, index)
    setattr(module, size_attrs[1], len(index))
