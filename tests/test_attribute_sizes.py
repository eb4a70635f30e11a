"""Sizes read from module attributes (``self.hidden``, ``self.heads``) are traced and tied.

A reshape by ``self.hidden`` of a tensor whose dim is group G makes ``hidden`` a member of G
(``(owner, "attr:hidden")``): the group stays searchable and ``fxsym.resize`` updates the
attribute with the weights. An attribute used in a way the analysis cannot map (a factory
size, control flow) pins the groups it meets.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torchvision
from helpers import assert_oracles
from torch import nn

import fxsym
from fxsym.oracles import check_permutation, check_shrink, coverage


class HiddenReshape(nn.Module):
    """ViT's ``_process_input``: a conv's channels reshaped by ``self.hidden``."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = 8
        self.conv = nn.Conv2d(3, self.hidden, 2, stride=2)
        self.head = nn.Linear(self.hidden, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        y = self.conv(x).reshape(n, self.hidden, -1)
        return self.head(y.transpose(1, 2))


class HeadSplit(nn.Module):
    """A multi-head split by ``self.heads``/``self.head_dim``, merged back by ``flatten``."""

    def __init__(self) -> None:
        super().__init__()
        self.heads, self.head_dim = 2, 4
        self.qkv = nn.Linear(6, self.heads * self.head_dim)
        self.out = nn.Linear(self.heads * self.head_dim, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.qkv(x).view(b, s, self.heads, self.head_dim)
        h = h * h.sum(-1, keepdim=True)  # mixes entries within a head only
        return self.out(h.flatten(2))


class Unmappable(nn.Module):
    """Three branches: ``a`` only reshapes (a group); ``b`` also sizes a tensor whose entries
    depend on their positions, ``c`` decides control flow, which the analysis cannot map:
    their groups must be pinned."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = 8, 6, 4
        self.conv_a = nn.Conv2d(3, self.a, 2, stride=2)
        self.conv_b = nn.Conv2d(3, self.b, 2, stride=2)
        self.conv_c = nn.Conv2d(3, self.c, 2, stride=2)
        self.head = nn.Linear(self.a + self.b + self.c, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        ya = self.conv_a(x).reshape(n, self.a, -1)
        yb = self.conv_b(x).reshape(n, self.b, -1) + torch.ones(self.b, 1).cumsum(0)
        yc = self.conv_c(x).reshape(n, self.c, -1)
        if self.c % 2 == 0:  # control flow decided by the size
            yc = yc * 2
        return self.head(torch.cat([ya, yb, yc], 1).transpose(1, 2))


def _group(sm: fxsym.SymMap, name: str) -> fxsym.SymGroup:
    groups = {g.name: g for g in sm.groups()}
    assert name in groups, list(groups)
    return groups[name]


def _zero_dropped(model: nn.Module, conv: nn.Module, keep: list[int]) -> None:
    """Zero the output channels of ``conv`` that a resize keeping ``keep`` drops."""
    drop = [i for i in range(conv.weight.shape[0]) if i not in keep]
    with torch.no_grad():
        conv.weight[drop] = 0
        conv.bias[drop] = 0


@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (1, 3, 4, 12), (3, 3, 6, 6)])
def test_reshape_by_an_attribute_ties_it_to_the_group(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = HiddenReshape().eval()
    x = torch.randn(*shape)
    sm = assert_oracles(model, (x,))
    group = _group(sm, "conv.out_channels")
    assert ("", "attr:hidden") in group.members
    assert ("head", "in_features") in group.members
    keep = [1, 2, 5, 6, 7]
    _zero_dropped(model, model.conv, keep)
    expected = {s: model(torch.randn(*s, generator=torch.Generator().manual_seed(1)))
                for s in [(2, 3, 8, 8), (1, 3, 4, 12), (3, 3, 6, 6)]}
    fxsym.resize(model, sm, {group.name: keep})
    assert model.hidden == 5 and model.conv.out_channels == 5
    for s, out in expected.items():
        got = model(torch.randn(*s, generator=torch.Generator().manual_seed(1)))
        torch.testing.assert_close(got, out)


def test_head_split_by_attributes_keeps_whole_heads() -> None:
    torch.manual_seed(0)
    model = HeadSplit().eval()
    sm = assert_oracles(model, (torch.randn(2, 5, 6),))
    group = _group(sm, "qkv.out_features")
    assert group.size == 2 and group.unit == 4  # heads of head_dim entries
    assert ("", "attr:heads") in group.members
    assert ("", "attr:head_dim") not in group.members  # head_dim does not change
    with torch.no_grad():  # head 0 contributes nothing: dropping it keeps the outputs
        model.qkv.weight[:4] = 0
        model.qkv.bias[:4] = 0
    inputs = [torch.randn(b, s, 6) for b, s in [(2, 5), (1, 1), (4, 9)]]
    expected = [model(x) for x in inputs]
    fxsym.resize(model, sm, {group.name: [1]})
    assert (model.heads, model.head_dim) == (1, 4)
    assert model.qkv.out_features == 4 and model.out.in_features == 4
    for x, out in zip(inputs, expected, strict=True):
        torch.testing.assert_close(model(x), out)


def test_an_unmappable_use_pins_the_attribute_groups() -> None:
    torch.manual_seed(0)
    model = Unmappable().eval()
    x = torch.randn(2, 3, 8, 8)
    sm = assert_oracles(model, (x,))
    names = [g.name for g in sm.groups()]
    assert "conv_a.out_channels" in names
    assert "conv_b.out_channels" not in names and "conv_c.out_channels" not in names
    reasons = [sm.why_constant(model.conv_b, "out_channels"),
               sm.why_constant(model.conv_c, "out_channels")]
    assert all(reasons), reasons
    fxsym.resize(model, sm, {"conv_a.out_channels": 3})
    assert (model.a, model.b, model.c) == (3, 6, 4)
    assert model(x).shape == (2, 16, 4)


def test_analysis_leaves_attributes_as_ints() -> None:
    model = HiddenReshape()
    before = copy.deepcopy(vars(model))
    fxsym.analyze(model, example_inputs=(torch.randn(1, 3, 8, 8),))
    assert type(model.hidden) is int and model.hidden == before["hidden"]
    assert vars(model).keys() == before.keys()


def _small_vit() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=4, num_heads=2, hidden_dim=16,
        mlp_dim=32).eval()


def test_small_vit_hidden_dim_is_a_group_through_both_oracles() -> None:
    model = _small_vit()
    x = (torch.randn(2, 3, 32, 32),)
    sm = fxsym.analyze(model, example_inputs=x)
    group = _group(sm, "conv_proj.out_channels")
    for member in [("", "attr:hidden_dim"), ("", "class_token:2"),
                   ("encoder", "pos_embedding:2"), ("heads.head", "in_features")]:
        assert member in group.members, member
    assert group.size == 2 and group.unit == 8  # MultiheadAttention: whole heads
    assert coverage(sm) >= 0.9  # every Conv/Linear but the classifier head
    perm, shrink = check_permutation(model, sm, x), check_shrink(model, sm, x)
    assert perm.ok, str(perm)
    assert shrink.ok, str(shrink)
    fxsym.resize(model, sm, {group.name: [1]})
    assert model.hidden_dim == 8 and model.class_token.shape[-1] == 8
    assert model.encoder.layers[0].self_attention.num_heads == 1
    assert model(*x).shape == (2, 1000)


class PlainLayerNorm(nn.Module):
    """OLMo's LayerNorm: no weight, ``normalized_shape`` a tuple attribute."""

    def __init__(self, hidden: int, *, ask: bool = False) -> None:
        super().__init__()
        self.normalized_shape = (hidden,)
        self.ask = ask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ask and self.normalized_shape[0] > 4:  # the trace depends on the value
            x = x * 2
        return nn.functional.layer_norm(x, self.normalized_shape, None, None, eps=1e-5)


class NormedBlock(nn.Module):
    def __init__(self, *, ask: bool = False) -> None:
        super().__init__()
        self.up = nn.Linear(5, 8)
        self.norm = PlainLayerNorm(8, ask=ask)
        self.down = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.norm(self.up(x)))


def test_a_tuple_attribute_is_read_element_by_element() -> None:
    torch.manual_seed(0)
    model = NormedBlock().eval()
    x = torch.randn(2, 4, 5)
    sm = assert_oracles(model, (x,))
    group = _group(sm, "up.out_features")
    assert ("norm", "attr:normalized_shape[0]") in group.members
    assert ("down", "in_features") in group.members
    fxsym.resize(model, sm, {group.name: [0, 3, 6]})
    assert model.norm.normalized_shape == (3,) and type(model.norm.normalized_shape) is tuple
    assert model(x).shape == (2, 4, 3)


def test_a_tuple_element_python_reads_pins_its_group() -> None:
    model = NormedBlock(ask=True).eval()
    sm = fxsym.analyze(model, example_inputs=(torch.randn(2, 4, 5),))
    assert "up.out_features" not in [g.name for g in sm.groups()]
    assert sm.why_constant(model.up, "out_features")
    assert model.norm.normalized_shape == (8,)


class Shrinking(nn.Module):
    """Swin's ``set_shift_and_window_size``: the forward rebinds an int attribute to a size
    it computes from the input."""

    def __init__(self) -> None:
        super().__init__()
        self.window = 8
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] <= self.window:
            self.window = x.shape[1]
        return self.proj(x).reshape(x.shape[0], -1, self.window, 4).sum(2)


class HoldsShrinking(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Shrinking()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


def test_an_attribute_the_forward_rebinds_is_held_as_the_int_the_trace_read() -> None:
    model = HoldsShrinking().eval()
    x = torch.randn(2, 6, 4)
    sm = fxsym.analyze(model, example_inputs=(x,))
    assert model.block.window == 8
    held = sm.graph_module.get_submodule("block").window
    assert type(held) is int and held == 8
    clone = copy.deepcopy(sm)
    assert clone.graph_module.get_submodule("block").window == 8
    torch.testing.assert_close(sm.graph_module(x), model(x))
