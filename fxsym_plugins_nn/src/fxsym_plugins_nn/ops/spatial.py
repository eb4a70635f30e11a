"""Pooling, interpolation, padding and pixel shuffles: the spatial dims end, channels pass.

The pooled, interpolated or padded dims are fixed (an elastic one is pinned); the dims before
them pass through. A pooling window read from module attributes sizes no tensor dim: it is
pinned, never the channels, and said in a detail of the report. A pixel shuffle makes ``r*r``
consecutive channels one (coarser units of the channels' group); an unshuffle makes each
channel ``r*r`` consecutive ones (a longer block).
"""

from __future__ import annotations

from typing import Any

from fxsym.analysis import (
    Layout,
    OpContext,
    Seg,
    SizeLayout,
    TensorLayout,
    concat_dims,
    fixed_dim,
    is_fixed,
    size_checked,
)

from .common import Rule, of_attributes_only


def trailing_spatial(k: int, *, window: bool = False) -> Rule:
    """Pooling, interpolation and padding over the last ``k`` dims: leading dims pass through.

    With ``window`` (a pooling), the ints after the input set the window (kernel, stride,
    padding, dilation, output size) over the spatial dims: see :func:`_window_sizes`."""

    def rule(ctx: OpContext) -> Layout:
        x = ctx.arg(0, "input")
        if window:
            _window_sizes(ctx, x)
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


def _window_sizes(ctx: OpContext, x: Any) -> None:
    """Pin the sizes read from module attributes only (``nn.MaxPool2d``'s ``kernel_size``,
    ``self.k // 2``) that set a pooling's window: they size no tensor dim, the spatial dims
    they act on are fixed, and no channel is touched, so the line is a detail of the report
    whatever sizes the tensors happen to have. A size that also reads a tensor's dim, or whose
    group holds anything but attributes, is left to the analyzer's check of unmapped sizes."""
    for a in ctx.node.all_input_nodes:
        if a is x:
            continue
        lay = ctx.layout(a)
        entries = lay if isinstance(lay, tuple) and not isinstance(lay, SizeLayout) else (lay,)
        for size in entries:
            if not isinstance(size, SizeLayout):
                continue
            if of_attributes_only(ctx, size):
                ctx.analyzer.fix(size, "a pooling window read from a module attribute sizes no "
                                 "tensor dim: it keeps its value", ctx.node,
                                 sizes_no_tensor=True)
                size_checked(ctx, size)


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

