"""Elementwise ops and broadcasting: the operands' dims of equal size are one dim.

Operands aligned from the right: every dim whose size equals the output's is tied across
the operands (a permutation or a shrink of one applies to all); a size-1 dim broadcast
against a larger one, or an elastic dim against a fixed one, is pinned. Dims laid out
differently (a group concatenated with its depthwise copy, ``[A, A]``, against one group
``H``) are first cut at each other's segment boundaries (:func:`align_segments`), so they tie
block by block (``H``'s halves are both ``A``). Unary ops (and
casts, dropout, clones) keep the input's layout where the output's shape is the input's.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from fxsym.analysis import (
    Dim,
    Layout,
    OpContext,
    TensorLayout,
    Unsupported,
    fixed_dim,
    is_fixed,
)

from .common import tensor_args
from .pieces import cut_dim
from .sizes import derived_size, joined_shape


def broadcast_layouts(ctx: OpContext, layouts: Sequence[TensorLayout],
                      shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...]
                      ) -> TensorLayout:
    """Align layouts from the right; tie every dim whose size equals the output's."""
    n = len(out_shape)
    dims: list[Dim] = []
    for i in range(n):
        size = out_shape[i]
        candidates: list[Dim] = []
        for lay, shape in zip(layouts, shapes):
            j = i - (n - len(shape))
            if j < 0:
                continue
            if shape[j] == size:
                candidates.append(lay[j])
            elif shape[j] != 1:
                ctx.unsupported(f"cannot broadcast {shape} to {out_shape}")
            elif not is_fixed(lay[j]):  # a size-1 group broadcast: it must stay 1
                ctx.fix(lay[j], "broadcast against a larger dim")
        if size == 1 or not candidates:
            for c in candidates:
                if not is_fixed(c) and size != 1:
                    ctx.fix(c, "broadcast")
            dims.append(candidates[0] if candidates and size == 1 else fixed_dim(size))
            continue
        dims.append(ctx.unify(*align_segments(ctx, candidates)))
    return TensorLayout(dims)


def align_segments(ctx: OpContext, dims: Sequence[Dim]) -> list[Dim]:
    """Dims of one size cut at every segment boundary any of them has (:func:`cut_dim`: a
    group crossing a boundary is split into blocks there, for every dim that holds it), so
    :meth:`OpContext.unify` ties them segment by segment instead of pinning them for their
    different structure. Left as they are where a boundary falls inside a unit of a group or
    a group cannot be cut (``unify`` then pins them, as before)."""
    table = ctx.table
    for _ in range(8):  # cutting a group changes every dim that holds it
        dims = [table.resolve(d) for d in dims]
        ends = [set(itertools.accumulate(s.length for s in d)) for d in dims]
        bounds = sorted(set().union(*ends))
        if all(e == set(bounds) for e in ends):
            break
        sizes = [hi - lo for lo, hi in itertools.pairwise([0, *bounds])]
        try:
            dims = [tuple(itertools.chain.from_iterable(cut_dim(ctx, d, sizes)))
                    for d in dims]
        except Unsupported:
            break
    return [table.resolve(d) for d in dims]


def elementwise(ctx: OpContext) -> Layout:
    """Any number of tensor operands broadcast together (``a + b``, ``torch.where``...)."""
    args = tensor_args(ctx)
    if not isinstance(ctx.value, torch.Tensor):
        if ctx.node.target is operator.add and isinstance(ctx.value, tuple):
            return joined_shape(ctx)
        return derived_size(ctx)
    if not args:
        return ctx.fixed()
    return broadcast_layouts(ctx, [ctx.tensor_layout(a) for a in args],
                             [ctx.shape(a) for a in args], ctx.out_shape())


