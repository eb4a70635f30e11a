"""Ints read from shapes: ``x.size()``, ``x.shape``, ``numel`` and arithmetic on them.

A size read directly from one dim is a :class:`~fxsym.analysis.SizeLayout` of that dim, so a
later reshape, fill or slice it sizes can check that it keeps following the dim under every
resize; arithmetic on sizes gives a *derived* size that follows every elastic dim it was
computed from (and pins them where it is used as a number). A shape joined from tuples keeps
one layout per entry.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from fxsym.analysis import (
    Layout,
    OpContext,
    SizeLayout,
    TensorLayout,
    is_fixed,
)

from .common import norm_dim


def derived_size(ctx: OpContext) -> Layout:
    """Arithmetic on sizes: the result follows every elastic dim it was computed from."""
    dims = [d for a in ctx.node.all_input_nodes
            if isinstance(lay := ctx.layout(a), SizeLayout) for d in lay if not is_fixed(d)]
    return SizeLayout(dims, derived=True) if dims else ctx.fixed()


def joined_shape(ctx: OpContext) -> Layout:
    """``x.size()[:-1] + (self.num_heads, self.head_dim)``: a shape built by joining tuples.

    Its layout is the tuple of its entries' layouts, in order, so a reshape by it checks each
    entry against the dim it sizes: a size read from a shape stays a
    :class:`~fxsym.analysis.SizeLayout` (an int read from a module attribute, or arithmetic on
    one, is passed on, not used here: the reshape ties or pins it), and any other entry is
    kept as its int, which a reshape reads as a literal."""
    out: list[Any] = []
    for arg in ctx.node.args:
        lay = ctx.layout(arg) if isinstance(arg, torch.fx.Node) else None
        if isinstance(lay, tuple) and not isinstance(lay, (SizeLayout, TensorLayout)):
            entries = list(zip(lay, ctx.val(arg)))
        elif isinstance(arg, (tuple, list)):
            entries = [(ctx.layout(a), ctx.val(a)) for a in arg]
        else:
            return derived_size(ctx)
        for entry, value in entries:
            if not isinstance(value, int):
                return derived_size(ctx)
            out.append(entry if isinstance(entry, SizeLayout) else value)
    return tuple(out)


def size(ctx: OpContext) -> Layout:
    """``x.size()``, ``x.size(d)``, ``x.shape``: ints that follow the dims they read."""
    lay = ctx.tensor_layout(ctx.arg(0))
    d = ctx.val(ctx.arg(1, "dim", None))
    if d is None:
        return tuple(SizeLayout((dim,)) for dim in lay)
    return SizeLayout((lay[norm_dim(int(d), len(lay))],))


def numel(ctx: OpContext) -> Layout:
    lay = ctx.tensor_layout(ctx.arg(0))
    dims = [d for d in lay if not is_fixed(d)]
    return SizeLayout(dims, derived=True) if dims else None


def not_a_tensor(ctx: OpContext) -> Layout:
    """Sizes, dtypes, devices: nothing to propagate."""
    if isinstance(ctx.value, torch.Tensor):
        ctx.unsupported("expected a non-tensor result")
    return ctx.fixed()

