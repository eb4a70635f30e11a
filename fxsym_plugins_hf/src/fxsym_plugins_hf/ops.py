"""Op rules for the calls a traced transformers model adds to the graph.

The mask leaves of :mod:`.masks`: a mask depends only on the shapes of its inputs, so no
group is touched and the mask's own layout is fixed.

``torch.nn.functional.embedding`` (an ``nn.Embedding`` subclass with its own ``forward``, such
as OPT's learned positions) is a functional form of a torch.nn family: fxsym-plugins-nn
describes it.
"""

from __future__ import annotations

from fxsym.analysis import Layout, OpContext
from fxsym.plugins.contracts import OpRuleRegistrar

from .masks import MASK_LEAF_NAME


def mask_leaf(ctx: OpContext) -> Layout:
    return ctx.fixed()


def register_op_rules(register: OpRuleRegistrar) -> None:
    register(MASK_LEAF_NAME, mask_leaf)
