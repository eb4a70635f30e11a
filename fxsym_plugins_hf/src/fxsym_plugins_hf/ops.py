"""Op rules for the calls a traced transformers model adds to the graph.

* the mask leaves of :mod:`.masks`: a mask depends only on the shapes of its inputs, so no
  group is touched and the mask's own layout is fixed;
* ``torch.nn.functional.embedding`` (an ``nn.Embedding`` subclass with its own ``forward``,
  such as OPT's learned positions, is traced through to it): the output's last dimension is
  the weight's columns, so the weight becomes a parameter member of the hidden-size group;
  the indices' dimensions are fixed. The indices pick the weight's rows by position, so the
  rows (the vocabulary) are pinned: were they tied to a group (a tied output projection
  whose logits end in a reduction), permuting that group would change which row each id
  reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn.functional as F

from fxsym.analysis import Layout, OpContext, TensorLayout, fixed_dim

from .masks import MASK_LEAF_NAME


def mask_leaf(ctx: OpContext) -> Layout:
    return ctx.fixed()


def embedding(ctx: OpContext) -> Layout:
    idx, weight = ctx.arg(0, "input"), ctx.arg(1, "weight")
    lw = ctx.tensor_layout(weight)
    if len(lw) != 2:
        ctx.unsupported("embedding weight of unexpected rank")
    ctx.fix(lw[0], "embedding picks the weight's rows by position")
    return TensorLayout([*(fixed_dim(s) for s in ctx.shape(idx)), lw[1]])


def register_op_rules(register: Callable[[Any, Callable[[OpContext], Layout]], None]) -> None:
    register(MASK_LEAF_NAME, mask_leaf)
    register(F.embedding, embedding)
