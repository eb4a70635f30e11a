"""Functional forms of the module families (issue 11, part 3).

A subclass that overrides ``forward`` loses its family's SymInfo and is traced into; there its
weights reach ``F.linear``/``F.conv2d``/``F.layer_norm``/``F.embedding`` through ``get_attr``,
possibly after arithmetic. The weight's output dim produces the output's group, the input dim
ties to the input's group and biases and norm weights are members, so the module gets the
groups of its parent class. Each model here is analyzed, resized and compared with its eager
output on several input shapes, and goes through both oracles (perturbed weights).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_oracles
from torch import nn

import fxsym
import fxsym.oracles


class OwnLinear(nn.Linear):
    """A Linear with its own forward (no SymInfo: traced into)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ScaledLinear(nn.Linear):
    """Arithmetic on the weight before the op: a per-row gain."""

    def __init__(self, i: int, o: int) -> None:
        super().__init__(i, o)
        self.gain = nn.Parameter(torch.ones(o, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight * self.gain, self.bias)


class StdConv(nn.Conv2d):
    """Weight standardisation over (in, kh, kw) per output channel, as BiT writes it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        var, mean = torch.var_mean(w, dim=[1, 2, 3], keepdim=True, unbiased=False)
        w = (w - mean) / torch.sqrt(var + 1e-5)
        return F.conv2d(x, w, self.bias, self.stride, self.padding)


class BnStdConv(nn.Conv2d):
    """Weight standardisation through ``F.batch_norm`` with a per-channel gain, as timm's
    ScaledStdConv2d writes it, with the row count read from the weight's shape."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gain = nn.Parameter(torch.ones(self.out_channels, 1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        w = F.batch_norm(w.reshape(1, w.shape[0], -1), None, None,
                         weight=(self.gain * 0.5).view(-1), training=True, momentum=0.0,
                         eps=1e-5).reshape_as(w)
        return F.conv2d(x, w, self.bias, self.stride, self.padding)


class OwnLayerNorm(nn.LayerNorm):
    """A LayerNorm with its own forward; the normalized shape is read from the input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class LiteralLayerNorm(nn.LayerNorm):
    """The normalized shape is a number written in the forward: it cannot follow a resize
    (``self.normalized_shape`` could: a tuple attribute is read as sizes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (6,), self.weight, self.bias, self.eps)


class OwnEmbedding(nn.Embedding):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = OwnLinear(6, 12)
        self.norm = OwnLayerNorm(12)
        self.fc2 = ScaledLinear(12, 10)
        self.fc3 = nn.Linear(10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(self.norm(torch.relu(self.fc1(x))))))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = StdConv(3, 8, 3, padding=1)
        self.c2 = BnStdConv(8, 12, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(12)
        self.c3 = StdConv(12, 6, 1)
        self.head = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c1(x))
        x = torch.relu(self.bn(self.c2(x)))
        x = self.c3(x).mean((2, 3))
        return self.head(x)


class EmbedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = OwnEmbedding(20, 8)
        self.fc = nn.Linear(8, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.emb(ids)))


