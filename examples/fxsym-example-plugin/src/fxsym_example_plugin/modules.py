"""The module family of the example plugin: :class:`ScaledLinear` and how fxsym sees it."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fxsym import Symbol, SymInfo
from fxsym.resizing import keep_entries, l1_scores

IN, OUT = Symbol.CLType.INCOMING, Symbol.CLType.OUTGOING


class ScaledLinear(nn.Module):
    """A bias-free linear layer whose outputs are multiplied by a learned per-feature scale."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.randn(out_features, in_features) / in_features**0.5)
        self.scale = nn.Parameter(torch.rand(out_features) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight) * self.scale

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def scaled_linear_info(mod: nn.Module) -> SymInfo:
    """``in_features`` follows the producer of the input's last dim; ``out_features`` starts
    a group (it is searchable) that every consumer of the output's last dim joins.

    The module's int attributes of the same names are *declared* from those symbols:
    ``fxsym.resize`` sets them after the resize rule ran (so the rule only slices tensors),
    and they are listed among the members of their symbols' groups."""
    return SymInfo(
        in_features=Symbol(cl_type=IN, elastic_dims={-1}),
        out_features=Symbol(is_searchable=True, cl_type=OUT, elastic_dims={-1}),
    ).declare(in_features="in_features", out_features="out_features")


def scaled_linear_resize(mod: Any, name: str, index: torch.Tensor) -> None:
    """Keep entries ``index`` of the symbol's dimension in every tensor it sizes (the
    attributes it sizes are declared: fxsym sets them)."""
    if name == "in_features":
        keep_entries(mod, "weight", 1, index)
    else:
        keep_entries(mod, "weight", 0, index)
        keep_entries(mod, "scale", 0, index)


def scaled_linear_importance(mod: Any, name: str) -> torch.Tensor:
    """One score per output feature: the L1 norm of its weight row times its |scale|."""
    return l1_scores(mod.weight, 0) * mod.scale.detach().float().abs()


def keep_opaque_leaf(module: nn.Module, qualname: str) -> bool | None:
    """The leaf decision (``fxsym_leaf_module``): a module whose class name ends with
    ``Opaque`` is traced as one node.

    ``None`` means "no opinion": the other plugins and fxsym's defaults decide.
    """
    return True if type(module).__name__.endswith("Opaque") else None


def register_sym_infos(register: Any) -> None:
    register(ScaledLinear, scaled_linear_info, resize=scaled_linear_resize,
             importance=scaled_linear_importance)
