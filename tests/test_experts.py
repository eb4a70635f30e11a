"""The number of experts as a group (issue 21, part 1): a router's ``topk`` returns *positions*
along the experts dim, and those positions index the fused expert tensors
(``gate_up[idx]``), ``one_hot(idx, E)``, ``gather``/``scatter`` along it. fxsym tracks a
tensor's values as positions of a dim: where every use of them maps a position to an entry of
a tensor whose dim is tied to the experts, permuting the experts (router rows and expert
tensors together) is exact, and dropping some keeps the model running with fewer experts.
Dropping an expert changes which ones the router picks (that is expert pruning): the group is
*routed*, the value oracle says "not checked" for it, and a resize must keep at least
``top_k`` of them (``SymGroup.min_size``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_oracles, group_with
from torch import nn

import fxsym
from fxsym.oracles import check_values


class FusedExperts(nn.Module):
    """A hand-written top-k router over experts fused into 3-D tensors."""

    def __init__(self, hidden: int = 8, inter: int = 6, experts: int = 4, top_k: int = 2) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Parameter(torch.randn(experts, hidden))
        self.gate_up = nn.Parameter(torch.randn(experts, 2 * inter, hidden))
        self.down = nn.Parameter(torch.randn(experts, hidden, inter))
        self.scale = nn.Parameter(torch.rand(experts) + 0.5)
        self.out = nn.Linear(hidden, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        probs = F.linear(tokens, self.router).softmax(dim=-1)
        weights, idx = torch.topk(probs, self.top_k, dim=-1)
        flat = idx.reshape(-1)
        h = tokens.repeat_interleave(self.top_k, dim=0)
        gate, up = torch.bmm(self.gate_up[flat], h.unsqueeze(-1)).squeeze(-1).chunk(2, dim=-1)
        y = torch.bmm(self.down[flat], (F.silu(gate) * up).unsqueeze(-1)).squeeze(-1)
        y = y * (weights.reshape(-1) * self.scale[flat]).unsqueeze(-1)
        y = y.view(tokens.shape[0], self.top_k, -1).sum(dim=1)
        return self.out(y.reshape(x.shape))


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0)),)


def test_experts_are_a_group_router_rows_and_every_fused_tensor() -> None:
    torch.manual_seed(0)
    model = FusedExperts()
    sm = assert_oracles(model, _inputs(), min_groups=2)
    experts = group_with(sm, "", "router:0")
    assert experts.size == 4
    assert {("", "gate_up:0"), ("", "down:0"), ("", "scale:0")} <= set(experts.members)
    assert experts.routed and experts.min_size == 2
    width = group_with(sm, "", "gate_up:1")
    assert not width.routed and width.min_size == 1
    fxsym.resize(model, sm, {experts.name: [3, 1]})
    assert model.router.shape == (2, 8)
    assert model.gate_up.shape == (2, 12, 8) and model.down.shape == (2, 8, 6)
    assert model.scale.shape == (2,)
    assert model(*_inputs()).shape == (2, 5, 3)


def test_routed_group_is_not_checked_by_value() -> None:
    torch.manual_seed(0)
    model = FusedExperts()
    sm = fxsym.analyze(model, example_inputs=_inputs())
    experts = group_with(sm, "", "router:0")
    result = check_values(model, sm, _inputs())
    assert result.status != "failed"
    assert experts.name in result.unchecked
    assert "rout" in result.unchecked[experts.name]


def test_resize_keeps_at_least_top_k_experts() -> None:
    torch.manual_seed(0)
    model = FusedExperts(experts=6, top_k=3)
    sm = fxsym.analyze(model, example_inputs=_inputs())
    experts = group_with(sm, "", "router:0")
    assert experts.min_size == 3
    before = model.gate_up.clone()
    with pytest.raises(fxsym.ResizeError, match="at least 3"):
        fxsym.resize(model, sm, {experts.name: 2})
    assert torch.equal(model.gate_up, before)
    plan = fxsym.plan(model, sm, ratio=0.9, scope="uniform")
    assert {c.name: c.kept for c in plan.groups}[experts.name] == 3
    fxsym.resize(model, sm, {experts.name: 3})
    assert model(*_inputs()).shape == (2, 5, 3)


class ArithmeticOnPositions(nn.Module):
    """Positions used as numbers (``idx + 1``): a resize would point them elsewhere."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Parameter(torch.randn(4, 8))
        self.table = nn.Parameter(torch.randn(5, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, idx = torch.topk(F.linear(x, self.router), 2, dim=-1)
        return self.table[idx + 1].sum(dim=1)


class PositionsOut(nn.Module):
    """Positions returned to the caller: their values are the contract."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Parameter(torch.randn(4, 8))
        self.table = nn.Parameter(torch.randn(4, 8))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, idx = torch.topk(F.linear(x, self.router), 2, dim=-1)
        return self.table[idx].sum(dim=1), idx


class PositionsReindexed(ArithmeticOnPositions):
    """Positions themselves indexed by a tensor, then used as numbers: still positions."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, idx = torch.topk(F.linear(x, self.router), 2, dim=-1)
        picked = idx[torch.tensor([1, 0])]
        return self.table[picked + 1].sum(dim=1)


@pytest.mark.parametrize("cls", [ArithmeticOnPositions, PositionsOut, PositionsReindexed])
def test_positions_used_otherwise_pin_the_experts(cls: type[nn.Module]) -> None:
    torch.manual_seed(0)
    model = cls()
    sm = fxsym.analyze(model, example_inputs=(torch.randn(3, 8),))
    assert not any(("", "router:0") in g.members for g in sm.groups())
    assert any("position" in e.message for e in sm.trace_report.entries), (
        sm.trace_report.entries)


class MaskedRouting(nn.Module):
    """Positions through ``one_hot`` (sized by the experts count), ``gather`` and ``scatter``
    along the experts dim, and ``torch.cat`` of two picks (PhiMoE's sparse mixer)."""

    def __init__(self, experts: int = 4) -> None:
        super().__init__()
        self.num_experts = experts
        self.router = nn.Parameter(torch.randn(experts, 8))
        self.bias = nn.Parameter(torch.randn(experts))
        self.w = nn.Parameter(torch.randn(experts, 8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = F.linear(x, self.router) + self.bias
        _, first = scores.max(dim=-1, keepdim=True)
        rest = scores.scatter(-1, first, float("-inf"))
        _, second = rest.max(dim=-1, keepdim=True)
        idx = torch.cat([first, second], dim=-1)
        weights = scores.softmax(dim=-1).gather(-1, idx)
        mask = F.one_hot(idx, num_classes=self.num_experts).sum(dim=1).to(x.dtype)
        mixed = torch.einsum("te,eij,tj->ti", mask * scores.softmax(dim=-1), self.w, x)
        return mixed * weights.sum(dim=-1, keepdim=True)


def test_positions_through_one_hot_gather_scatter_and_cat() -> None:
    torch.manual_seed(0)
    model = MaskedRouting()
    sm = assert_oracles(model, (torch.randn(6, 8),), min_groups=1)
    experts = group_with(sm, "", "router:0")
    assert {("", "bias:0"), ("", "w:0"), ("", "attr:num_experts")} <= set(experts.members)
    assert experts.routed and experts.min_size == 1  # two picks of one each: max, then max
    fxsym.resize(model, sm, {experts.name: 3})
    assert model.num_experts == 3 and model.w.shape == (3, 8, 8)
    assert model(torch.randn(6, 8)).shape == (6, 8)


def test_the_html_report_says_which_group_is_routed() -> None:
    """The HTML report's data names the routed group and its minimum (shown in its detail)."""
    from fxsym.prune.report_html import report_data

    torch.manual_seed(0)
    model = FusedExperts()
    sm = fxsym.analyze(model, example_inputs=_inputs())
    groups = {g["name"]: g for g in report_data(sm)["groups"]}
    assert (groups["router:0"]["routed"], groups["router:0"]["min_size"]) == (True, 2)
    assert not groups["gate_up:1#0"]["routed"]
