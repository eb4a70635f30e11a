"""Grouped routing (issue 21 §1, DeepSeek-V3's router): the scores of ``E`` experts are viewed
as ``n_group`` routing groups of ``E // n_group`` (``view(-1, self.num_group, self.num_experts
// self.num_group)``), the best ``topk_group`` groups are picked, a mask is built from them
(``zeros_like``, ``scatter_``, ``expand(-1, self.num_group, self.num_experts //
self.num_group)``, ``reshape(-1, self.num_experts)``) and ``top_k`` experts are picked among
the unmasked ones.

What the graph proves: the view reads the experts as ``n_group`` heads of ``E // n_group``
entries, so the experts are a group whose unit is one routing group. Picking groups and then
experts are picks by value along it: the group is *routed* and keeps at least ``topk_group``
routing groups and enough of them for ``top_k`` experts. ``E // n_group`` stays a number
(``num_experts`` and ``num_group`` follow the routing groups kept), so the expand to it stays
a dim of fixed size. The mask is a constant fill shaped like the group scores (``zeros_like``
reads only the shape).

With ``routing_groups="keep"`` the view's other reading is taken: the experts are
``n_group`` equal blocks tied entry by entry (one expert position of every routing group a
unit), ``n_group`` stays, the mask's expand follows the positions and the last ``topk``
picks along the ``n_group`` copies of them.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_oracles, group_with
from torch import nn

import fxsym
from fxsym.oracles import check_permutation, check_shrink, check_values


class GroupedRouterExperts(nn.Module):
    """Experts fused into 3-D tensors behind a router that picks routing groups first."""

    def __init__(self, hidden: int = 8, inter: int = 6, experts: int = 8, groups: int = 4,
                 topk_group: int = 2, top_k: int = 2) -> None:
        super().__init__()
        self.num_experts, self.num_group = experts, groups
        self.topk_group, self.top_k = topk_group, top_k
        self.router = nn.Parameter(torch.randn(experts, hidden))
        self.register_buffer("bias", torch.randn(experts) * 0.1)
        self.gate_up = nn.Parameter(torch.randn(experts, 2 * inter, hidden))
        self.down = nn.Parameter(torch.randn(experts, hidden, inter))
        self.out = nn.Linear(hidden, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        scores = F.linear(tokens, self.router).sigmoid()
        choice = scores + self.bias
        group_scores = choice.view(-1, self.num_group, self.num_experts // self.num_group
                                   ).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores)
        group_mask.scatter_(1, group_idx, 1)
        mask = group_mask.unsqueeze(-1).expand(
            -1, self.num_group, self.num_experts // self.num_group).reshape(-1, self.num_experts)
        choice = choice.masked_fill(~mask.bool(), float("-inf"))
        idx = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, idx)
        flat = idx.reshape(-1)
        h = tokens.repeat_interleave(self.top_k, dim=0)
        gate, up = torch.bmm(self.gate_up[flat], h.unsqueeze(-1)).squeeze(-1).chunk(2, dim=-1)
        y = torch.bmm(self.down[flat], (F.silu(gate) * up).unsqueeze(-1)).squeeze(-1)
        y = (y * weights.reshape(-1, 1)).view(tokens.shape[0], self.top_k, -1).sum(dim=1)
        return self.out(y.reshape(x.shape))


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0)),)


def test_experts_drop_whole_routing_groups() -> None:
    torch.manual_seed(0)
    model = GroupedRouterExperts()
    sm = assert_oracles(model, _inputs(), min_groups=2)
    experts = group_with(sm, "", "router:0")
    assert experts.routed and experts.size == 4 and experts.unit == 2
    assert {("", "gate_up:0"), ("", "down:0"), ("", "bias:0"), ("", "attr:num_experts"),
            ("", "attr:num_group")} <= set(experts.members)
    assert experts.min_size == 2  # topk_group routing groups
    values = check_values(model, sm, _inputs())  # dropping a routing group changes the picks
    assert "rout" in values.unchecked[experts.name]
    router, bias = model.router.detach().clone(), model.bias.clone()
    fxsym.resize(model, sm, {experts.name: [3, 0]})
    rows = [6, 7, 0, 1]
    assert torch.equal(model.router, router[rows]) and torch.equal(model.bias, bias[rows])
    assert model.gate_up.shape == (4, 12, 8) and model.down.shape == (4, 8, 6)
    assert (model.num_experts, model.num_group) == (4, 2)
    assert model(*_inputs()).shape == (2, 5, 3)


def test_enough_routing_groups_for_top_k() -> None:
    """``top_k = 5`` experts among routing groups of 2 need 3 of them (more than
    ``topk_group = 1``): a resize to fewer is refused."""
    torch.manual_seed(0)
    model = GroupedRouterExperts(topk_group=1, top_k=5)
    sm = fxsym.analyze(model, example_inputs=_inputs())
    experts = group_with(sm, "", "router:0")
    assert experts.min_size == 3
    try:
        fxsym.resize(model, sm, {experts.name: 2})
    except fxsym.ResizeError as exc:
        assert "at least 3" in str(exc)
    else:
        raise AssertionError("resize kept fewer routing groups than top_k needs")


class ConstantLike(nn.Module):
    """A constant fill shaped like a hidden activation reads only its shape."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        return self.fc2(h * torch.full_like(h, 2.0) + torch.ones_like(h))


def test_constant_fill_like_a_tensor_keeps_its_groups() -> None:
    torch.manual_seed(0)
    sm = assert_oracles(ConstantLike(), (torch.randn(2, 4),))
    assert group_with(sm, "fc1", "out_features").size == 6


