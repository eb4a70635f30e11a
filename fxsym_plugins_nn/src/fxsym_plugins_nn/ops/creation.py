"""New tensors: fixed, unless every entry is the same value or a dim is sized by a traced size.

A tensor built from numbers or random draws is fixed, and a tensor used as its data is
pinned. A constant fill (``zeros``/``ones``/``full``) built at another size is the same
tensor sliced or permuted, so its dims follow a size that is read from a shape or tied to a
module attribute. ``arange`` counts positions: the dim it counts is pinned.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from fxsym.analysis import (
    Dim,
    Layout,
    OpContext,
    SizeLayout,
    dim_size,
    fixed_dim,
    size_checked,
    tie_size,
)

from .common import checked_layout, pin_dims, tensor_args


def creation(ctx: OpContext) -> Layout:
    """New tensors from sizes (``torch.zeros(n, c)``): fixed, unless built from a tensor."""
    for a in tensor_args(ctx):
        ctx.fix(ctx.layout(a), "used as data of a new tensor")
    return ctx.fixed()


def constant_fill(ctx: OpContext) -> Layout:
    """``torch.zeros/ones/full(size)``, ``x.new_zeros/new_ones/new_full(size)``: every entry
    holds the same value, so the tensor built at any other size, or with its entries in any
    other order, is the same tensor sliced or permuted. A dim follows what sizes it: an int
    read from a module attribute (tied to it), or one read directly from a shape (the dim
    read); any other size (a number, arithmetic on sizes) is fixed and pins what it was
    computed from."""
    method = isinstance(ctx.node.target, str)
    args = ctx.node.args[1:] if method else ctx.node.args
    sizes: Any = ctx.node.kwargs.get("size", args[0] if len(args) == 1 else args)
    if ctx.node.target in (torch.full, "new_full"):
        sizes = ctx.node.kwargs.get("size", args[0] if args else ())
    if not isinstance(sizes, (tuple, list)):
        sizes = (sizes,)
    layouts = [ctx.layout(a) for a in sizes]
    if len(layouts) == 1 and isinstance(layouts[0], tuple) and not isinstance(
            layouts[0], SizeLayout):  # torch.zeros(x.shape)
        layouts = list(layouts[0])
    for a in tensor_args(ctx):  # x.new_zeros(...) reads only x's dtype and device
        if not (method and a is ctx.node.args[0]):
            ctx.fix(ctx.layout(a), "used as data of a new tensor")
    shape = ctx.out_shape()
    if len(layouts) != len(shape):
        return ctx.fixed()
    dims: list[Dim] = []
    for n, lay in zip(shape, layouts):
        dim = fixed_dim(n)
        if isinstance(lay, SizeLayout) and len(lay) == 1 and not lay.derived and dim_size(
                lay[0]) == n:
            dim = lay[0]
            if not tie_size(ctx, lay, dim):  # an attribute read tied, or a size read
                size_checked(ctx, lay)
        elif isinstance(lay, SizeLayout):
            ctx.fix(lay, "a size computed from sizes makes a new tensor")
        dims.append(dim)
    return checked_layout(ctx, dims, ctx.value)


def like_fill(ctx: OpContext) -> Layout:
    """``zeros_like/ones_like/full_like(x)``: every entry holds the same value and the shape is
    ``x``'s, which is read for its shape, dtype and device only: the result has ``x``'s
    layout (at any size, or permuted, it is the same tensor sliced or permuted)."""
    x = ctx.arg(0, "input")
    lay = ctx.tensor_layout(x)
    for a in tensor_args(ctx):
        if a is not x:
            ctx.fix(ctx.layout(a), "used as data of a new tensor")
    return checked_layout(ctx, list(ctx.table.resolve_layout(lay)), ctx.value)


def one_hot(ctx: OpContext) -> Layout:
    """``one_hot(labels, n)``: a new last dim of ``n`` classes; the labels' dims pass."""
    lay = ctx.tensor_layout(ctx.arg(0, "input"))
    return checked_layout(ctx, [*lay, fixed_dim(ctx.out_shape()[-1])], ctx.value)


def arange(ctx: OpContext) -> Layout:
    """``arange(n)``: entry ``i`` is the position ``i``; a size read from an elastic dim is
    pinned (``x * (torch.arange(x.size(1)) < k)`` treats entries by position)."""
    for a in ctx.node.all_input_nodes:
        lay = ctx.layout(a)
        if isinstance(lay, SizeLayout):
            pin_dims(ctx, list(lay), "counts the positions of an elastic dim")
    return creation(ctx)

