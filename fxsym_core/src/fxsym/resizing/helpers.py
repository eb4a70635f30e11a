"""Building blocks for resize rules: keep some entries of a parameter or buffer."""

from __future__ import annotations

import torch
from torch import nn


def keep_entries(module: nn.Module, name: str, dim: int, index: torch.Tensor) -> None:
    """Replace parameter or buffer ``name`` of ``module`` by its entries ``index`` along ``dim``.

    A parameter stays a parameter (same ``requires_grad``); ``None`` entries are left alone.
    The old tensor is never written: a new one is bound in its place, through the module's
    ``__setattr__``, which is what lets :func:`fxsym.resize` undo a failed resize.
    """
    tensor = getattr(module, name, None)
    if tensor is None:
        return
    index = index.to(device=tensor.device, dtype=torch.long)
    with torch.no_grad():
        new = tensor.detach().index_select(dim, index)  # a new tensor: the old one stays
    if isinstance(tensor, nn.Parameter):
        new = nn.Parameter(new, requires_grad=tensor.requires_grad)
    setattr(module, name, new)


def l1_scores(weight: torch.Tensor, dim: int) -> torch.Tensor:
    """The L1 norm of each slice of ``weight`` along ``dim``."""
    w = weight.detach().float()
    dims = [d for d in range(w.dim()) if d != dim % w.dim()]
    return w.abs().sum(dim=dims) if dims else w.abs()
