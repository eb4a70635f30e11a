"""``split`` at sizes read from module attributes, and pooling windows sized by attributes
(issue 21 §2).

``x.split((self.c, self.c), 1)`` (ultralytics C2f, C2PSA) and ``torch.split(x, self.width,
1)`` (timm's res2net) cut a dim at sizes that ``fxsym.resize`` can update: each attribute
becomes a member of the group of the piece it sizes, so the pieces stay groups and the
attribute is written with the weights. A piece sized by a number stays fixed; a cut the
attribute cannot follow pins the dim with a reason. A pooling window sized by attributes
(SPPF's ``max_pool2d(x, self.k, 1, self.k // 2)``) sizes no tensor dim: the channels stay a
group and the report line is a detail.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import assert_oracles, group_with, stale_sizes
from torch import nn

import fxsym


class SplitByAttributes(nn.Module):
    """ultralytics ``C2f.forward_split``: two pieces of ``self.c`` channels each."""

    def __init__(self) -> None:
        super().__init__()
        self.c = 4
        self.cv1 = nn.Conv2d(3, 2 * self.c, 1)
        self.m = nn.Conv2d(self.c, self.c, 3, padding=1)
        self.cv2 = nn.Conv2d(3 * self.c, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).split((self.c, self.c), 1))
        y.append(self.m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SplitUnequal(nn.Module):
    """Pieces of two attributes of different sizes, then one of a number (fixed)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = 4, 6
        self.proj = nn.Linear(5, self.a + self.b + 2)
        self.head_a = nn.Linear(self.a, 3)
        self.head_b = nn.Linear(self.b, 3)
        self.head_c = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, c = self.proj(x).split([self.a, self.b, 2], -1)
        return self.head_a(a) + self.head_b(b) + self.head_c(c)


