"""Op rules for torch functions, tensor methods and Python operators.

Each rule reads the input layouts from an :class:`fxsym.analysis.OpContext` and returns the
layout of the node's value. Where a mapping cannot be proven from the trace-time shapes the
rule raises through ``ctx.unsupported``: the node becomes a boundary, never a guess.

The rules live in one module per concern, each stating what it proves: :mod:`.elementwise`
(broadcasting), :mod:`.sizes` (ints read from shapes), :mod:`.creation` (new tensors),
:mod:`.order` (reductions and order-dependent ops), :mod:`.pieces` (concatenations and cuts),
:mod:`.linear_sizes` (sizes as linear forms in kept units), :mod:`.views` (reshape algebra),
:mod:`.slicing` (indexing and slice bounds), :mod:`.assign` (item assignment),
:mod:`.spatial` (pooling, padding, shuffles), :mod:`.contractions` (matmul, einsum,
attention), :mod:`.functional` (the module families' functional forms) and
:mod:`.positions` (values that are positions along a dim: a router's picks and what reads
by them). :func:`register_op_rules` is the table: which rule
each target gets (a target registered twice keeps the later rule).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from fxsym.plugins.contracts import OpRuleRegistrar

from .assign import setitem
from .common import OpTarget, Rule
from .contractions import add_matmul, einsum, matmul, sdpa, solve_triangular
from .creation import constant_fill, creation, like_fill
from .elementwise import (
    ELEMENTWISE_FUNCS,
    ELEMENTWISE_METHODS,
    UNARY_FUNCS,
    UNARY_METHODS,
    elementwise,
    same_as_input,
)
from .functional import conv_fn, embedding_fn, group_norm_fn, linear_fn, norm_fn
from .order import reduce_rule, reduction, register_order_rules
from .pieces import concat, split, stack
from .positions import register_position_rules
from .sizes import not_a_tensor, numel, size
from .slicing import getattr_rule, getitem
from .spatial import interpolate, pad, patch_merging_pad, pixel_shuffle, trailing_spatial
from .views import (
    expand,
    flatten,
    matrix_transpose,
    permute,
    squeeze,
    transpose,
    unflatten,
    unsqueeze,
    view,
    view_as,
    view_as_complex,
    view_as_real,
)


def register_op_rules(register: OpRuleRegistrar) -> None:
    """Register every rule of this package with fxsym (called from the plugin hook): the
    table, then :mod:`.positions` over it (its rules wrap or fall back to the table's)."""
    rules: dict[Any, Rule] = {}

    def keep(target: Any, rule: Rule) -> None:
        rules[target] = rule
        register(target, rule)

    _register_table(keep)
    register_position_rules(register, rules)


def _register_table(register: Callable[[Any, Rule], None]) -> None:
    t: OpTarget
    for f in ELEMENTWISE_FUNCS:
        register(f, elementwise)
    for m in ELEMENTWISE_METHODS:
        register(m, elementwise)
    for f in dict.fromkeys(UNARY_FUNCS):
        register(f, same_as_input)
    for m in dict.fromkeys(UNARY_METHODS):
        register(m, same_as_input)
    for t in (torch.sum, torch.mean, torch.amax, torch.amin, torch.prod, torch.logsumexp,
              torch.all, torch.any, torch.nansum, torch.nanmean, "sum", "mean", "amax", "amin",
              "prod", "logsumexp", "all", "any", "nansum", "nanmean"):
        register(t, reduction)
    register_order_rules(register)
    register(torch.cat, concat)
    register(torch.concat, concat)
    register(torch.concatenate, concat)
    register(torch.stack, stack)
    for t in (torch.split, torch.chunk, torch.unbind, torch.split_with_sizes, "split",
              "split_with_sizes", "chunk", "unbind"):
        register(t, split)
    for t in ("view", "reshape", torch.reshape):
        register(t, view)
    for t in (torch.flatten, "flatten"):
        register(t, flatten)
    for t in ("unflatten", torch.unflatten):
        register(t, unflatten)
    for t in ("view_as", "reshape_as"):
        register(t, view_as)
    register(torch.view_as_complex, view_as_complex)
    register(torch.view_as_real, view_as_real)
    for t in (torch.permute, "permute"):
        register(t, permute)
    for t in (torch.transpose, "transpose", torch.swapaxes, "swapaxes", "swapdims"):
        register(t, transpose)
    for t in (torch.t, "t"):
        register(t, matrix_transpose)
    for t in (torch.unsqueeze, "unsqueeze"):
        register(t, unsqueeze)
    for t in (torch.squeeze, "squeeze"):
        register(t, squeeze)
    for t in ("expand", "expand_as", "repeat", torch.broadcast_to, "broadcast_to"):
        register(t, expand)
    register("size", size)
    for t in ("numel", "nelement", torch.numel):
        register(t, numel)
    for t in ("dim", "element_size", "is_contiguous",
              "is_floating_point", "tolist", "item", operator.not_, operator.is_,
              operator.is_not, len, isinstance, math.prod):
        register(t, not_a_tensor)
    for t in (torch.rand, torch.randn, torch.tensor, torch.rand_like,
              torch.randn_like, "new_tensor", "bernoulli_", "uniform_", "normal_",
              "bernoulli", torch.bernoulli):
        register(t, creation)
    for t in (torch.zeros, torch.ones, torch.full, torch.empty, "new_zeros", "new_ones",
              "new_full", "new_empty"):
        register(t, constant_fill)
    for t in (torch.zeros_like, torch.ones_like, torch.full_like, torch.empty_like):
        register(t, like_fill)
    for k, fs in {
        1: (F.max_pool1d, F.avg_pool1d, F.adaptive_avg_pool1d, F.adaptive_max_pool1d,
            F.lp_pool1d),
        2: (F.max_pool2d, F.avg_pool2d, F.adaptive_avg_pool2d, F.adaptive_max_pool2d,
            F.lp_pool2d, F.max_pool2d_with_indices, torch.max_pool2d, torch.avg_pool1d,
            torch._C._nn.avg_pool2d, torch._C._nn.adaptive_avg_pool2d),
        3: (F.max_pool3d, F.avg_pool3d, F.adaptive_avg_pool3d, F.adaptive_max_pool3d),
    }.items():
        for f in fs:
            register(f, trailing_spatial(k, window=True))
    register(F.interpolate, interpolate)
    register(F.pad, pad)
    # stochastic depth drops whole samples: channels pass through
    register("torchvision.ops.stochastic_depth.stochastic_depth", same_as_input)
    register("torchvision.models.swin_transformer._patch_merging_pad", patch_merging_pad)
    register(operator.getitem, getitem)
    register(operator.setitem, setitem)
    register(getattr, getattr_rule)
    register(F.linear, linear_fn)
    register(F.embedding, embedding_fn)
    for t in (torch.var_mean, torch.std_mean):  # (var, mean): both reduce the same dims
        register(t, reduce_rule(keepdim_at=3))
    for t in (torch.matmul, operator.matmul, torch.bmm, torch.mm, "matmul", "bmm", "mm",
              "__matmul__"):
        register(t, matmul)
    for t in (torch.addmm, torch.baddbmm, "addmm", "baddbmm"):
        register(t, add_matmul)
    register(torch.einsum, einsum)
    register(torch.linalg.solve_triangular, solve_triangular)
    for t in (F.conv1d, F.conv2d, F.conv3d):
        register(t, conv_fn)
    for t in (F.pixel_shuffle, F.pixel_unshuffle, torch.pixel_shuffle, torch.pixel_unshuffle):
        register(t, pixel_shuffle)
    register(F.scaled_dot_product_attention, sdpa)
    register(F.layer_norm, norm_fn(None, [(2, "weight"), (3, "bias")]))
    register(F.batch_norm, norm_fn(1, [(1, "running_mean"), (2, "running_var"),
                                       (3, "weight"), (4, "bias")]))
    register(F.group_norm, group_norm_fn)
    register(F.instance_norm, norm_fn(1, [(1, "running_mean"), (2, "running_var"),
                                          (3, "weight"), (4, "bias")]))


__all__ = ["register_op_rules"]

