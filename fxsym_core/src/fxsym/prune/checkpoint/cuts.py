"""What a plan keeps of each stored tensor: the positions kept along each dim of each
parameter (:func:`kept_positions`, from the :class:`~fxsym.paramlayout.ParamLayout`: which
slice of which parameter belongs to which unit), by the first name of each parameter
(:func:`first_names`, the ParamLayout's names). The writer and the search's scoring run cut
the checkpoint's tensors with them, so a candidate is scored on the tensors the output would
hold.

Imports from fxsym: importance (the ParamLayout, for annotations).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from ..importance import ParamLayout


def kept_positions(lay: ParamLayout, choices: Mapping[str, Sequence[int]]
                   ) -> dict[tuple[str, int], torch.Tensor]:
    """For every ``(parameter, dim)`` a choice cuts, the positions kept along it, in order:
    a slice stays when every group it belongs to keeps its unit (the same rule as
    :meth:`~fxsym.paramlayout.ParamLayout.shapes_after`)."""
    masks: dict[tuple[str, int], torch.Tensor] = {}
    for group, keep in choices.items():
        kept = torch.as_tensor(list(keep), dtype=torch.long)
        for s in lay.slices.get(group, ()):
            key = (s.param, s.dim)
            mask = masks.get(key)
            if mask is None:
                mask = masks[key] = torch.ones(lay.shapes[s.param][s.dim], dtype=torch.bool)
            mask[s.index[~torch.isin(s.unit, kept)]] = False
    return {key: mask.nonzero().flatten() for key, mask in masks.items()}


def first_names(model: nn.Module) -> dict[str, str]:
    """Every parameter name, mapped to the first name of its parameter (the ParamLayout's)."""
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        out[n] = first.setdefault(id(p), n)
    return out
