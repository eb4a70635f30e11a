"""Dropped units in tensors: their entries found along a dim laid out by the analysis, zeroed
where the value plan says they are read (parameters in place, module inputs by forward
pre-hooks), or taken out of a value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..analysis import TensorLayout
from .running import _attribute
from .valueplan import _Read, _ValuePlan


def _entries(table: Any, dim: Sequence[Any], dropped: dict[int, torch.Tensor]) -> torch.Tensor:
    """The entries of a dim laid out as ``dim`` that belong to the ``dropped`` units (by
    group root)."""
    parts: list[torch.Tensor] = []
    offset = 0
    for seg in dim:
        length = seg.units * seg.block
        root = table.find(seg.group) if seg.group is not None else None
        units = dropped.get(root) if root is not None else None
        if units is not None and len(units):
            per_unit = seg.units // table.units[root]
            fine = (units[:, None] * per_unit + torch.arange(per_unit)[None, :]).flatten()
            block = torch.arange(seg.block)
            parts.append((fine[:, None] * seg.block + block[None, :]).flatten() + offset)
        offset += length
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def _zeroed(t: Any, dims: Sequence[tuple[int, Sequence[Any]]], table: Any,
            dropped: dict[int, torch.Tensor]) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    for d, dim in dims:
        idx = _entries(table, dim, dropped)
        if idx.numel() and d < t.dim() and t.shape[d] == sum(s.units * s.block for s in dim):
            t = t.index_fill(d, idx.to(t.device), 0)
    return t


def _zero_reads(clone: nn.Module, plan: _ValuePlan, dropped: dict[int, torch.Tensor],
                table: Any) -> list[Any]:
    """Zero the dropped units where ``plan`` says they are read: parameters in place (the
    copy's), module inputs by forward pre-hooks; the hooks' handles."""
    calls: dict[str, dict[int, list[_Read]]] = {}
    for root, reads in plan.reads.items():
        if root not in dropped:
            continue
        for r in reads:
            if r.arg is None:
                tensor = _attribute(clone, r.target)
                if isinstance(tensor, torch.Tensor):
                    with torch.no_grad():
                        tensor.copy_(_zeroed(tensor, r.dims, table, {root: dropped[root]}))
            else:
                calls.setdefault(r.target, {}).setdefault(r.call, []).append(r)
    modules = dict(clone.named_modules())
    handles = []
    for target, by_call in calls.items():
        count = [0]

        def pre_hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                     by_call: dict[int, list[_Read]] = by_call,
                     count: list[int] = count) -> tuple[tuple[Any, ...], dict[str, Any]]:
            reads = by_call.get(count[0], [])
            count[0] += 1
            new_args, new_kwargs = list(args), dict(kwargs)
            for r in reads:
                if isinstance(r.arg, int) and r.arg < len(new_args):
                    new_args[r.arg] = _zeroed(new_args[r.arg], r.dims, table, dropped)
                elif isinstance(r.arg, str) and r.arg in new_kwargs:
                    new_kwargs[r.arg] = _zeroed(new_kwargs[r.arg], r.dims, table, dropped)
            return tuple(new_args), new_kwargs

        if target in modules:
            handles.append(modules[target].register_forward_pre_hook(pre_hook,
                                                                     with_kwargs=True))
    return handles


def _kept(value: Any, layout: Any, table: Any, dropped: dict[int, torch.Tensor]) -> Any:
    """``value`` without the entries of the dropped units, as ``layout`` lays them out."""
    if isinstance(value, torch.Tensor) and isinstance(layout, TensorLayout):
        for d, dim in enumerate(layout):
            gone = _entries(table, dim, dropped)
            if gone.numel() and d < value.dim():
                keep = torch.ones(value.shape[d], dtype=torch.bool)
                keep[gone] = False
                value = value.index_select(d, keep.nonzero().flatten().to(value.device))
        return value
    if isinstance(value, (tuple, list)) and isinstance(layout, (tuple, list)) and not (
            isinstance(layout, TensorLayout)) and len(value) == len(layout):
        return type(value)(_kept(v, lay, table, dropped) for v, lay in zip(value, layout))
    return value
