"""Families that survive subclassing (issue 11, part 3): ``matmul`` with a model tensor.

A subclass that overrides ``forward`` loses its family's SymInfo and is traced into. There its
weight reaches ``x @ self.weight.T``, ``torch.matmul(x, self.weight.t())``,
``torch.addmm(self.bias, x, self.weight.transpose(0, 1))`` or ``F.conv2d(x, self.weight *
gain)``. Each such model must get the groups of the same model built from the parent classes:
the same sizes, and the same modules in each group (a subclass' ``weight:0``/``bias:0`` where
the parent has ``out_features``/``out_channels``, its ``weight:1`` where the parent has
``in_features``/``in_channels``), and pass both oracles.

Shapes joined from tuples (``x.size()[:-1] + (self.num_heads, self.head_dim)``, as GPT-J's
``_split_heads`` writes them) are checked entry by entry: an attribute becomes a member of the
group it sizes, a literal pins it.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_oracles
from torch import nn

import fxsym

#: a symbol or parameter member -> the side of the module's projection it sizes
ROLE = {"out_features": "out", "weight:0": "out", "bias:0": "out", "gain:0": "out",
        "out_channels": "out", "in_features": "in", "weight:1": "in", "in_channels": "in",
        "num_features": "out", "normalized_shape": "out", "weight": "out", "bias": "out",
        # the parent family's size attributes, set with the tensors of a subclass traced into
        "attr:out_features": "out", "attr:in_features": "in", "attr:out_channels": "out",
        "attr:in_channels": "in"}


def structure(sm: fxsym.SymMap) -> set[tuple[int, frozenset[tuple[str, str]]]]:
    """Each group as its size and the (module, side) pairs of its members."""
    return {(g.size, frozenset((m, ROLE.get(s, s)) for m, s in g.members)) for g in sm.groups()}


class MatmulLinear(nn.Linear):
    """``x @ self.weight.T + self.bias``, as Falcon's FalconLinear writes it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight.T
        return y if self.bias is None else y + self.bias


class TLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.weight.t()) + self.bias


class AddmmLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x, self.weight.transpose(0, 1))


class LeftLinear(nn.Linear):
    """The weight on the left: ``(W @ x^T)^T``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.weight @ x.transpose(-1, -2)).transpose(-1, -2) + self.bias


class GainConv(nn.Conv2d):
    """A weight-standardised conv: ``F.conv2d(x, self.weight * gain, ...)``."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.gain = nn.Parameter(torch.ones(self.out_channels, 1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        mean = w.mean(dim=(1, 2, 3), keepdim=True)
        std = w.std(dim=(1, 2, 3), keepdim=True)
        return F.conv2d(x, (w - mean) / (std + 1e-5) * self.gain, self.bias, self.stride,
                        self.padding)


class MLP(nn.Module):
    def __init__(self, linear: type[nn.Linear], bias: bool = True) -> None:
        super().__init__()
        self.fc1 = linear(6, 12, bias=bias)
        self.fc2 = linear(12, 10, bias=bias)
        self.fc3 = nn.Linear(10, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class ConvNet(nn.Module):
    def __init__(self, conv: type[nn.Conv2d]) -> None:
        super().__init__()
        self.c1 = conv(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = conv(8, 12, 3, padding=1)
        self.head = nn.Linear(12, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.c1(x)))
        return self.head(torch.relu(self.c2(x)).mean((2, 3)))


@pytest.mark.parametrize("linear", [MatmulLinear, TLinear, AddmmLinear, LeftLinear])
def test_a_linear_with_its_own_matmul_gets_the_groups_of_nn_linear(linear: type) -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 6)
    parent = MLP(nn.Linear).eval()
    model = MLP(linear).eval()
    model.load_state_dict(parent.state_dict())
    expected = structure(fxsym.analyze(parent, example_inputs=(x,)))
    sm = assert_oracles(model, (x,), min_groups=2)
    assert structure(sm) == expected
    assert any(("fc1", "weight:0") in g.members and ("fc1", "bias:0") in g.members
               for g in sm.groups())


def test_a_batched_input_and_no_bias() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 6)
    parent, model = MLP(nn.Linear, bias=False).eval(), MLP(MatmulLinear, bias=False).eval()
    model.load_state_dict(parent.state_dict())
    sm = assert_oracles(model, (x,), min_groups=2)
    assert structure(sm) == structure(fxsym.analyze(parent, example_inputs=(x,)))
    small, small_sm = copy.deepcopy((model, sm))
    fxsym.resize(small, small_sm, {g.name: 3 for g in sm.groups()})
    assert small.fc1.weight.shape == (3, 6) and small.fc2.weight.shape == (3, 3)
    assert small(x).shape == (2, 5, 3)