def same_as_input(ctx: OpContext) -> Layout:
    """The value has the layout of the first argument (activations, dropout, casts, clones)."""
    x = ctx.arg(0, "input")
    lay = ctx.layout(x)
    if not isinstance(lay, TensorLayout):
        return ctx.fixed()
    if ctx.shape(x) != ctx.out_shape():
        ctx.unsupported("expected the output shape to equal the input shape")
    if ctx.node.target in ("type_as", "to"):  # x.type_as(y): only y's dtype/device is read
        return lay
    for other in tensor_args(ctx)[1:]:
        if other is not x:
            ctx.fix(ctx.layout(other), "extra tensor operand")
    return lay


ELEMENTWISE_FUNCS: list[Any] = [
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
    operator.pow, operator.mod, operator.iadd, operator.isub, operator.imul, operator.itruediv,
    operator.and_, operator.or_, operator.xor, operator.eq, operator.ne, operator.lt,
    operator.le, operator.gt, operator.ge,
    torch.add, torch.sub, torch.mul, torch.div, torch.true_divide, torch.pow, torch.float_power,
    torch.maximum, torch.minimum, torch.eq, torch.ne, torch.lt, torch.gt, torch.le, torch.ge,
    torch.logical_and, torch.logical_or, torch.lerp, torch.addcmul, torch.addcdiv,
    torch.masked_fill, torch.fmod, torch.remainder, torch.atan2, torch.hypot, torch.polar,
]


ELEMENTWISE_METHODS = [
    "add", "sub", "mul", "div", "true_divide", "pow", "float_power", "maximum", "minimum",
    "masked_fill", "add_", "sub_", "mul_", "div_", "pow_", "masked_fill_", "eq", "ne", "lt",
    "gt", "le", "ge", "where", "lerp", "addcmul", "addcdiv", "addcmul_", "addcdiv_", "fmod",
    "remainder", "copy_",
    "__add__", "__mul__", "__sub__", "__truediv__", "__radd__", "__rmul__",
]


UNARY_FUNCS: list[Any] = [
    operator.neg, operator.pos, operator.invert, abs,
    torch.relu, torch.relu_, torch.sigmoid, torch.tanh, torch.exp, torch.log, torch.sqrt,
    torch.rsqrt, torch.abs, torch.neg, torch.sin, torch.cos, torch.erf, torch.clamp,
    torch.clip, torch.sign, torch.square, torch.reciprocal, torch.log1p, torch.expm1,
    torch.floor, torch.ceil, torch.round, torch.trunc, torch.isnan, torch.isinf,
    torch.logical_not, torch.nan_to_num, torch.clone, torch.detach, torch.softmax,
    torch.log_softmax, torch.dropout, torch.alpha_dropout, torch.feature_dropout,
    F.relu, F.relu_, F.relu6, F.elu, F.selu, F.celu, F.leaky_relu, F.leaky_relu_, F.gelu,
    F.silu, F.mish, F.hardswish, F.hardsigmoid, F.hardtanh, F.hardtanh_, F.sigmoid, F.tanh,
    F.softplus, F.softsign, F.tanhshrink, F.logsigmoid, F.threshold, F.rrelu, F.dropout,
    F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout,
    F.feature_alpha_dropout, F.softmax, F.log_softmax, F.softmin, F.normalize,
]


UNARY_METHODS = [
    "relu", "relu_", "sigmoid", "sigmoid_", "tanh", "tanh_", "exp", "log", "sqrt", "rsqrt",
    "abs", "neg", "sin", "cos", "erf", "clamp", "clamp_", "clamp_min", "clamp_max", "clip",
    "sign", "square", "reciprocal", "floor", "ceil", "round", "float", "double", "half",
    "bfloat16", "int", "long", "bool", "to", "type", "type_as", "contiguous", "clone",
    "detach", "detach_", "cpu", "cuda", "softmax", "log_softmax",
    "nan_to_num", "requires_grad_", "exp_", "log_", "sqrt_", "fill_", "zero_",
    "hardtanh_", "clamp_min_", "abs_", "neg_", "logical_not", "isnan", "isinf", "pin_memory",
    "erf_", "square_",
]

