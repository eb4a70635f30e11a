"""Functional depthwise convolution (issue 21, Jamba's Mamba mixer).

``F.conv1d(x, w.unsqueeze(1), groups=x.shape[1])`` convolves every channel with its own
kernel: the channels pass through, one weight row each, so they stay the input's group (the
weight's rows and the bias become members). The number of groups must follow the channels:
read from the input's shape or a module attribute tied to them; a number pins them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import assert_oracles, group_with
from torch import nn

import fxsym
from fxsym.oracles import coverage


class CausalDepthwise(nn.Module):
    """in_proj -> chunk -> a causal depthwise conv written functionally -> gate -> out_proj,
    the layout of transformers' Mamba mixers."""

    def __init__(self, hidden: int = 8, inner: int = 12, kernel: int = 3,
                 groups_from: str = "shape") -> None:
        super().__init__()
        self.in_proj = nn.Linear(hidden, 2 * inner)
        self.conv1d = nn.Conv1d(inner, inner, kernel, groups=inner, padding=kernel - 1)
        self.out_proj = nn.Linear(inner, hidden)
        self.inner = inner
        self.groups_from = groups_from

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, gate = self.in_proj(x).transpose(1, 2).chunk(2, dim=1)
        _, channels, seq = h.shape
        groups = {"shape": channels, "attribute": self.inner, "number": 12}[self.groups_from]
        w = self.conv1d.weight.squeeze(1)
        h = F.conv1d(h, w.unsqueeze(1), self.conv1d.bias, padding=w.shape[-1] - 1,
                     groups=groups)[:, :, :seq]
        return self.out_proj((F.silu(h) * gate).transpose(1, 2))


def test_depthwise_channels_from_the_input_shape_are_a_group() -> None:
    model = CausalDepthwise().double()
    sm = assert_oracles(model, (torch.randn(2, 5, 8, dtype=torch.float64),))
    g = group_with(sm, "out_proj", "in_features")
    assert {("conv1d", "weight:0"), ("conv1d", "bias:0")} <= set(g.members)


def test_depthwise_groups_from_an_attribute_follow_the_channels() -> None:
    model = CausalDepthwise(groups_from="attribute").double()
    sm = assert_oracles(model, (torch.randn(2, 5, 8, dtype=torch.float64),))
    g = group_with(sm, "conv1d", "weight:0")
    assert ("", "attr:inner") in g.members


def test_depthwise_groups_written_as_a_number_pin_the_channels() -> None:
    model = CausalDepthwise(groups_from="number").double()
    sm = fxsym.analyze(model, example_inputs=(torch.randn(2, 5, 8, dtype=torch.float64),))
    assert not any(("conv1d", "weight:0") in g.members for g in sm.groups())
    assert any("groups is a number" in e.message for e in sm.trace_report.entries)


def test_coverage_counts_the_conv_whose_weight_the_functional_conv_reads() -> None:
    """The ``conv1d`` module is reached only through its weight (its symbols have no dim):
    coverage judges it by its weight's rows, a member of the channels' group. Before: it
    counted against, 1/3 (in_proj of in_proj, conv1d, out_proj: out_proj's output is the
    model's)."""
    model = CausalDepthwise().double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    assert coverage(fxsym.analyze(model, example_inputs=(x,))) == 2 / 3
    pinned = CausalDepthwise(groups_from="number").double()
    assert coverage(fxsym.analyze(pinned, example_inputs=(x,))) == 0  # all pinned
