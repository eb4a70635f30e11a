"""What every op rule shares: the rule type, argument reading, and pinning that names the op.

Nothing here proves a mapping. :func:`checked_layout` is the last line of defence of the
rules that compute a layout from arguments: a layout whose sizes disagree with the traced
value is refused (the node becomes a boundary), so a misread argument never passes a group
on. :func:`pin_dims` pins with a reason that names the op, for the trace report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from fxsym.analysis import (
    Dim,
    Layout,
    OpContext,
    SizeLayout,
    TensorLayout,
    dim_size,
)

Rule = Callable[[OpContext], Layout]


#: what an op rule is registered for: a function, or a method name
OpTarget = Callable[..., Any] | str


def tensor_args(ctx: OpContext) -> list[Any]:
    out = []
    for a in (*ctx.node.args, *ctx.node.kwargs.values()):
        if isinstance(a, torch.fx.Node) and isinstance(ctx.layout(a), TensorLayout):
            out.append(a)
    return out


def norm_dim(d: int, ndim: int) -> int:
    if not -max(ndim, 1) <= d < max(ndim, 1):
        raise IndexError(d)
    return d % max(ndim, 1)


def dims_arg(ctx: OpContext, index: int, name: str, ndim: int) -> list[int] | None:
    d = ctx.val(ctx.arg(index, name, None))
    return None if d is None else dims_arg_value(d, ndim)


def dims_arg_value(d: Any, ndim: int) -> list[int]:
    """One dim or several, normalized to sorted non-negative indices."""
    if isinstance(d, int):
        d = [d]
    return sorted({norm_dim(int(x), ndim) for x in d})


#: what an order-dependent op does to the dims it works along, for the trace report
POSITIONS = "returns positions along an elastic dim"


ORDER = "depends on the order of the entries of an elastic dim"


BY_POSITION = "addresses an elastic dim by position"


def op_name(ctx: OpContext) -> str:
    target = ctx.node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def pin_dims(ctx: OpContext, dims: Any, why: str) -> None:
    """Pin every group in ``dims`` (a Dim, a layout, or a list of them), naming the op."""
    for d in dims if isinstance(dims, list) else [dims]:
        ctx.fix(d, f"{op_name(ctx)} {why}")


def pin_extra_tensors(ctx: OpContext, first: Any) -> None:
    """Tensor operands other than ``first`` (prepend/append of ``diff``...): pinned whole."""
    for other in tensor_args(ctx):
        if other is not first:
            pin_dims(ctx, ctx.layout(other), "takes it as an extra operand")


def checked_layout(ctx: OpContext, dims: Sequence[Dim], value: Any) -> TensorLayout:
    """``dims`` as the layout of ``value``, if every size agrees (a misread argument never
    passes a group on)."""
    if not isinstance(value, torch.Tensor) or len(dims) != value.dim() or any(
            dim_size(d) != n for d, n in zip(dims, value.shape)):
        ctx.unsupported("the computed layout does not match the value's shape")
    return TensorLayout(dims)


def same_dim(ctx: OpContext, a: Dim, b: Dim) -> bool:
    if len(a) != len(b):
        return False
    for sa, sb in zip(a, b):
        if sa.length != sb.length:
            return False
        if (sa.group is None) != (sb.group is None):
            return False
        if (sa.group is not None and sb.group is not None
                and ctx.table.find(sa.group) != ctx.table.find(sb.group)):
            return False
    return True



def of_attributes_only(ctx: OpContext, size: SizeLayout) -> bool:
    """Whether the int ``size`` is read from module attributes only (``self.k``,
    ``self.k // 2``): every group it follows is an attribute's own, tied to no tensor dim."""
    table = ctx.table
    attributes = {table.find(g) for g in ctx.analyzer.attribute_groups}
    groups = {table.find(s.group) for d in size for s in d if s.group is not None}
    return bool(groups) and groups <= attributes
