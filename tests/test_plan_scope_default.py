"""``fxsym.plan``'s default scope for a parameter target on a stack of residual blocks (issue 31
§3: one meaning for each combination). ``fxsym prune`` and a ``PruneRequest`` plan it uniformly;
``fxsym.plan`` keeps its documented global plan for now and says, with a ``FutureWarning``, that
its default will follow."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import fxsym
from fxsym.prune.request import PruneRequest


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Stack(nn.Module):
    """Three residual blocks between an input and an output layer: one depth group."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def _analyzed(model: nn.Module) -> fxsym.SymMap:
    return fxsym.analyze(model, example_inputs=(torch.randn(2, 8),))


def _stack() -> tuple[nn.Module, fxsym.SymMap, int]:
    torch.manual_seed(0)
    model = Stack().eval()
    with torch.no_grad():  # blocks of unequal weights, so global and uniform plans differ
        for i, block in enumerate(model.blocks):
            block.up.weight.mul_(torch.linspace(0.1, 3.0, 32)[:, None] ** (i + 1))
    symmap = _analyzed(model)
    assert symmap.depth_groups(), "the test model must have a stack of residual blocks"
    return model, symmap, sum(p.numel() for p in model.parameters())


def test_a_target_on_a_stack_without_scope_warns_and_keeps_the_global_plan() -> None:
    model, symmap, total = _stack()
    target = int(total * 0.7)
    with pytest.warns(FutureWarning, match="default becomes 'uniform'"):
        default = fxsym.plan(model, symmap, target_params=target)
    explicit = fxsym.plan(model, symmap, target_params=target, scope="global")
    assert default.groups == explicit.groups
    uniform = fxsym.plan(model, symmap, target_params=target, scope="uniform")
    assert uniform.groups != explicit.groups
    kept = {g.kept for g in uniform.groups if g.name.startswith("blocks.")}
    assert len(kept) == 1, "a uniform plan keeps one width in every block"
    checked = PruneRequest(target_params=target, search=False).check().on_model(stack=True)
    assert checked.scope == "uniform", "the request's default the warning announces"


@pytest.mark.parametrize("how", ["scope", "ratio", "no stack"])
def test_no_warning_where_the_defaults_agree(how: str) -> None:
    model, symmap, total = _stack()
    kwargs: dict[str, object] = {"target_params": int(total * 0.7)}
    if how == "scope":
        kwargs["scope"] = "global"
    elif how == "ratio":
        kwargs = {"ratio": 0.3}
    else:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
        symmap = _analyzed(model)
        kwargs = {"target_params": 150}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        fxsym.plan(model, symmap, **kwargs)  # type: ignore[arg-type]
