"""Item assignment on a traced value (``x[i] = v``) is part of the traced program.

It raised ``TypeError: 'ShapeProxy' object does not support item assignment`` and the module
doing it fell back to a leaf (Qwen3-Next's gated delta net, RWKV's attention: their groups
were lost behind the leaf). It is now an ``operator.setitem`` node that the graph runs where
the model does; no op rule maps it yet, so the groups it touches are pinned.
"""

from __future__ import annotations

import operator

import torch
from torch import nn

import fxsym


def test_item_assignment_is_traced_and_runs_as_eager() -> None:
    """A forward writing rows of a tensor it made: the traced graph holds both writes and
    gives eager's output; nothing falls back to a leaf; the groups the writes touch are pinned
    with a report line naming ``setitem``, the others stay."""

    class Writes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(8, 6)
            self.proj = nn.Linear(6, 4)
            self.head = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.inner(x))
            out = torch.zeros_like(h)
            out[:2] = h[:2] * 2  # rows of the batch: the features pass whole
            out[2:] = h[2:]
            return self.head(torch.relu(self.proj(out)))

    torch.manual_seed(0)
    model = Writes().eval()
    x = torch.randn(5, 8)
    gm = fxsym.trace(model, example_inputs=(x,))
    assert sum(n.target is operator.setitem for n in gm.graph.nodes) == 2
    torch.testing.assert_close(gm(x), model(x), rtol=0, atol=0)
    sm = fxsym.analyze(model, example_inputs=(x,))
    assert not sm.trace_report.fallbacks
    assert any("setitem" in e.message for e in sm.trace_report.entries)
    members = {m for g in sm.groups() for m in g.members}
    assert ("inner", "out_features") not in members  # written by position: pinned
    assert ("proj", "out_features") in members
