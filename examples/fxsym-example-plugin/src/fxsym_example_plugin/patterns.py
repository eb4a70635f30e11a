"""The rewrite pattern of the example plugin: ``torch.neg(torch.neg(x))`` → ``x``."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fxsym.passes import Match, RewriteContext, SubgraphPattern


def _double_neg(x: Any) -> Any:
    return torch.neg(torch.neg(x))


def _keep_input(match: Match, ctx: RewriteContext) -> fx.Node:
    return match["x"]


DOUBLE_NEG = SubgraphPattern(
    "double_neg",
    _double_neg,
    rewrite=_keep_input,
    description="neg(neg(x)) -> x",
)
# negating twice gives back exactly the same values (also for -0.0 and NaN), so the pattern
# may run even when fxsym.optimize has no example inputs to verify it with
DOUBLE_NEG.exact = True

PATTERNS = [DOUBLE_NEG]
