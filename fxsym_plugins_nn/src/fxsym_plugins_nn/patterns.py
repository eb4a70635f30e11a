"""Graph-rewrite patterns and op knowledge of the torch.nn families, for ``fxsym.optimize``.

Contributed through ``fxsym_register_patterns`` (see :func:`register_patterns`):

* module semantics — ``nn.Identity`` and dropout in eval mode are identities (for the no-op
  pass); convolutions, linear layers, norms, activations and pools return fresh tensors (so
  the in-place pass may rewrite a write into their output);
* aliases — ``nn.Sigmoid``/``nn.Tanh`` compute ``torch.sigmoid``/``torch.tanh``;
* ``fold_conv_bn`` / ``fold_linear_bn`` — a BatchNorm in eval mode folded into the
  convolution or linear layer before it. Only when the BatchNorm's input is used by nothing
  else, and only in eval mode (training-mode BatchNorm normalizes with batch statistics).
  The folded layer is a new module holding new parameters: the user's modules are untouched;
* ``log_softmax`` — ``log(softmax(x, d))`` → ``log_softmax(x, d)`` (more stable);
* ``einsum_outer_sum`` — a ``sum`` over the product of broadcast operands (an outer product
  built with ``unsqueeze``/``None`` indexing) → one ``einsum`` that never materializes the
  product; needs shapes (example inputs);
* ``silu`` — ``x * sigmoid(x)`` → ``silu(x)``;
* ``gelu_tanh`` — the tanh approximation of GELU written out by hand →
  ``gelu(x, approximate="tanh")``.
"""

from __future__ import annotations

import copy
import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.utils import parametrize

from fxsym.passes import (
    ChainPattern,
    Match,
    ModuleSemantics,
    OpAlias,
    RewriteContext,
    Step,
    SubgraphPattern,
    get_arg,
)
from fxsym.plugins.contracts import PatternRegistrar

__all__ = ["PATTERNS", "register_patterns"]


# -- module semantics and aliases ---------------------------------------------------------------
def _eval_mode(module: nn.Module) -> bool:
    return not module.training


def _train_mode(module: nn.Module) -> bool:
    return module.training


_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
             nn.FeatureAlphaDropout)
_FRESH = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
    nn.ConvTranspose3d, nn.Linear, nn.Bilinear, nn.BatchNorm1d, nn.BatchNorm2d,
    nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm, nn.InstanceNorm1d, nn.InstanceNorm2d,
    nn.InstanceNorm3d, nn.Embedding, nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh,
    nn.Hardswish, nn.Hardsigmoid, nn.LeakyReLU, nn.ELU, nn.Mish, nn.Softmax, nn.LogSoftmax,
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool2d,
)


def semantics() -> list[Any]:
    items: list[Any] = [ModuleSemantics(nn.Identity, identity=True)]
    items += [ModuleSemantics(cls, identity=_eval_mode, fresh=_train_mode) for cls in _DROPOUTS]
    items += [ModuleSemantics(cls, fresh=True) for cls in _FRESH]
    items += [
        OpAlias(torch.sigmoid, (nn.Sigmoid,), name="alias:nn.Sigmoid"),
        OpAlias(torch.tanh, (nn.Tanh,), name="alias:nn.Tanh"),
    ]
    return items


# -- BatchNorm folding --------------------------------------------------------------------------
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_FOLDABLE = (nn.Linear, *_CONVS)
BatchNorm = nn.BatchNorm1d | nn.BatchNorm2d | nn.BatchNorm3d
Foldable = nn.Linear | nn.Conv1d | nn.Conv2d | nn.Conv3d


def _bn_ready(node: fx.Node, ctx: RewriteContext) -> bool:
    bn = ctx.module(node)
    return (
        len(node.args) == 1
        and not node.kwargs
        and not bn.training
        and bn.running_mean is not None
        and bn.running_var is not None
        and not _has_hooks(bn)
    )


def _has_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks) or parametrize.is_parametrized(
        module
    )