def test_a_weight_standardised_conv_gets_the_groups_of_nn_conv2d() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    parent, model = ConvNet(nn.Conv2d).eval(), ConvNet(GainConv).eval()
    model.load_state_dict(parent.state_dict(), strict=False)
    expected = structure(fxsym.analyze(parent, example_inputs=(x,)))
    sm = assert_oracles(model, (x,), min_groups=2)
    assert structure(sm) == expected


def test_an_activation_times_an_activation_produces_nothing() -> None:
    """``q @ k^T`` of two activations: no model tensor makes the output's entries, so no
    group starts there (the scores' dims stay those of the inputs)."""

    class Scores(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(6, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q = self.q(x)
            return (q @ q.transpose(-1, -2)).sum(-1)

    sm = fxsym.analyze(Scores(), example_inputs=(torch.randn(2, 4, 6),))
    assert [g.members for g in sm.groups()] == [(("q", "out_features"),)]


class Heads(nn.Module):
    """Multi-head attention whose head split and merge are shapes joined from tuples, with
    the sizes read from attributes (GPT-J's ``_split_heads``/``_merge_heads``)."""

    def __init__(self, literal: bool = False) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.literal = 4, 3, literal
        self.q, self.k, self.v = nn.Linear(8, 12), nn.Linear(8, 12), nn.Linear(8, 12)
        self.o = nn.Linear(12, 8)

    def split(self, t: torch.Tensor) -> torch.Tensor:
        shape = t.size()[:-1] + ((4, 3) if self.literal else (self.num_heads, self.head_dim))
        return t.view(shape).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        a = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        a = a.permute(0, 2, 1, 3)
        merged = a.size()[:-2] + (self.num_heads * self.head_dim,)  # noqa: RUF005  # as GPT-J
        return self.o(a.reshape(merged))


def test_a_joined_shape_ties_the_attribute_it_sizes() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    model = Heads().eval()
    sm = assert_oracles(model, (x,), min_groups=1)
    (heads,) = [g for g in sm.groups() if ("q", "out_features") in g.members]
    assert heads.size == 4
    assert {("", "attr:num_heads"), ("k", "out_features"), ("v", "out_features"),
            ("o", "in_features")} <= set(heads.members)
    small, small_sm = copy.deepcopy((model, sm))
    fxsym.resize(small, small_sm, {heads.name: 2})
    assert small.num_heads == 2 and small.head_dim == 3
    assert small(x).shape == x.shape


def test_a_joined_shape_with_literal_heads_pins_them() -> None:
    model = Heads(literal=True).eval()
    sm = fxsym.analyze(model, example_inputs=(torch.randn(2, 5, 8),))
    assert not any(("q", "out_features") in g.members for g in sm.groups())
    assert sm.why_constant("q", "out_features")


class MultiQuery(nn.Module):
    """Falcon's multi-query attention, small: one fused projection (a Linear with its own
    forward) viewed as ``(num_heads + 2, head_dim)``: query heads, then one key and one value
    head picked by list indices."""

    def __init__(self, pick: int = -2) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.pick = 4, 3, pick
        self.qkv = MatmulLinear(8, (4 + 2) * 3, bias=False)
        self.dense = MatmulLinear(12, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        fused = self.qkv(x).view(b, s, self.num_heads + 2, self.head_dim)
        q, k, v = fused[..., :-2, :], fused[..., [self.pick], :], fused[..., [-1], :]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        a = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        a = a.permute(0, 2, 1, 3).reshape(b, s, self.num_heads * self.head_dim)
        return self.dense(a)


def test_a_fused_view_with_a_fixed_part_makes_query_heads_a_group() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    model = MultiQuery().eval()
    sm = assert_oracles(model, (x,), min_groups=1)
    (heads,) = [g for g in sm.groups() if ("qkv", "weight:0") in g.members]
    assert heads.size == 4
    assert set(heads.members) == {("qkv", "weight:0"), ("", "attr:num_heads"),
                                  ("dense", "weight:1"), ("qkv", "attr:out_features"),
                                  ("dense", "attr:in_features")}
    small, small_sm = copy.deepcopy((model, sm))
    fxsym.resize(small, small_sm, {heads.name: [2, 0]})
    assert small.num_heads == 2 and small.qkv.weight.shape == (12, 8)
    assert (small.qkv.out_features, small.dense.in_features) == (12, 6)
    w = model.qkv.weight
    torch.testing.assert_close(small.qkv.weight, torch.cat([w[6:9], w[0:3], w[12:]]))
    assert small(x).shape == x.shape


def test_a_list_index_into_the_heads_pins_them() -> None:
    """``fused[..., [0], :]`` picks the first query head: which entry that is depends on the
    order of the heads, so they cannot be a group."""
    model = MultiQuery(pick=0).eval()
    sm = fxsym.analyze(model, example_inputs=(torch.randn(2, 5, 8),))
    assert not any(("qkv", "weight:0") in g.members for g in sm.groups())
    assert "addresses an elastic dim by position" in str(sm.trace_report)
