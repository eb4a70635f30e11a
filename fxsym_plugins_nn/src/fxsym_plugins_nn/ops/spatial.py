"""Pooling, interpolation, padding and pixel shuffles: the spatial dims end, channels pass.

The pooled, interpolated or padded dims are fixed (an elastic one is pinned); the dims before
them pass through. A pixel shuffle makes ``r*r`` consecutive channels one (coarser units of the
channels' group); an unshuffle makes each channel ``r*r`` consecutive ones (a longer block).
"""

from __future__ import annotations

from fxsym.analysis import (
    Layout,
    OpContext,
    Seg,
    TensorLayout,
    concat_dims,
    fixed_dim,
    is_fixed,
)

from .common import Rule


def trailing_spatial(k: int) -> Rule:
    """Pooling, interpolation and padding over the last ``k`` dims: leading dims pass through."""

    def rule(ctx: OpContext) -> Layout:
        x = ctx.arg(0, "input")
        lay = ctx.tensor_layout(x)
        out_shape = ctx.out_shape()
        if len(out_shape) != len(lay):
            ctx.unsupported("pooling changed the rank")
        dims = list(lay[: len(lay) - k])
        for d in lay[len(lay) - k:]:
            if not is_fixed(d):
                ctx.fix(d, "pooled over an elastic dim")
        dims += [fixed_dim(s) for s in out_shape[len(lay) - k:]]
        res = TensorLayout(dims)
        if isinstance(ctx.value, tuple):  # return_indices=True
            return tuple(res for _ in ctx.value)
        return res

    return rule


def pad(ctx: OpContext) -> Layout:
    x = ctx.arg(0, "input")
    lay = ctx.tensor_layout(x)
    padding = ctx.val(ctx.arg(1, "pad"))
    k = len(padding) // 2
    padded = [len(lay) - 1 - i for i in range(k) if padding[2 * i] or padding[2 * i + 1]]
    dims = list(lay)
    out_shape = ctx.out_shape()
    for i in padded:
        if not is_fixed(dims[i]):
            ctx.fix(dims[i], "padding an elastic dim")
        dims[i] = fixed_dim(out_shape[i])
    return TensorLayout(dims)


def pixel_shuffle(ctx: OpContext) -> Layout:
    """``pixel_shuffle``: r*r consecutive channels become one channel (coarser units);
    ``pixel_unshuffle``: each channel becomes r*r consecutive ones (a longer block)."""
    x = ctx.arg(0, "input")
    lay = list(ctx.tensor_layout(x))
    c = len(lay) - 3
    seg_dim = lay[c]
    out_shape = ctx.out_shape()
    dims = [*lay[:c], fixed_dim(out_shape[c]), *(fixed_dim(n) for n in out_shape[c + 1:])]
    if is_fixed(seg_dim):
        return TensorLayout(dims)
    if len(seg_dim) != 1:
        ctx.unsupported("pixel shuffle of concatenated groups")
    seg = seg_dim[0]
    assert seg.group is not None
    if out_shape[c] > seg.length:  # unshuffle
        dims[c] = (Seg(seg.group, seg.units, seg.block * out_shape[c] // seg.length),)
    elif seg.block == 1 and seg.units % out_shape[c] == 0:
        ctx.table.constrain(seg.group, out_shape[c])
        dims[c] = (Seg(seg.group, out_shape[c], 1),)
    else:
        ctx.unsupported("pixel shuffle within a unit")
    return TensorLayout(dims)


def patch_merging_pad(ctx: OpContext) -> Layout:
    """torchvision's Swin ``_patch_merging_pad``: 2x2 neighbours concatenated on channels."""
    lay = ctx.tensor_layout(ctx.arg(0, "x"))
    shape = ctx.out_shape()
    return TensorLayout([*lay[:-3], fixed_dim(shape[-3]), fixed_dim(shape[-2]),
                         concat_dims([lay[-1]] * 4)])


def interpolate(ctx: OpContext) -> Layout:
    x = ctx.arg(0, "input")
    return trailing_spatial(len(ctx.shape(x)) - 2)(ctx)

