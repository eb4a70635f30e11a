"""GroupNorm keeping its number of norm groups (issue 21, part 2: the second mode).

``fxsym.analyze(model, norm_groups="keep")``: ``num_groups`` stays and every norm group loses
as many channels, at the same places in each, so a unit of the channels' group is one channel
of every norm group (a dim laid out as ``G`` copies of a group of ``C // G`` units). This is
what a config with one ``norm_num_groups`` describes. Dropping a channel of every norm group
is not zeroing it (the norm groups' statistics change), so the library's value oracle leaves
these groups unchecked; the tests here compare a shrink with the original weights sliced by
hand and the norm run over the kept channels with the same ``num_groups``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from group_norm_nets import ConcatGN, ConvGN, LiteralGroups, NormedConcatGN, inputs
from helpers import group_with
from torch import nn

import fxsym
from fxsym.oracles import check_permutation, check_shrink, check_values


class Resnet(nn.Module):
    """A diffusers resnet: ``x + conv2(norm2(conv1(norm1(x))))``, the residual added after
    the norm already laid ``x`` out as copies."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(3, 16, 1)
        self.norm1 = nn.GroupNorm(4, 16)
        self.conv1 = nn.Conv2d(16, 24, 3, padding=1)
        self.norm2 = nn.GroupNorm(4, 24)
        self.conv2 = nn.Conv2d(24, 16, 3, padding=1)
        self.norm_out = nn.GroupNorm(4, 16)
        self.conv_out = nn.Conv2d(16, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(x)
        h = self.conv2(F.silu(self.norm2(self.conv1(F.silu(self.norm1(x))))))
        return self.conv_out(self.norm_out(x + h))


def _keep(model: nn.Module) -> fxsym.SymMap:
    return fxsym.analyze(model, example_inputs=inputs(), norm_groups="keep")


def _oracles(model: nn.Module, sm: fxsym.SymMap) -> None:
    """Permutation exact, shrink runs; the value oracle does not claim these groups."""
    perm = check_permutation(model, sm, inputs())
    assert perm.ok, perm
    shrink = check_shrink(model, sm, inputs())
    assert shrink.ok, shrink
    values = check_values(model, sm, inputs())
    assert values.status != "failed", values


def _strided(units: list[int], per_run: int, runs: int) -> list[int]:
    """The channels kept when units ``units`` of runs of ``per_run`` channels are kept."""
    return [r * per_run + u for r in range(runs) for u in units]


def test_keep_mode_drops_a_channel_of_every_norm_group() -> None:
    model = ConvGN().double().eval()
    sm = _keep(model)
    _oracles(model, sm)
    g = group_with(sm, "conv1", "out_channels")
    assert (g.size, g.unit) == (4, 1)  # four units: one channel of each of the 4 norm groups
    assert ("norm", "num_channels") in g.members and ("conv2", "in_channels") in g.members
    assert ("norm", "attr:num_groups") not in g.members
    assert sm.analysis_options == {"norm_groups": "keep"}
    resized = copy.deepcopy(model)
    fxsym.resize(resized, _keep(resized), {g.name: torch.tensor([1, 3])})
    assert (resized.norm.num_groups, resized.norm.num_channels) == (4, 8)
    kept = _strided([1, 3], 4, 4)
    x = torch.randn(2, 3, 7, 5, dtype=torch.float64)
    with torch.no_grad():
        h = model.conv1(x)[:, kept]
        h = F.group_norm(h, 4, model.norm.weight[kept], model.norm.bias[kept], model.norm.eps)
        expected = F.conv2d(F.silu(h), model.conv2.weight[:, kept], model.conv2.bias)
    torch.testing.assert_close(resized(x), expected, rtol=1e-12, atol=1e-12)


def test_follow_mode_is_still_the_default() -> None:
    sm = fxsym.analyze(ConvGN().double(), example_inputs=inputs())
    g = group_with(sm, "conv1", "out_channels")
    assert (g.size, g.unit) == (4, 4) and ("norm", "attr:num_groups") in g.members
    assert sm.analysis_options == {}


def test_a_size_ranks_units_over_every_norm_group() -> None:
    """``resize`` by a size, and a plan, score a unit by the weights of its channel in every
    norm group (not by ``C // G`` consecutive channels)."""
    model = ConvGN().double().eval()
    with torch.no_grad():
        model.conv1.weight.mul_(1e-3)
        model.conv1.weight[_strided([0, 2], 4, 4)] = 1.0
    sm = _keep(model)
    g = group_with(sm, "conv1", "out_channels")
    plan = fxsym.plan(model, sm, ratio=0.5, scope="uniform", importance="l1")
    assert plan.groups[0].keep == (0, 2)
    fxsym.resize(model, sm, {g.name: 2})
    assert model.conv1.out_channels == 8
    assert bool((model.conv1.weight == 1.0).all())


def test_residual_added_after_the_norm_takes_its_copies() -> None:
    model = Resnet().double().eval()
    sm = _keep(model)
    _oracles(model, sm)
    g = group_with(sm, "conv_in", "out_channels")
    assert (g.size, g.unit) == (4, 1)
    for member in [("conv2", "out_channels"), ("norm1", "num_channels"),
                   ("norm_out", "num_channels"), ("conv_out", "in_channels")]:
        assert member in g.members
    inner = group_with(sm, "conv1", "out_channels")
    assert inner.size == 6  # 24 channels in 4 norm groups of 6
    fxsym.resize(model, sm, {g.name: 2, inner.name: 3})
    assert [m.num_groups for m in (model.norm1, model.norm2, model.norm_out)] == [4, 4, 4]
    assert (model.conv2.out_channels, model.conv1.out_channels) == (8, 12)
    model(*inputs())


def test_concatenated_branches_keep_as_many_units() -> None:
    """Norm groups of 4 over 8 + 12 channels: each branch is copies of a group of 4 units,
    and the two keep as many units (each norm group then loses as many channels)."""
    model = ConcatGN(8, 12, groups=5).double().eval()
    sm = _keep(model)
    _oracles(model, sm)
    a, b = group_with(sm, "a", "out_channels"), group_with(sm, "b", "out_channels")
    assert (a.size, b.size) == (4, 4) and b.name in a.same_size
    fxsym.resize(model, sm, {a.name: torch.tensor([0, 3]), b.name: torch.tensor([1, 2])})
    assert (model.norm.num_groups, model.norm.num_channels) == (5, 10)
    model(*inputs())


def test_straddled_norm_groups_tie_both_branches() -> None:
    """The diffusers skip: norm groups of 12 over 64 + 32 channels cut ``a`` into blocks of
    4 (its own norm groups of 8 hold two), ``b`` into its blocks of 4; both keep as many
    units, so every norm of the three loses as many channels per norm group."""
    model = NormedConcatGN().double().eval()
    sm = _keep(model)
    _oracles(model, sm)
    a, b = group_with(sm, "a", "out_channels"), group_with(sm, "b", "out_channels")
    assert (a.size, a.unit, b.size, b.unit) == (4, 1, 4, 1) and b.name in a.same_size
    fxsym.resize(model, sm, {a.name: torch.tensor([1, 2]), b.name: torch.tensor([0, 3])})
    assert [m.num_groups for m in (model.norm_a, model.norm_b, model.norm)] == [8, 8, 8]
    assert [m.num_channels for m in (model.norm_a, model.norm_b, model.norm)] == [32, 16, 48]
    assert model.a.weight.shape[0] == 32
    model(*inputs())


def test_one_channel_per_norm_group_cannot_shrink_alike() -> None:
    sm = _keep(ConvGN(16).double())
    assert not sm.groups()
    assert "one of its entries" in str(sm.why_constant("conv1", "out_channels"))
    one = _keep(ConvGN(1).double())  # statistics over every channel: any channel may go
    assert group_with(one, "conv1", "out_channels").size == 16


def test_functional_group_norm_with_a_literal_group_count_keeps_it() -> None:
    """A number of norm groups cannot follow a resize, but it can stay: in keep mode the
    channels are a group (in follow mode they are pinned)."""
    model = LiteralGroups().double().eval()
    sm = _keep(model)
    _oracles(model, sm)
    g = group_with(sm, "conv1", "out_channels")
    assert (g.size, g.unit) == (4, 1)
    fxsym.resize(model, sm, {g.name: torch.tensor([2])})
    assert model.conv1.out_channels == 4
    model(*inputs())


def test_a_saved_plan_replays_the_mode(tmp_path: Any) -> None:
    """The plan records ``norm_groups``; ``fxsym.load`` analyzes the fresh model the same
    way (else the groups would not match the plan's)."""
    torch.manual_seed(0)
    model = Resnet().double().eval()
    sm = _keep(model)
    plan = fxsym.plan(model, sm, ratio=0.5, scope="uniform")
    assert plan.extra.get("analysis") == {"norm_groups": "keep"}
    plan.apply(model, sm)
    fxsym.save(model, tmp_path, plan)
    fresh = Resnet().double().eval()
    fxsym.load(fresh, tmp_path)
    x = inputs()
    torch.testing.assert_close(fresh(*x), model(*x), rtol=0, atol=0)


class NormedAttentionLike(nn.Module):
    """diffusers' attention processor: the input's channel count read first, the input
    normed, projected, and reshaped back by that count before the residual add."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(3, 16, 1)
        self.norm = nn.GroupNorm(4, 16)
        self.proj = nn.Linear(16, 16)
        self.conv_out = nn.Conv2d(16, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(x)
        b, c, h, w = x.shape
        y = self.proj(self.norm(x).view(b, c, h * w).transpose(1, 2))
        return self.conv_out(y.transpose(1, 2).reshape(b, c, h, w) + x)


def test_reshape_by_a_size_read_from_copies_ties_the_projection() -> None:
    """The reshape back by ``c`` (read from copies of the stream's group) cuts the
    projection's fresh group into as many blocks, each keeping the size of one copy; the
    residual add then ties them to the stream (it used to pin both)."""
    model = NormedAttentionLike().double().eval()
    sm = _keep(model)
    _oracles(model, sm)
    g = group_with(sm, "conv_in", "out_channels")
    assert ("proj", "out_features") in g.members and g.size == 4
    fxsym.resize(model, sm, {g.name: 2})
    assert (model.proj.out_features, model.norm.num_groups) == (8, 4)
    model(*inputs())


class Checked(nn.Module):
    """diffusers' ``Downsample2D``: ``assert x.shape[1] == self.channels`` before its conv."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.channels = channels
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[1] == self.channels
        return self.conv(x)


class NormThenChecked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(3, 16, 1)
        self.norm = nn.GroupNorm(4, 16)
        self.down = Checked(16)
        self.conv_out = nn.Conv2d(16, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_out(self.down(F.silu(self.norm(self.conv_in(x)))))


def test_attribute_compared_with_copies_is_cut_like_them() -> None:
    """The guard ties ``self.channels`` (an attribute: one group of its own) to channels a
    norm already laid out as copies: the attribute's group is cut at the copies' boundaries
    and tied block by block, so it follows the resize (it used to pin the channels:
    'dimensions with different group structure meet')."""
    model = NormThenChecked().double().eval()
    sm = _keep(model)
    _oracles(model, sm)
    g = group_with(sm, "conv_in", "out_channels")
    assert ("down", "attr:channels") in g.members
    fxsym.resize(model, sm, {g.name: 3})
    assert (model.down.channels, model.down.conv.in_channels) == (12, 12)
    model(*inputs())
