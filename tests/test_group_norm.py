"""GroupNorm: channels change a whole norm group at a time (issue 21, part 2).

A GroupNorm of ``G`` groups over ``C`` channels normalises each run of ``C // G`` channels
together. Permuting whole runs, or dropping whole runs, leaves every other run's statistics
as they were, so the channels are a group whose unit is one norm group, and ``num_groups``
follows the number kept. Each model is analyzed in float64, checked by both oracles, and
a shrink is compared with the original model whose dropped channels are zeroed where the
next layer reads them (exact: a dropped norm group contributes nothing to the others).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import pytest
import torch
import torch.nn.functional as F
from group_norm_nets import ConcatGN, ConvGN, LiteralGroups, NormedConcatGN, inputs
from helpers import assert_oracles, group_with
from torch import nn

import fxsym
import fxsym.oracles


class FunctionalGroupNorm(nn.GroupNorm):
    """timm's ``GroupNorm``: an ``nn.GroupNorm`` whose forward calls ``F.group_norm`` itself
    (so it is traced into and ``self.num_groups`` is read as a size)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class ConvFunctionalGN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.norm = FunctionalGroupNorm(4, 16)
        self.conv2 = nn.Conv2d(16, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.norm(self.conv1(x)))


def _zeroed_reader(model: nn.Module, reader: str, dropped: Sequence[int]) -> nn.Module:
    """``model`` with the input channels ``dropped`` of conv ``reader`` zeroed."""
    masked = copy.deepcopy(model)
    conv = masked.get_submodule(reader)
    with torch.no_grad():
        conv.weight[:, list(dropped)] = 0
    return masked


