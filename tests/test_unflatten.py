"""``unflatten`` splits a dim as ``view``/``reshape`` to the same sizes does (issue 30 §1).

``unflatten(d, sizes)`` is the view of the input's shape with ``d`` replaced by ``sizes``,
and ``view_as(y)`` the view to ``y.shape``: one rule reads a split dim's factors as units. An
outer factor written as a number cannot follow a resize, so the dim is read as that many
equal blocks tied entry by entry (a shrink keeps the same positions in every block); an
outer factor read from a module attribute follows it (a shrink drops whole heads and updates
the attribute); two numbers pin the dim. Each test builds a tiny module, checks the traced
graph against eager, runs the oracles (permutation and value, in float64) and compares a
shrink with a hand-sliced reference.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_oracles, has_group_with
from torch import nn

import fxsym

Split = Callable[[torch.Tensor], torch.Tensor]

# four heads of four features, split by a number: the forms a model writes
NUMBER_SPLITS: dict[str, Split] = {
    "method": lambda y: y.unflatten(1, (4, -1)),
    "function": lambda y: torch.unflatten(y, 1, (4, -1)),
    "keywords": lambda y: y.unflatten(dim=1, sizes=(4, -1)),
    "end-relative": lambda y: y.unflatten(-1, (4, -1)),
    "list": lambda y: y.unflatten(1, [4, -1]),
    "view": lambda y: y.view(y.shape[0], 4, -1),
}


class Heads(nn.Module):
    """16 features split into 4 heads of 4 by ``split``, then ``tail`` per head (softmax over
    a head, or its mean), read back by a linear layer."""

    def __init__(self, split: Split, tail: str) -> None:
        super().__init__()
        self.split, self.tail = split, tail
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16 if tail == "softmax" else 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.split(self.a(x))
        if self.tail == "softmax":
            return self.b(z.softmax(-1).flatten(1))
        return self.b(z.mean(-1))


def _model(module: nn.Module) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = module.double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model, torch.randn(3, 8, dtype=torch.float64)


def _traced_is_eager(model: nn.Module, x: torch.Tensor) -> None:
    gm = fxsym.trace(model, example_inputs=(x,))
    torch.testing.assert_close(gm(x), model(x), rtol=0, atol=0)


def _positions_reference(model: Heads, x: torch.Tensor, keep: list[int]) -> torch.Tensor:
    """``model`` by hand with positions ``keep`` of every head kept."""
    rows = [h * 4 + p for h in range(4) for p in keep]
    z = F.linear(x, model.a.weight[rows], model.a.bias[rows]).view(-1, 4, len(keep))
    if model.tail == "softmax":
        return F.linear(z.softmax(-1).flatten(1), model.b.weight[:, rows], model.b.bias)
    return F.linear(z.mean(-1), model.b.weight, model.b.bias)


def _heads_reference(model: nn.Module, x: torch.Tensor, heads: list[int]) -> torch.Tensor:
    """``model`` (``a``, 4 heads of 4 features, softmax per head, ``b``) by hand with the
    whole heads ``heads`` kept."""
    rows = [h * 4 + p for h in heads for p in range(4)]
    z = F.linear(x, model.a.weight[rows], model.a.bias[rows]).view(-1, len(heads), 4)
    return F.linear(z.softmax(-1).flatten(1), model.b.weight[:, rows], model.b.bias)


@pytest.mark.parametrize("tail", ["softmax", "mean"])
@pytest.mark.parametrize("form", NUMBER_SPLITS)
def test_a_number_of_heads_keeps_every_head(form: str, tail: str) -> None:
    """A split into ``(4, -1)`` written with a number: a shrink keeps the same positions of
    every head, so the program's 4 still holds (before: the heads were the units, a shrink
    dropped whole heads, and 4 then cut the rest wrong: softmax mixed heads, ``.mean(-1)``
    crashed on the linear after it)."""
    model, x = _model(Heads(NUMBER_SPLITS[form], tail))
    _traced_is_eager(model, x)
    sm = assert_oracles(model, x)
    (group,) = [g for g in sm.groups() if ("a", "out_features") in g.members]
    assert group.size == 4, (group.name, group.size)
    keep = [0, 2]
    small, small_sm = copy.deepcopy((model, sm))
    fxsym.resize(small, small_sm, {group.name: keep})
    assert small.a.weight.shape == (8, 8)
    torch.testing.assert_close(small(x), _positions_reference(model, x, keep))


class AttributeHeads(nn.Module):
    """16 features split into ``self.h`` heads, softmax per head."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form, self.h = form, 4
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        if self.form == "method":
            z = y.unflatten(1, (self.h, -1))
        elif self.form == "function":
            z = torch.unflatten(y, -1, (self.h, -1))
        else:
            z = y.view(y.shape[0], self.h, -1)
        return self.b(z.softmax(-1).flatten(1))


