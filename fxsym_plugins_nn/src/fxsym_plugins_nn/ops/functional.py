"""The functional forms of the module families: ``F.linear``, ``F.conv*d``, ``F.embedding``, norms.

A subclass that overrides ``forward`` (a Linear with its own forward, timm's StdConv2d) is
traced into; there the family's weights arrive through ``get_attr``, possibly after
arithmetic. Each rule ties the weight's input dim to the input's and declares the weight's
output dim a producer (``ctx.produce``), so the group starts there as at the family's
OUTGOING symbol; biases and norm weights become members. Arithmetic before the op keeps a
group only where the other rules prove it: a reduction over the other dims of the weight with
``keepdim`` (weight standardisation per output channel), a broadcast against a per-row gain,
``batch_norm`` of ``weight.reshape(1, weight.shape[0], -1)`` in training mode, which
normalises each row over its own entries only. A norm's shape or number of groups must follow
the channels (read from the input's shape, or a module attribute tied to them), else the
channels are pinned.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from fxsym.analysis import (
    Dim,
    Layout,
    OpContext,
    Seg,
    SizeLayout,
    TensorLayout,
    fixed_dim,
    is_fixed,
    size_checked,
    tie_size,
)

from ..options import norm_groups
from .common import Rule, same_dim
from .pieces import cut_dim


def linear_fn(ctx: OpContext) -> Layout:
    """``F.linear(x, w, b)``: x's last dim meets w's input dim; the output dim is w's rows,
    produced there, and the bias's (cut alike where the bias is a concatenation)."""
    x, w = ctx.arg(0, "input"), ctx.arg(1, "weight")
    lx, lw = ctx.tensor_layout(x), ctx.tensor_layout(w)
    if len(lw) != 2:
        ctx.unsupported("linear weight of unexpected rank")
    ctx.unify(lx[-1], lw[-1])
    b = ctx.arg(2, "bias", None)
    out_dim = lw[0]
    ctx.produce(out_dim, w)  # before a cut: the blocks inherit the producer
    if isinstance(b, torch.fx.Node):
        out_dim = ctx.unify(*_cut_alike(ctx, out_dim, ctx.tensor_layout(b)[0]))
    return TensorLayout([*lx[:-1], out_dim])


def _cut_alike(ctx: OpContext, a: Dim, b: Dim) -> tuple[Dim, Dim]:
    """Two dims of the same entries (a weight's rows, and a bias concatenated from parts:
    timm's EVA ``F.linear(x, self.qkv.weight, torch.cat((q_bias, k_bias, v_bias)))``) cut at
    every segment boundary either has (:func:`.pieces.cut_dim`: a group crossing one is split
    into blocks there), so they can be tied segment by segment."""
    bounds = sorted({*itertools.accumulate(s.length for s in a),
                     *itertools.accumulate(s.length for s in b)})
    if len(bounds) == len(a) == len(b):
        return a, b
    sizes = [hi - lo for lo, hi in itertools.pairwise([0, *bounds])]
    a = tuple(itertools.chain.from_iterable(cut_dim(ctx, a, sizes)))
    b = tuple(itertools.chain.from_iterable(cut_dim(ctx, b, sizes)))
    return ctx.table.resolve(a), ctx.table.resolve(b)


def embedding_fn(ctx: OpContext) -> Layout:
    """``F.embedding(ids, w)``: the output's last dim is w's columns, produced there; the ids'
    dims are fixed. The ids pick w's rows by position, so the rows (the vocabulary) are
    pinned: were they tied to a group, permuting it would change which row each id reads."""
    idx, w = ctx.arg(0, "input"), ctx.arg(1, "weight")
    lw = ctx.tensor_layout(w)
    if len(lw) != 2:
        ctx.unsupported("embedding weight of unexpected rank")
    ctx.fix(lw[0], "embedding picks the weight's rows by position")
    ctx.produce(lw[1], w)
    return TensorLayout([*(fixed_dim(s) for s in ctx.shape(idx)), lw[1]])


def norm_fn(channel_dim: int | None, param_names: Sequence[tuple[int, str]]) -> Rule:
    """Functional norms: per-channel parameters meet the input's channel dim."""

    def rule(ctx: OpContext) -> Layout:
        x = ctx.arg(0, "input")
        lay = list(ctx.tensor_layout(x))
        if channel_dim is None:
            # a normalized shape written as numbers cannot follow a resize; sizes read from
            # the input (``x.shape[-1:]``) can, and so can module attributes
            # (``self.normalized_shape``), which are tied to the dims they normalize
            arg = ctx.arg(1, "normalized_shape")
            items = list(arg) if isinstance(arg, (tuple, list)) else [arg]
            shape = ctx.val(arg)
            shape = [shape] if isinstance(shape, int) else list(shape)
            sizes = ctx.layout(arg) if isinstance(arg, torch.fx.Node) else tuple(
                ctx.layout(a) for a in items)
            traced = _dims_read_directly(sizes, len(shape))
            for i, d in enumerate(lay[len(lay) - len(shape):]):
                if traced and tie_size(ctx, sizes[i], d):
                    continue
                if traced and same_dim(ctx, traced[i], d):
                    size_checked(ctx, sizes[i])
                elif not is_fixed(d):
                    ctx.fix(d, "layer_norm's normalized_shape is a literal")
            d = len(lay) - 1
        else:
            d = channel_dim
        for idx, pname in param_names:
            p = ctx.arg(idx, pname, None)
            if isinstance(p, torch.fx.Node):
                lay[d] = ctx.unify(lay[d], ctx.tensor_layout(p)[0])
        return TensorLayout(lay)

    return rule