class Pinned(nn.Module):
    """A functional linear whose output is reshaped by a literal: nothing can change."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = OwnLinear(4, 6)
        self.norm = LiteralLayerNorm(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.fc(x)).sum(-1)


def _resized_matches(model: nn.Module, sm: fxsym.SymMap, inputs: list[Any]) -> None:
    """Resize every group to its first half and to a kept permutation; the resized model runs
    on every input, and keeping every entry (in order) leaves each output unchanged."""
    model = model.eval()
    full = {g.name: list(range(g.size)) for g in sm.groups()}
    same, same_sm = _copy(model, sm)
    fxsym.resize(same, same_sm, full)
    for x in inputs:
        torch.testing.assert_close(same(x), model(x))
    half, half_sm = _copy(model, sm)
    fxsym.resize(half, half_sm, {g.name: max(1, g.size // 2) for g in sm.groups()})
    for x in inputs:
        assert half(x).shape == model(x).shape


def _copy(model: nn.Module, sm: fxsym.SymMap) -> tuple[nn.Module, fxsym.SymMap]:
    """A deep copy of ``model`` and the SymMap describing the copy."""
    return copy.deepcopy((model, sm))


def _group_of(sm: fxsym.SymMap, key: tuple[str, str]) -> fxsym.SymGroup:
    found = [g for g in sm.groups() if key in g.members]
    assert len(found) == 1, (key, [g.members for g in sm.groups()])
    return found[0]


def test_linear_subclass_and_layer_norm_get_the_parent_groups() -> None:
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(2, 6)
    sm = assert_oracles(model, (x,))
    fc1 = _group_of(sm, ("fc1", "weight:0"))
    assert fc1.size == 12
    assert {("fc1", "bias:0"), ("norm", "weight:0"), ("norm", "bias:0"),
            ("fc2", "weight:1")} <= set(fc1.members)
    fc2 = _group_of(sm, ("fc2", "weight:0"))
    assert {("fc2", "gain:0"), ("fc2", "bias:0"), ("fc3", "in_features")} <= set(fc2.members)
    assert len(sm.groups()) == 2
    _resized_matches(model, sm, [torch.randn(3, 6), torch.randn(2, 5, 6), torch.randn(1, 6)])


def test_weight_standardised_convs_keep_output_channels_independent() -> None:
    torch.manual_seed(0)
    model = ConvNet().eval()
    x = torch.randn(1, 3, 10, 10)
    sm = assert_oracles(model, (x,))
    c1 = _group_of(sm, ("c1", "weight:0"))
    assert {("c1", "bias:0"), ("c2", "weight:1")} <= set(c1.members)
    c2 = _group_of(sm, ("c2", "weight:0"))
    assert {("c2", "gain:0"), ("bn", "num_features"), ("c3", "weight:1")} <= set(c2.members)
    c3 = _group_of(sm, ("c3", "weight:0"))
    assert ("head", "in_features") in c3.members
    assert len(sm.groups()) == 3
    _resized_matches(model, sm, [torch.randn(2, 3, 8, 8), torch.randn(1, 3, 12, 9)])


def test_resize_by_size_ranks_a_functional_producer_by_its_weight() -> None:
    torch.manual_seed(0)
    model = ConvNet().eval()
    with torch.no_grad():
        model.c1.weight[5].mul_(100.0)
    sm = fxsym.analyze(model, example_inputs=(torch.randn(1, 3, 8, 8),))
    name = _group_of(sm, ("c1", "weight:0")).name
    small, small_sm = _copy(model, sm)
    fxsym.resize(small, small_sm, {name: 1})
    kept = small.c1.weight[0]
    torch.testing.assert_close(kept, model.c1.weight[5])


def test_functional_embedding_produces_its_columns() -> None:
    torch.manual_seed(0)
    model = EmbedNet().eval()
    ids = torch.randint(0, 20, (2, 7))
    sm = assert_oracles(model, (ids,))
    g = _group_of(sm, ("emb", "weight:1"))
    assert g.size == 8 and ("fc", "in_features") in g.members
    assert sm.why_constant("fc", "out_features") is not None
    _resized_matches(model, sm, [torch.randint(0, 20, (3, 4)), torch.randint(0, 20, (1, 9))])


class AttributeLayerNorm(nn.LayerNorm):
    """The normalized shape is the module's own tuple attribute, read as sizes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


def test_layer_norm_by_its_normalized_shape_attribute_keeps_the_group() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(OwnLinear(4, 6), AttributeLayerNorm(6), nn.Linear(6, 3)).eval()
    sm = assert_oracles(model, (torch.randn(2, 4),))
    group = _group_of(sm, ("0", "weight:0"))
    assert {("1", "attr:normalized_shape[0]"), ("1", "weight:0"), ("1", "bias:0"),
            ("2", "in_features")} <= set(group.members)
    _resized_matches(model, sm, [torch.randn(3, 4), torch.randn(2, 5, 4)])
    small, small_sm = _copy(model, sm)
    fxsym.resize(small, small_sm, {group.name: 2})
    assert small[1].normalized_shape == (2,)