@pytest.mark.parametrize("form", ["method", "function", "view"])
def test_an_attribute_number_of_heads_follows_the_heads(form: str) -> None:
    """A split into ``(self.h, -1)``: the heads are the units and ``h`` is a member, so a
    shrink to heads 1 and 3 sets ``h`` to 2 and equals the model sliced by hand."""
    model, x = _model(AttributeHeads(form))
    _traced_is_eager(model, x)
    sm = assert_oracles(model, x)
    (group,) = [g for g in sm.groups() if ("a", "out_features") in g.members]
    assert ("", "attr:h") in group.members and group.size == 4
    small, small_sm = copy.deepcopy((model, sm))
    fxsym.resize(small, small_sm, {group.name: [1, 3]})
    assert small.h == 2
    torch.testing.assert_close(small(x), _heads_reference(model, x, [1, 3]))


class TwoNumbers(nn.Module):
    """16 features split into ``[4, 4]``: neither factor can follow a resize."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).unflatten(-1, [4, 4]).softmax(-1).sum(-2))


def test_a_split_into_two_numbers_is_pinned() -> None:
    """``unflatten(-1, [4, 4])`` pins the features, with the reason in the report (before:
    a group of 4 heads, whose shrink made the unflatten fail)."""
    model, x = _model(TwoNumbers())
    _traced_is_eager(model, x)
    sm = fxsym.analyze(model, example_inputs=(x,))
    assert not has_group_with(sm, "a", "out_features")
    assert "node unflatten: reshaped to a literal size" in str(sm.trace_report), sm.trace_report


class ViewAs(nn.Module):
    """16 features viewed as a buffer of 4 heads of 4, softmax per head."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(4, 5)
        self.register_buffer("like", torch.zeros(3, 4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).view_as(self.like).softmax(-1).sum(-2))


def test_view_as_a_fixed_shape_is_pinned() -> None:
    """``view_as(y)`` is ``view(y.shape)``: the sizes of ``y``'s dims do not follow the split
    features, so they are pinned (before: a group of 4 heads, whose shrink made the view
    fail)."""
    model, x = _model(ViewAs())
    _traced_is_eager(model, x)
    sm = fxsym.analyze(model, example_inputs=(x,))
    assert not has_group_with(sm, "a", "out_features")
    assert "[boundary] node view_as" in str(sm.trace_report), sm.trace_report


class AttributeHeadDim(nn.Module):
    """16 features split into heads of ``self.d`` features (``unflatten(-1, (-1, d))``, as
    diffusers' Flux writes it), softmax per head."""

    def __init__(self) -> None:
        super().__init__()
        self.d = 4
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.a(x).unflatten(-1, (-1, self.d))
        return self.b(z.softmax(-1).flatten(1))


def test_a_head_size_attribute_keeps_whole_heads() -> None:
    """A split into ``(-1, self.d)``: the heads, counted by ``-1``, are the units and ``d``
    stays (a shrink to heads 0 and 2 equals the model sliced by hand)."""
    model, x = _model(AttributeHeadDim())
    _traced_is_eager(model, x)
    sm = assert_oracles(model, x)
    (group,) = [g for g in sm.groups() if ("a", "out_features") in g.members]
    assert group.size == 4
    small, small_sm = copy.deepcopy((model, sm))
    fxsym.resize(small, small_sm, {group.name: [0, 2]})
    assert small.d == 4
    torch.testing.assert_close(small(x), _heads_reference(model, x, [0, 2]))


class WeightedHeads(nn.Module):
    """16 features split into heads of ``self.d`` features, each head scaled by its own
    number (``torch.arange(4)``: the 4 heads cannot change), softmax per head."""

    def __init__(self) -> None:
        super().__init__()
        self.d = 4
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.a(x).unflatten(-1, (-1, self.d))
        z = z * torch.arange(1, 5, dtype=z.dtype)[:, None]
        return self.b(z.softmax(-1).flatten(1))


def test_head_features_follow_a_head_size_attribute_when_heads_are_pinned() -> None:
    """A split into ``(-1, self.d)`` whose heads something pins (a tensor of 4 numbers
    broadcast along them): the analysis reads the split as tied blocks instead, so the
    head's features are the units and ``d`` is a member (a shrink to features 1 and 3 of
    every head sets ``d`` to 2 and equals the model sliced by hand). Before, ``d`` stayed 4,
    so the shrunk model's ``unflatten`` made 2 heads of 4 features (diffusers' Flux: query
    and value heads no longer equal)."""
    model, x = _model(WeightedHeads())
    _traced_is_eager(model, x)
    sm = assert_oracles(model, x)
    (group,) = [g for g in sm.groups() if ("a", "out_features") in g.members]
    assert ("", "attr:d") in group.members and group.size == 4
    small, small_sm = copy.deepcopy((model, sm))
    fxsym.resize(small, small_sm, {group.name: [1, 3]})
    assert small.d == 2
    rows = [h * 4 + p for h in range(4) for p in (1, 3)]
    z = F.linear(x, model.a.weight[rows], model.a.bias[rows]).view(-1, 4, 2)
    z = z * torch.arange(1, 5, dtype=z.dtype)[:, None]
    expected = F.linear(z.softmax(-1).flatten(1), model.b.weight[:, rows], model.b.bias)
    torch.testing.assert_close(small(x), expected)