def test_groupnorm_channels_are_whole_norm_groups() -> None:
    model = ConvGN().double().eval()
    sm = assert_oracles(model, inputs())
    g = group_with(sm, "conv1", "out_channels")
    assert (g.size, g.unit) == (4, 4)  # four units: one per norm group of four channels
    assert ("norm", "num_channels") in g.members
    assert ("norm", "attr:num_groups") in g.members
    resized = copy.deepcopy(model)
    sm2 = fxsym.analyze(resized, example_inputs=inputs())
    fxsym.resize(resized, sm2, {g.name: torch.tensor([0, 2])})
    assert (resized.norm.num_groups, resized.norm.num_channels) == (2, 8)
    assert resized.norm.weight.shape == (8,) and resized.conv1.weight.shape[0] == 8
    assert resized.conv2.in_channels == 8
    x = torch.randn(2, 3, 7, 5, dtype=torch.float64)
    expected = _zeroed_reader(model, "conv2", [4, 5, 6, 7, 12, 13, 14, 15])(x)
    torch.testing.assert_close(resized(x), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("groups", [1, 16])
def test_groupnorm_of_one_group_or_one_channel_each_keeps_any_channel(groups: int) -> None:
    model = ConvGN(groups).double().eval()
    sm = assert_oracles(model, inputs())
    g = group_with(sm, "conv1", "out_channels")
    assert (g.size, g.unit) == (16, 1)
    fxsym.resize(model, sm, {g.name: 5})
    assert model.norm.num_channels == 5
    assert model.norm.num_groups == (1 if groups == 1 else 5)
    model(*inputs())


def test_groupnorm_over_a_concatenation_coarsens_each_branch() -> None:
    model = ConcatGN(8, 12, groups=5).double().eval()  # norm groups of 4: 2 + 3 of them
    sm = assert_oracles(model, inputs(), min_groups=2)
    a, b = group_with(sm, "a", "out_channels"), group_with(sm, "b", "out_channels")
    assert (a.size, a.unit, b.size, b.unit) == (2, 4, 3, 4)
    fxsym.resize(model, sm, {a.name: torch.tensor([1]), b.name: torch.tensor([0, 2])})
    assert (model.norm.num_groups, model.norm.num_channels) == (3, 12)
    model(*inputs())


def test_groupnorm_group_straddling_a_concatenation_stays_whole() -> None:
    """Norm groups of 3 over 8 + 4 channels: channels 6-8 (two of ``a``, one of ``b``) are
    one norm group. Those entries are kept, constant; ``a``'s first 6 channels change a norm
    group at a time, and ``b``'s last 3 are a single norm group (pinned: a group of one unit
    cannot shrink)."""
    model = ConcatGN(8, 4, groups=4).double().eval()
    sm = assert_oracles(model, inputs())
    (a,) = sm.groups()
    assert (a.size, a.unit) == (2, 3) and ("a", "out_channels") in a.members
    assert "straddles" in str(sm.why_constant("b", "out_channels"))
    resized = copy.deepcopy(model)
    fxsym.resize(resized, fxsym.analyze(resized, example_inputs=inputs()),
                 {a.name: torch.tensor([1])})
    assert (resized.a.out_channels, resized.norm.num_channels) == (5, 9)
    assert resized.norm.num_groups == 3
    x = inputs()[0]
    expected = _zeroed_reader(model, "out", [0, 1, 2])(x)
    torch.testing.assert_close(resized(x), expected, rtol=1e-12, atol=1e-12)


def test_straddled_norm_group_cuts_each_branch_where_all_its_norms_allow() -> None:
    """The norm group of 12 over channels 60-71 straddles the concatenation inside one of
    ``a``'s norm groups of 8 (56-63): ``a`` keeps its channels 48-63 constant (every
    position a norm group of both norms starts at: 0, 24, 48) and its first 48 change 24 at a
    time; ``b`` keeps 0-7 constant and changes 12 at a time (a norm group of 12 and three of
    4). It used to pin ``a`` whole."""
    model = NormedConcatGN().double().eval()
    sm = assert_oracles(model, inputs(), min_groups=2)
    a, b = group_with(sm, "a", "out_channels"), group_with(sm, "b", "out_channels")
    assert (a.size, a.unit, b.size, b.unit) == (2, 24, 2, 12)
    resized = copy.deepcopy(model)
    fxsym.resize(resized, fxsym.analyze(resized, example_inputs=inputs()),
                 {a.name: torch.tensor([1]), b.name: torch.tensor([1])})
    assert (resized.a.out_channels, resized.b.out_channels) == (40, 20)
    assert (resized.norm_a.num_groups, resized.norm_b.num_groups) == (5, 5)
    assert (resized.norm.num_groups, resized.norm.num_channels) == (5, 60)
    x = inputs()[0]
    expected = _zeroed_reader(model, "out", [*range(24), *range(72, 84)])(x)
    torch.testing.assert_close(resized(x), expected, rtol=1e-12, atol=1e-12)


def test_functional_group_norm_ties_num_groups() -> None:
    model = ConvFunctionalGN().double().eval()
    sm = assert_oracles(model, inputs())
    g = group_with(sm, "conv1", "out_channels")
    assert (g.size, g.unit) == (4, 4)
    assert ("norm", "attr:num_groups") in g.members
    resized = copy.deepcopy(model)
    sm2 = fxsym.analyze(resized, example_inputs=inputs())
    fxsym.resize(resized, sm2, {g.name: torch.tensor([3])})
    assert (resized.norm.num_groups, resized.norm.num_channels) == (1, 4)
    x = inputs()[0]
    expected = _zeroed_reader(model, "conv2", range(12))(x)
    torch.testing.assert_close(resized(x), expected, rtol=1e-12, atol=1e-12)


def test_functional_group_norm_with_a_literal_group_count_is_pinned() -> None:
    model = LiteralGroups().double().eval()
    sm = fxsym.analyze(model, example_inputs=inputs())
    assert not sm.groups()
    assert "group" in str(sm.why_constant("conv1", "out_channels"))


def test_timm_efficientnet_with_group_norm() -> None:
    """timm's ``test_efficientnet_gn``: every norm is a GroupNormAct traced into
    (``F.group_norm(x, self.num_groups, ...)``); the convs keep their groups."""
    import timm
    torch.manual_seed(0)
    model = timm.create_model("test_efficientnet_gn", pretrained=False).double().eval()
    x = (torch.randn(1, 3, 32, 32, dtype=torch.float64),)
    sm = assert_oracles(model, x, min_groups=10)
    assert fxsym.oracles.coverage(sm) > 0.9


def test_diffusers_unet_resnets_keep_their_groups() -> None:
    """A small diffusers ``UNet2DModel``: its ResnetBlock2D and attention GroupNorms no longer
    pin the channels (0.04 of the producers were covered before); permutation exact in
    float64. (A shrink also needs ``Upsample2D``'s ``assert shape[1] == self.channels``
    tied, a guard of its own.)"""
    import diffusers
    torch.manual_seed(0)
    model = diffusers.UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(16, 32), norm_num_groups=8,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D")).double().eval()
    x = (torch.randn(1, 3, 16, 16, dtype=torch.float64), torch.tensor([10]))
    sm = fxsym.analyze(model, example_inputs=x)
    assert fxsym.oracles.coverage(sm) > 0.55
    group = group_with(sm, "down_blocks.0.resnets.0.conv1", "out_channels")
    assert ("down_blocks.0.resnets.0.norm2", "attr:num_groups") in group.members
    perm = fxsym.oracles.check_permutation(model, sm, x, seeds=(0,))
    assert perm.ok, perm
