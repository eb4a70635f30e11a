"""Item assignment on a traced value (``x[i] = v``) is part of the traced program.

It raised ``TypeError: 'ShapeProxy' object does not support item assignment`` and the module
doing it fell back to a leaf (Qwen3-Next's gated delta net, RWKV's attention: their groups
were lost behind the leaf). It is now an ``operator.setitem`` node that the graph runs where
the model does, and its op rule (``fxsym_plugins_nn.ops.assign``) ties what is written to the
part of the target it is written into: a dim taken whole keeps its group, a dim written by
position is pinned.
"""

from __future__ import annotations

import operator

import torch
from helpers import assert_oracles, group_with
from torch import nn

import fxsym


class _Writes(nn.Module):
    """Rows of a tensor written from two projections of one width (A's rows, then B's)."""

    def __init__(self, part: bool = False) -> None:
        super().__init__()
        self.part = part
        self.a = nn.Linear(8, 6)
        self.b = nn.Linear(8, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(self.a(x))
        out[:2] = torch.relu(self.a(x[:2]))  # rows of the batch: the features pass whole
        if self.part:
            out[2:, :3] = self.b(x[2:])[:, :3]  # a part of the features, by position
        else:
            out[2:] = self.b(x[2:]) * 2
        return self.head(out)


def test_item_assignment_is_traced_and_ties_what_it_writes() -> None:
    """Two writes into a tensor: the traced graph holds both and gives eager's output, nothing
    falls back to a leaf, and the two projections written into the same features are one
    group (permutation, shrink and value oracles pass). Before: TraceError ('ShapeProxy'
    object does not support item assignment)."""
    torch.manual_seed(0)
    model = _Writes().eval()
    x = torch.randn(5, 8)
    gm = fxsym.trace(model, example_inputs=(x,))
    assert sum(n.target is operator.setitem for n in gm.graph.nodes) == 2
    torch.testing.assert_close(gm(x), model(x), rtol=0, atol=0)
    sm = assert_oracles(model, (x,))
    assert not sm.trace_report.fallbacks
    group = group_with(sm, "a", "out_features")
    assert ("b", "out_features") in group.members and ("head", "in_features") in group.members


def test_a_write_into_part_of_an_elastic_dim_pins_it() -> None:
    """``out[2:, :3] = ...`` writes the first three features by position: the group is pinned
    with a report line saying so, and the trace still equals eager."""
    torch.manual_seed(0)
    model = _Writes(part=True).eval()
    x = torch.randn(5, 8)
    torch.testing.assert_close(fxsym.trace(model, example_inputs=(x,))(x), model(x))
    sm = fxsym.analyze(model, example_inputs=(x,))
    members = {m for g in sm.groups() for m in g.members}
    assert ("a", "out_features") not in members
    assert any("writes a part of an elastic dim by position" in e.message
               for e in sm.trace_report.entries)