def test_active_parameters_count_the_experts_a_token_is_routed_to() -> None:
    """A token reads ``top_k = 2`` of the 8 experts (not ``topk_group = 2`` of the 4 routing
    groups): the expert tensors count 2/8 of their entries, the router and head whole."""
    from fxsym.prune.search import active_params

    torch.manual_seed(0)
    model = GroupedRouterExperts()
    sm = fxsym.analyze(model, example_inputs=_inputs())
    experts = (model.gate_up.numel() + model.down.numel()) * 2 // 8
    whole = model.router.numel() + sum(p.numel() for p in model.out.parameters())
    assert active_params(model, sm)[0] == experts + whole


def test_one_routing_group_keeps_single_experts() -> None:
    """One routing group (``num_group = 1``, ``topk_group = 1``): the view to ``(-1, 1, E)``
    and the mask's expand to ``num_experts // num_group`` follow the experts (``num_experts``
    tied to them, ``num_group`` a constant 1), so the unit is one expert, not the whole."""
    torch.manual_seed(0)
    model = GroupedRouterExperts(groups=1, topk_group=1)
    sm = assert_oracles(model, _inputs(), min_groups=2)
    experts = group_with(sm, "", "router:0")
    assert experts.routed and (experts.size, experts.unit, experts.min_size) == (8, 1, 2)
    assert ("", "attr:num_experts") in experts.members
    fxsym.resize(model, sm, {experts.name: [6, 1, 4]})
    assert (model.num_experts, model.num_group) == (3, 1)
    assert model.gate_up.shape == (3, 12, 8) and model(*_inputs()).shape == (2, 5, 3)


@pytest.mark.parametrize("groups", [2, 4])
def test_kept_routing_groups_lose_the_same_expert_positions(groups: int) -> None:
    """``routing_groups="keep"``: the view to ``(-1, num_group, num_experts // num_group)``
    reads the experts as ``num_group`` equal blocks tied entry by entry, so the unit is one
    expert position of every routing group (``8 // groups`` of them); ``num_group`` stays and
    ``num_experts`` is ``num_group`` times the positions kept. The pruned model equals one
    built with those experts' weights (same positions in each routing group)."""
    torch.manual_seed(0)
    model = GroupedRouterExperts(groups=groups, topk_group=1)
    sm = fxsym.analyze(model, example_inputs=_inputs(), routing_groups="keep")
    assert sm.analysis_options == {"routing_groups": "keep"}
    experts = group_with(sm, "", "router:0")
    per = 8 // groups
    assert experts.routed and (experts.size, experts.unit) == (per, 1)
    assert ("", "attr:num_experts") in experts.members
    assert ("", "attr:num_group") not in experts.members
    assert check_permutation(model, sm, _inputs()).ok
    assert check_shrink(model, sm, _inputs()).ok
    kept = [1, 0] if groups == 4 else [3, 1]
    rows = [g * per + p for g in range(groups) for p in kept]
    reference = GroupedRouterExperts(experts=groups * len(kept), groups=groups, topk_group=1)
    with torch.no_grad():
        for name in ("router", "bias", "gate_up", "down"):
            getattr(reference, name).copy_(getattr(model, name)[rows])
        reference.out.load_state_dict(model.out.state_dict())
    fxsym.resize(model, sm, {experts.name: kept})
    assert (model.num_experts, model.num_group) == (groups * len(kept), groups)
    assert torch.equal(model(*_inputs()), reference(*_inputs()))


def test_routing_groups_option_is_checked() -> None:
    with pytest.raises(fxsym.AnalysisError, match="routing_groups must be one of"):
        fxsym.analyze(GroupedRouterExperts(), example_inputs=_inputs(), routing_groups="drop")


def test_a_saved_plan_replays_kept_routing_groups(tmp_path: Any) -> None:
    """A plan made with ``routing_groups="keep"`` records it; ``fxsym.load`` analyzes the
    fresh model the same way, so the plan fits and the weights load."""
    torch.manual_seed(0)
    model = GroupedRouterExperts(groups=2, topk_group=1)
    fresh = GroupedRouterExperts(groups=2, topk_group=1)
    sm = fxsym.analyze(model, example_inputs=_inputs(), routing_groups="keep")
    experts = group_with(sm, "", "router:0")
    plan = fxsym.plan(model, sm, sizes={experts.name: 2})
    assert plan.extra["analysis"] == {"routing_groups": "keep"}
    plan.apply(model, sm)
    fxsym.save(model, tmp_path, plan)
    loaded = fxsym.load(fresh, tmp_path, example_inputs=_inputs())
    assert (loaded.num_experts, loaded.num_group) == (4, 2)
    assert torch.equal(loaded(*_inputs()), model(*_inputs()))


def test_active_parameters_of_kept_routing_groups() -> None:
    """With ``routing_groups="keep"`` a token still reads ``top_k = 2`` of the 8 experts: the
    group has 2 units (positions), each held by 4 experts, so the expert tensors count 2/8
    of their entries, not the 2 of 2 units the in-group ``topk`` picks."""
    from fxsym.prune.search import active_params

    torch.manual_seed(0)
    model = GroupedRouterExperts()
    sm = fxsym.analyze(model, example_inputs=_inputs(), routing_groups="keep")
    experts = (model.gate_up.numel() + model.down.numel()) * 2 // 8
    whole = model.router.numel() + sum(p.numel() for p in model.out.parameters())
    assert active_params(model, sm)[0] == experts + whole