class SplitByAttributeProduct(nn.Module):
    """transformers' Mamba2 mixer: ``split([self.inner, self.groups * self.state,
    self.groups * self.state])``, the last two pieces sized by arithmetic on attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.groups, self.state = 6, 1, 4
        self.proj = nn.Linear(5, self.inner + 2 * self.groups * self.state)
        self.out = nn.Linear(self.inner, 3)
        self.mix = nn.Linear(self.groups * self.state, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, b, c = torch.split(self.proj(x), [self.inner, self.groups * self.state,
                                             self.groups * self.state], dim=-1)
        return self.out(h) + self.mix(b * c)


class SplitByWidth(nn.Module):
    """timm's res2net ``Bottle2neck``: ``scale`` pieces of ``self.width`` channels, each
    added to the previous piece's conv output."""

    def __init__(self) -> None:
        super().__init__()
        self.width, self.scale = 3, 4
        self.conv1 = nn.Conv2d(3, self.width * self.scale, 1)
        self.convs = nn.ModuleList(nn.Conv2d(self.width, self.width, 3, padding=1)
                                   for _ in range(self.scale - 1))
        self.conv3 = nn.Conv2d(self.width * self.scale, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spx = torch.split(self.conv1(x), self.width, 1)
        spo = []
        sp = spx[0]
        for i, conv in enumerate(self.convs):
            sp = spx[i] if i == 0 else sp + spx[i]
            sp = conv(sp)
            spo.append(sp)
        spo.append(spx[-1])
        return self.conv3(torch.cat(spo, 1))


class SplitInsideUnits(nn.Module):
    """Heads of 2 channels split at an attribute of 3 channels: the cut falls inside a
    head, so the channels are pinned with a reason."""

    def __init__(self) -> None:
        super().__init__()
        self.c = 3
        self.heads = 3
        self.proj = nn.Linear(5, 6)
        self.out = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.proj(x).view(b, s, self.heads, 2)
        h = h * h.sum(-1, keepdim=True)
        a, c = h.flatten(2).split((self.c, self.c), -1)
        return self.out(torch.cat([c, a], -1))


class PoolByAttribute(nn.Module):
    """ultralytics SPPF: an ``nn.MaxPool2d(5, 1, 2)`` (traced into: ``F.max_pool2d`` of its
    attributes ``kernel_size``, ``stride``, ``padding``, ``dilation``) applied three times,
    then a functional pool sized by the block's own attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.k = 3
        self.cv1 = nn.Conv2d(3, 4, 1)
        self.m = nn.MaxPool2d(kernel_size=5, stride=1, padding=2)
        self.cv2 = nn.Conv2d(20, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.m(y[-1]))
        y.append(F.max_pool2d(y[0], self.k, 1, 1))
        return self.cv2(torch.cat(y, 1))


def test_split_by_attributes_makes_each_attribute_a_member_of_its_piece() -> None:
    torch.manual_seed(0)
    model = SplitByAttributes().eval()
    x = torch.randn(2, 3, 8, 8)
    sm = assert_oracles(model, (x,))
    group = group_with(sm, "", "attr:c")
    assert ("cv1", "out_channels") in group.members
    assert ("m", "in_channels") in group.members
    fxsym.resize(model, sm, {group.name: 2})
    assert model.c == 2 and model.cv1.out_channels == 4
    assert model(x).shape == (2, 5, 8, 8)
    assert not stale_sizes(model)


def test_split_at_unequal_attributes_keeps_each_piece_and_fixes_the_number() -> None:
    torch.manual_seed(0)
    model = SplitUnequal().eval()
    x = torch.randn(2, 7, 5)
    sm = assert_oracles(model, (x,))
    ga, gb = group_with(sm, "", "attr:a"), group_with(sm, "", "attr:b")
    assert ga.name != gb.name
    assert ("head_a", "in_features") in ga.members and ("head_b", "in_features") in gb.members
    assert sm.why_constant("head_c", "in_features")
    fxsym.resize(model, sm, {ga.name: 1, gb.name: 3})
    assert (model.a, model.b, model.proj.out_features) == (1, 3, 6)
    assert model(x).shape == (2, 7, 3)


def test_split_by_a_width_attribute_keeps_the_pieces_equal() -> None:
    torch.manual_seed(0)
    model = SplitByWidth().eval()
    x = torch.randn(2, 3, 8, 8)
    sm = assert_oracles(model, (x,))
    group = group_with(sm, "", "attr:width")
    assert ("convs.0", "in_channels") in group.members
    assert not sm.why_constant("conv1", "out_channels")
    for conv in model.convs:
        assert not sm.why_constant(f"convs.{list(model.convs).index(conv)}", "out_channels")
    sizes = {g.name: max(1, g.size // 2) for g in sm.groups()}
    fxsym.resize(model, sm, sizes)
    assert model.width == 1 and model.conv1.out_channels == 4
    assert model(x).shape == (2, 5, 8, 8)


def test_a_split_inside_a_unit_pins_with_a_reason() -> None:
    torch.manual_seed(0)
    model = SplitInsideUnits().eval()
    x = torch.randn(2, 7, 5)
    sm = fxsym.analyze(model, example_inputs=(x,))
    why = sm.why_constant("proj", "out_features")
    assert why and "split" in why, why


def test_a_pooling_window_sized_by_attributes_leaves_the_channels_a_group() -> None:
    torch.manual_seed(0)
    model = PoolByAttribute().eval()
    x = torch.randn(1, 3, 2, 2)  # batch 1 == stride and dilation, 2 == padding, 3 == k
    sm = assert_oracles(model, (x,))
    assert group_with(sm, "cv1", "out_channels")
    lines = [e for e in sm.trace_report.entries if "max_pool2d" in e.where]
    assert lines and all(e.detail for e in lines), [str(e) for e in lines]


class SliceByAttribute(nn.Module):
    """``out[:, :self.oup]`` keeping every channel: of one conv (``oup`` is tied to its
    group), and of a conv concatenated with its depthwise copy (timm's ghost module, where
    ``oup`` is twice the units kept: it keeps its value)."""

    def __init__(self) -> None:
        super().__init__()
        self.oup, self.ghost_oup = 6, 8
        self.conv = nn.Conv2d(3, self.oup, 1)
        self.primary = nn.Conv2d(self.oup, 4, 1)
        self.cheap = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.head = nn.Conv2d(self.ghost_oup, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)[:, :self.oup]
        z = self.primary(y)
        out = torch.cat([z, self.cheap(z)], 1)
        return self.head(out[:, :self.ghost_oup])


def test_a_slice_stop_read_from_an_attribute_keeps_the_slice_whole() -> None:
    torch.manual_seed(0)
    model = SliceByAttribute().eval()
    x = torch.randn(2, 3, 5, 5)
    sm = assert_oracles(model, (x,))
    group = group_with(sm, "", "attr:oup")
    assert ("conv", "out_channels") in group.members
    assert not sm.why_constant("primary", "out_channels")
    lines = [e for e in sm.trace_report.entries if "getitem" in e.where]
    assert all(e.detail for e in lines), [str(e) for e in lines]
    sizes = {g.name: max(1, g.size // 2) for g in sm.groups()}
    fxsym.resize(model, sm, sizes)
    assert (model.oup, model.conv.out_channels) == (3, 3)
    assert model.ghost_oup == 8 and model.head.in_channels == 4
    assert model(x).shape == (2, 5, 5, 5)


def test_split_at_a_product_of_attributes_pins_that_piece_only() -> None:
    """Before: the whole dim pinned ('split cuts an elastic dim at sizes written as numbers'),
    so ``proj`` produced no group. Now the pieces sized by ``groups * state`` are fixed, with
    the attributes they read, and the piece of ``self.inner`` stays a group."""
    torch.manual_seed(0)
    model = SplitByAttributeProduct().eval().double()
    x = torch.randn(2, 7, 5, dtype=torch.float64)
    sm = assert_oracles(model, (x,))
    group = group_with(sm, "", "attr:inner")
    assert ("proj", "out_features") in group.members and ("out", "in_features") in group.members
    assert sm.why_constant("mix", "in_features")
    assert sm.why_constant("", "attr:state")
    fxsym.resize(model, sm, {group.name: 2})
    assert (model.inner, model.proj.out_features) == (2, 10)
    assert model(x).shape == (2, 7, 3)
    assert not stale_sizes(model)
