"""New tensors of one repeated value (``torch.zeros/ones/full``, ``x.new_zeros``) sized by an
attribute or by a shape read: each dim follows what sizes it.

Every entry holds the same value, so the tensor built at another size, or with its entries in
another order, is the same tensor sliced or permuted: a zero position bias sized by
``self.n_heads`` (T5's cross-attention) keeps the heads a group, and ``n_heads`` follows a
resize. Op rules are keyed by the functions the graph records, even when the plugins'
registrations are collected for the first time by a trace.
"""

from __future__ import annotations

import torch
from helpers import assert_oracles
from torch import nn

import fxsym
from fxsym.plugins import use_plugins


class ZeroBias(nn.Module):
    """Attention over heads with a zero bias ``(1, n_heads, s, s)`` added to the scores."""

    def __init__(self, fill: str = "zeros") -> None:
        super().__init__()
        self.n_heads, self.head_dim = 4, 3
        self.fill = fill
        self.q = nn.Linear(6, 12)
        self.k = nn.Linear(6, 12)
        self.v = nn.Linear(6, 12)
        self.o = nn.Linear(12, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, -1, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        if self.fill == "zeros":
            bias = torch.zeros((1, self.n_heads, s, s), dtype=x.dtype)
        elif self.fill == "full":
            bias = torch.full((1, self.n_heads, s, s), 0.5)
        else:  # a shape read: the bias follows the heads of q
            bias = q.new_ones(1, q.shape[1], s, s)
        scores = q @ k.transpose(-1, -2) + bias
        out = scores.softmax(-1) @ v
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


def _heads(sm: fxsym.SymMap) -> fxsym.SymGroup:
    groups = {g.name: g for g in sm.groups()}
    assert "q.out_features" in groups, list(groups)
    return groups["q.out_features"]


def test_a_zero_bias_sized_by_an_attribute_keeps_the_heads() -> None:
    torch.manual_seed(0)
    model = ZeroBias().eval()
    x = torch.randn(2, 5, 6)
    sm = assert_oracles(model, (x,))
    group = _heads(sm)
    assert group.size == 4 and group.unit == 3
    assert ("", "attr:n_heads") in group.members
    for m in ("k", "v"):
        assert (m, "out_features") in group.members
    fxsym.resize(model, sm, {group.name: [0, 2]})
    assert model.n_heads == 2 and model.q.out_features == 6
    assert model(x).shape == (2, 5, 6)


def test_full_and_a_shape_read_size_the_new_tensor() -> None:
    for fill in ("full", "new_ones"):
        torch.manual_seed(0)
        model = ZeroBias(fill).eval()
        sm = assert_oracles(model, (torch.randn(2, 5, 6),))
        assert _heads(sm).size == 4, fill


class Positions(nn.Module):
    """Entries that depend on their positions along the heads: the heads must stay fixed."""

    def __init__(self) -> None:
        super().__init__()
        self.n_heads = 4
        self.q = nn.Linear(6, 12)
        self.o = nn.Linear(12, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        q = self.q(x).view(b, s, -1, 3)
        ramp = torch.ones(self.n_heads, 1).cumsum(0)  # head i gets i + 1
        return self.o((q * ramp).reshape(b, s, -1))


def test_a_filled_tensor_made_position_dependent_pins() -> None:
    model = Positions().eval()
    sm = fxsym.analyze(model, example_inputs=(torch.randn(2, 5, 6),))
    assert "q.out_features" not in [g.name for g in sm.groups()]
    assert "cumsum" in str(sm.trace_report)


def test_rules_are_found_when_the_plugins_are_first_collected_by_a_trace() -> None:
    # a manager of its own: its registry is collected for the first time inside the trace,
    # where torch.zeros is patched; the rule must still be found for the recorded target
    mine = fxsym.PluginManager()
    fxsym.load_plugins(manager=mine, allow=["nn"])
    with use_plugins(mine):
        sm = fxsym.analyze(ZeroBias().eval(), example_inputs=(torch.randn(2, 5, 6),))
    assert "no op rule" not in str(sm.trace_report), str(sm.trace_report)
    assert _heads(sm).size == 4


class FilledByAConstant(nn.Module):
    """ultralytics' ``make_anchors``: ``x.new_full((h * w, 1), self.stride[i])``, a fill taken
    from a tensor the module holds (fx keeps ``self.stride[i]`` as a 0-dim constant), which
    reads only ``x``'s dtype and device."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 1)
        self.head = nn.Conv2d(8, 2, 1)
        self.stride = torch.tensor([8.0, 16.0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        h, w = y.shape[2:]
        scale = y.new_full((h * w, 1), self.stride[1])
        return self.head(y).flatten(2) * scale.T


def test_a_fill_from_a_0_dim_constant_is_known_and_pins_nothing() -> None:
    model = FilledByAConstant().eval()
    sm = assert_oracles(model, (torch.randn(1, 3, 4, 5),))
    assert not sm.trace_report.of_kind("unknown-value"), sm.trace_report
    assert "conv.out_channels" in [g.name for g in sm.groups()]