def test_what_cannot_be_proven_pins_with_a_reason() -> None:
    torch.manual_seed(0)
    model = Pinned().eval()
    sm = assert_oracles(model, (torch.randn(2, 4),), min_groups=0, expect_unchecked=True)
    assert sm.groups() == []
    text = str(sm.trace_report)
    assert "layer_norm's normalized_shape is a literal" in text
    lines = sm.trace_report.of_kind("no-group")
    assert len(lines) == 1
    assert "layer_norm's normalized_shape is a literal" in lines[0].message
    assert "norm" in lines[0].message


def test_a_model_with_no_producer_says_so() -> None:
    model = nn.Sequential(nn.ReLU(), nn.Flatten())
    sm = fxsym.analyze(model, example_inputs=(torch.randn(2, 3, 4),))
    assert sm.groups() == []
    (line,) = sm.trace_report.of_kind("no-group")
    assert "nothing in the graph produces a resizable size" in line.message


# -- real models -----------------------------------------------------------------------------
timm = pytest.importorskip("timm")


def test_timm_scaled_std_conv_model_through_both_oracles() -> None:
    """``nf_resnet26``: every conv is timm's ScaledStdConv2d, which standardises
    ``self.weight.reshape(1, self.out_channels, -1)`` with ``F.batch_norm`` and a per-channel
    gain, then calls ``F.conv2d``. Each conv's output channels are a group."""
    torch.manual_seed(0)
    model = timm.create_model("nf_resnet26", pretrained=False).eval()
    sm = assert_oracles(model, (torch.randn(1, 3, 32, 32),), min_groups=20)
    stem = _group_of(sm, ("stem.conv", "weight:0"))
    assert {("stem.conv", "gain:0"), ("stem.conv", "bias:0"),
            ("stages.0.0.conv1", "weight:1")} <= set(stem.members)
    assert not sm.trace_report.of_kind("no-group")


def test_a_model_with_no_group_names_what_pinned_it() -> None:
    """Every conv meets ``F.group_norm`` with its group count written as a number, which cannot
    follow a resize: the report names the reason and the first place it pinned."""

    class LiteralGroupNorms(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = nn.ModuleList(nn.Conv2d(8, 8, 1) for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for conv in self.convs:
                x = F.group_norm(conv(x), 4)
            return x

    sm = fxsym.analyze(LiteralGroupNorms(), example_inputs=(torch.randn(1, 8, 4, 4),))
    assert sm.groups() == []
    (line,) = sm.trace_report.of_kind("no-group")
    assert "group_norm's num_groups is a number" in line.message
    assert "node group_norm)" in line.message


def test_bit_group_norm_act_keeps_its_groups() -> None:
    """BiT (``resnetv2_50x1_bit``): weight-standardised convs each meet timm's GroupNormAct
    (32 channel groups, ``F.group_norm(x, self.num_groups, ...)``); the channels change 32
    norm groups at a time and ``num_groups`` follows (the oracles run in
    ``tests/test_group_norm.py`` on a smaller GroupNorm net)."""
    torch.manual_seed(0)
    model = timm.create_model("resnetv2_50x1_bit", pretrained=False).eval()
    sm = fxsym.analyze(model, example_inputs=(torch.randn(1, 3, 32, 32),))
    assert len(sm.groups()) >= 30
    assert fxsym.oracles.coverage(sm) > 0.9
    stem = _group_of(sm, ("stages.0.blocks.0.conv1", "weight:0"))
    assert ("stages.0.blocks.0.norm2", "attr:num_groups") in stem.members
    assert stem.size == 32