def conv_fn(ctx: OpContext) -> Layout:
    """``F.conv1d/2d/3d(x, w, b)`` with one group: x's channels meet w's input channels; the
    output channels are w's rows, produced there; the kernel dims are fixed.

    A depthwise convolution (as many groups as input channels, one kernel per channel:
    ``w`` of shape ``[C, 1, *k]``, Mamba's ``F.conv1d(x, w.unsqueeze(1), groups=x.shape[1])``)
    passes the channels through: x's channels, w's rows and the bias are one dim, provided the
    number of groups follows the channels (:func:`_groups_follow_channels`); other grouped
    convolutions are unsupported."""
    x, w = ctx.arg(0, "input"), ctx.arg(1, "weight")
    lx, lw = ctx.tensor_layout(x), ctx.tensor_layout(w)
    batched = len(lx) == len(lw)
    c = 1 if batched else 0
    g_arg = ctx.arg(6, "groups", 1)
    groups = int(ctx.val(g_arg))
    if groups != 1:
        in_c, (rows, per_group) = ctx.shape(x)[c], ctx.shape(w)[:2]
        if not (groups == in_c == rows and per_group == 1):
            ctx.unsupported("functional grouped convolution")
        if not _groups_follow_channels(ctx, g_arg, lx[c]):
            ctx.fix(lx[c], "a depthwise convolution's number of groups is a number: it cannot "
                           "follow the channels kept")
        out_c = ctx.unify(lx[c], lw[0])
        b = ctx.arg(2, "bias", None)
        if isinstance(b, torch.fx.Node):
            out_c = ctx.unify(out_c, ctx.tensor_layout(b)[0])
        for k in lw[2:]:
            if not is_fixed(k):
                ctx.fix(k, "a convolution's kernel size")
        shape = ctx.out_shape()
        return TensorLayout([*lx[:c], out_c, *(fixed_dim(n) for n in shape[c + 1:])])
    ctx.unify(lx[c], lw[1])
    for k in lw[2:]:
        if not is_fixed(k):
            ctx.fix(k, "a convolution's kernel size")
    out_c = lw[0]
    b = ctx.arg(2, "bias", None)
    if isinstance(b, torch.fx.Node):
        out_c = ctx.unify(out_c, ctx.tensor_layout(b)[0])
    ctx.produce(out_c, w)
    shape = ctx.out_shape()
    dims = [*lx[:c], out_c, *(fixed_dim(n) for n in shape[c + 1:])]
    return TensorLayout(dims)


def _groups_follow_channels(ctx: OpContext, g_arg: Any, channels: Dim) -> bool:
    """Whether ``groups``, equal to the channels now, stays equal to them under every resize:
    a size read from the channels' dim, or a module attribute then tied to them."""
    if not isinstance(g_arg, torch.fx.Node):
        return is_fixed(channels)
    size = ctx.layout(g_arg)
    traced = _dims_read_directly((size,), 1)
    if traced and same_dim(ctx, traced[0], channels):
        size_checked(ctx, size)
        return True
    return tie_size(ctx, size, channels)


def _dims_read_directly(sizes: Any, n: int) -> list[Dim] | None:
    """The Dims ``n`` sizes follow if each was read directly from a shape, else ``None``."""
    if not isinstance(sizes, tuple) or len(sizes) != n:
        return None
    out: list[Dim] = []
    for item in sizes:
        if not isinstance(item, SizeLayout) or item.derived or len(item) != 1:
            return None
        out.append(item[0])
    return out


def group_norm_fn(ctx: OpContext) -> Layout:
    """``F.group_norm(x, G, w, b)`` normalises each run of ``C // G`` consecutive channels
    together, as ``nn.GroupNorm`` does: the channels change a whole run at a time
    (:meth:`OpContext.whole_units`) and ``G`` must follow the number of runs kept. It does
    when read from the input's shape (``G`` equal to the channels) or from a module attribute
    (``self.num_groups`` of a GroupNorm subclass traced into), which is then tied to the
    runs: a member of the channels' group set to the runs kept. ``G = 1`` keeps every channel
    order. Any other ``G`` (a number) cannot follow a resize and pins the channels.

    In an analysis with ``norm_groups="keep"`` the runs stay (:meth:`OpContext.runs_alike`):
    ``G`` needs no tie, a number is fine, and an attribute read stays as it is (pinned)."""
    x = ctx.arg(0, "input")
    lay = list(ctx.tensor_layout(x))
    g_arg = ctx.arg(1, "num_groups")
    groups = int(ctx.val(g_arg))
    if not is_fixed(lay[1]) and groups != 1:
        size = ctx.layout(g_arg)
        traced = _dims_read_directly((size,), 1)
        shape_read = groups == ctx.shape(x)[1] and traced and same_dim(ctx, traced[0], lay[1])
        if shape_read:
            size_checked(ctx, size)
        elif norm_groups() == "keep":
            ctx.runs_alike(lay[1], groups, "group_norm")
        elif ctx.whole_units(lay[1], groups, "group_norm"):
            channels = ctx.table.resolve(lay[1])
            if len(channels) != 1:
                ctx.fix(channels, "group_norm over a concatenation: num_groups is not tied")
            elif not tie_size(ctx, size, (Seg(channels[0].group, groups, 1),)):
                ctx.fix(lay[1], "group_norm's num_groups is a number: it cannot follow the "
                                "channels kept")
    for idx, pname in ((2, "weight"), (3, "bias")):
        p = ctx.arg(idx, pname, None)
        if isinstance(p, torch.fx.Node):
            lay[1] = ctx.unify(lay[1], ctx.tensor_layout(p)[0])
    return TensorLayout(lay)