def _fold_scale(bn: BatchNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift) with ``bn(y) == y * scale + shift`` per channel, in float64."""
    assert bn.running_var is not None and bn.running_mean is not None  # see _bn_ready
    var = bn.running_var.detach().double()
    mean = bn.running_mean.detach().double()
    gamma = bn.weight.detach().double() if bn.weight is not None else torch.ones_like(var)
    beta = bn.bias.detach().double() if bn.bias is not None else torch.zeros_like(var)
    scale = gamma / torch.sqrt(var + bn.eps)
    return scale, beta - mean * scale


def _fused_copy(layer: Foldable, weight: torch.Tensor, bias: torch.Tensor) -> nn.Module:
    fused = copy.copy(layer)
    fused._parameters = dict(layer._parameters)
    fused._buffers = dict(layer._buffers)
    fused._modules = dict(layer._modules)
    w = layer.weight
    fused.weight = nn.Parameter(weight.to(w.dtype), requires_grad=w.requires_grad)
    fused.bias = nn.Parameter(bias.to(w.dtype), requires_grad=w.requires_grad)
    return fused


def _fold(match: Match, ctx: RewriteContext, layer_name: str, channel_dim: int) -> fx.Node | None:
    layer_node, bn_node = match[layer_name], match["bn"]
    layer, bn = ctx.module(layer_node), ctx.module(bn_node)
    if not isinstance(layer, _FOLDABLE) or not isinstance(bn, _BATCHNORMS):  # see the steps
        return None
    if _has_hooks(layer) or layer.weight.shape[channel_dim] != bn.num_features:
        return None
    scale, shift = _fold_scale(bn)
    w = layer.weight.detach().double()
    view = [1] * w.dim()
    view[channel_dim] = -1
    weight = w * scale.reshape(view)
    old_bias = layer.bias.detach().double() if layer.bias is not None else torch.zeros_like(scale)
    bias = old_bias * scale + shift
    fused = _fused_copy(layer, weight, bias)
    target = str(layer_node.target)
    if ctx.call_sites(target) == 1:
        ctx.replace_module(target, fused)
    else:
        target = ctx.add_module(f"{target}_bn_fused", fused)
    return ctx.graph.call_module(target, layer_node.args, dict(layer_node.kwargs))


def _same_rank(match: Match, ctx: RewriteContext) -> bool:
    conv, bn = ctx.module(match["conv"]), ctx.module(match["bn"])
    ranks: dict[type | None, type] = {
        nn.Conv1d: nn.BatchNorm1d, nn.Conv2d: nn.BatchNorm2d, nn.Conv3d: nn.BatchNorm3d}
    return ranks.get(_base(conv, _CONVS)) is _base(bn, _BATCHNORMS)


def _base(module: nn.Module, classes: tuple[type, ...]) -> type | None:
    return next((c for c in classes if isinstance(module, c)), None)


def _linear_2d(match: Match, ctx: RewriteContext) -> bool:
    shape = ctx.shape(match["linear"])
    return shape is not None and len(shape) == 2


FOLD_CONV_BN = ChainPattern(
    "fold_conv_bn",
    [
        Step(*_CONVS, name="conv"),
        Step(*_BATCHNORMS, name="bn", where=_bn_ready),
    ],
    lambda m, ctx: _fold(m, ctx, "conv", 0),
    where=_same_rank,
    description="fold an eval-mode BatchNorm into the convolution before it",
)

FOLD_LINEAR_BN = ChainPattern(
    "fold_linear_bn",
    [Step(nn.Linear, name="linear"), Step(nn.BatchNorm1d, name="bn", where=_bn_ready)],
    lambda m, ctx: _fold(m, ctx, "linear", 0),
    where=_linear_2d,
    description="fold an eval-mode BatchNorm1d into the Linear before it (2-D input only)",
)


# -- log(softmax) -------------------------------------------------------------------------------
def _log_softmax(match: Match, ctx: RewriteContext) -> fx.Node | None:
    sm = match["softmax"]
    if sm.op == "call_module":
        dim, dtype = getattr(ctx.module(sm), "dim", None), None
    else:
        if len(sm.args) > 2:
            return None
        dim, dtype = get_arg(sm, 1, "dim"), sm.kwargs.get("dtype")
    if dim is None or any(k not in ("dim", "dtype", "input", "_stacklevel") for k in sm.kwargs):
        return None
    kwargs = {"dtype": dtype} if dtype is not None else {}
    return ctx.graph.call_function(torch.log_softmax, (match["input"], dim), kwargs)


LOG_SOFTMAX = ChainPattern(
    "log_softmax",
    [Step(torch.softmax, nn.Softmax, name="softmax"), Step(torch.log, name="log")],
    _log_softmax,
    description="log(softmax(x)) -> log_softmax(x)",
)


# -- sum over an outer product -> einsum --------------------------------------------------------
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _expansion(value: Any, ctx: RewriteContext) -> tuple[Any, list[int | None], fx.Node | None]:
    """(base, map operand dim -> base dim or None if inserted, the expanding node or None)."""
    shape = ctx.shape(value)
    if not isinstance(value, fx.Node):
        return value, [], None
    keys = set(ctx.keys(value))
    if ("call_function", torch.unsqueeze) in keys and len(value.users) == 1:
        base = get_arg(value, 0, "input")
        dim = get_arg(value, 1, "dim")
        base_shape = ctx.shape(base)
        if base_shape is not None and isinstance(dim, int):
            rank = len(base_shape) + 1
            dim = dim + rank if dim < 0 else dim
            dims: list[int | None] = list(range(len(base_shape)))
            dims.insert(dim, None)
            return base, dims, value
    if value.op == "call_function" and value.target is operator.getitem:
        base, index = value.args
        base_shape = ctx.shape(base)
        items = index if isinstance(index, tuple) else (index,)
        if base_shape is not None and len(value.users) == 1 and _only_none_and_full(items):
            mapped = _index_map(items, len(base_shape))
            if mapped is not None:
                return base, mapped, value
    if shape is None:
        return value, [], None
    return value, list(range(len(shape))), None


def _only_none_and_full(items: tuple[Any, ...]) -> bool:
    return any(i is None for i in items) and all(
        i is None or i is Ellipsis or (isinstance(i, slice) and i == slice(None)) for i in items
    )


def _index_map(items: tuple[Any, ...], rank: int) -> list[int | None] | None:
    consumed = sum(1 for i in items if isinstance(i, slice))
    if consumed > rank or sum(1 for i in items if i is Ellipsis) > 1:
        return None
    out: list[int | None] = []
    d = 0
    for item in items:
        if item is None:
            out.append(None)
        elif item is Ellipsis:
            for _ in range(rank - consumed):
                out.append(d)
                d += 1
        else:
            out.append(d)
            d += 1
    out += list(range(d, rank))
    return out


def _einsum_plan(match: Match, ctx: RewriteContext) -> bool:
    mul, total = match["mul"], match["sum"]
    if len(mul.args) != 2 or mul.kwargs:
        return False
    dims = get_arg(total, 1, "dim")
    if get_arg(total, 2, "keepdim", False) or total.kwargs.get("dtype") is not None:
        return False
    if len(total.args) > 2 or any(k not in ("dim", "keepdim", "input") for k in total.kwargs):
        return False
    operands = [_expansion(a, ctx) for a in mul.args]
    if any(not maps for _, maps, _ in operands) or all(e is None for _, _, e in operands):
        return False
    rank = max(len(maps) for _, maps, _ in operands)
    if rank > len(_LETTERS):
        return False
    if dims is None:
        summed = set(range(rank))
    else:
        raw = dims if isinstance(dims, (tuple, list)) else (dims,)
        if not all(isinstance(d, int) for d in raw):
            return False
        summed = {d + rank if d < 0 else d for d in raw}
    subscripts = []
    for base, maps, _ in operands:
        shift = rank - len(maps)
        base_rank = sum(1 for m in maps if m is not None)
        letters = [""] * base_rank
        for i, m in enumerate(maps):
            if m is not None:
                letters[m] = _LETTERS[i + shift]
        if not isinstance(base, fx.Node):
            return False
        subscripts.append("".join(letters))
    out = "".join(_LETTERS[d] for d in range(rank) if d not in summed)
    match.bindings["equation"] = f"{subscripts[0]},{subscripts[1]}->{out}"
    match.bindings["operands"] = (operands[0][0], operands[1][0])
    expanded = tuple(e for _, _, e in operands if e is not None)
    match.nodes = expanded + match.nodes
    return True


def _einsum(match: Match, ctx: RewriteContext) -> fx.Node:
    a, b = match["operands"]
    return ctx.graph.call_function(torch.einsum, (match["equation"], a, b))


EINSUM_OUTER_SUM = ChainPattern(
    "einsum_outer_sum",
    [Step("mul", name="mul"), Step(torch.sum, name="sum")],
    _einsum,
    where=_einsum_plan,
    description="sum over an outer product -> einsum (needs shapes)",
)


# -- activations written by hand ----------------------------------------------------------------
SILU = SubgraphPattern(
    "silu",
    lambda x: x * torch.sigmoid(x),
    lambda x: F.silu(x),
    description="x * sigmoid(x) -> silu(x)",
)

_C = math.sqrt(2.0 / math.pi)


def _gelu_variants() -> list[Callable[[Any], Any]]:
    def pow3(x: Any) -> Any:
        return 0.5 * x * (1.0 + torch.tanh(_C * (x + 0.044715 * torch.pow(x, 3.0))))

    def cube(x: Any) -> Any:
        return 0.5 * x * (1.0 + torch.tanh(_C * (x + 0.044715 * x * x * x)))

    def grouped(x: Any) -> Any:
        return 0.5 * (x * (1.0 + torch.tanh(_C * (x + 0.044715 * torch.pow(x, 3.0)))))

    def grouped_cube(x: Any) -> Any:
        return 0.5 * (x * (1.0 + torch.tanh(_C * (x + 0.044715 * x * x * x))))

    return [pow3, cube, grouped, grouped_cube]


GELU_TANH = SubgraphPattern(
    "gelu_tanh",
    _gelu_variants(),
    lambda x: F.gelu(x, approximate="tanh"),
    description="0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))) -> gelu(x, approximate='tanh')",
)

PATTERNS = [FOLD_CONV_BN, FOLD_LINEAR_BN, LOG_SOFTMAX, EINSUM_OUTER_SUM, SILU, GELU_TANH]


def register_patterns(register: PatternRegistrar) -> None:
    """Body of the nn plugin's ``fxsym_register_patterns`` hook."""
    for item in semantics():
        register(item)
    for pattern in PATTERNS:
        register(pattern)
