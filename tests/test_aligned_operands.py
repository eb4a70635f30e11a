"""Elementwise operands whose dims are laid out differently (issue 21 §2, timm's GhostNet).

A ghost module concatenates a conv's output with its depthwise copy: the channels are the
same group twice, ``[A, A]``. Added to a shortcut whose channels are one group ``H`` (or
multiplied by a gate of one group), the two dims are cut at each other's segment boundaries
(``H`` into two blocks) and tied block by block, so ``H`` keeps its group: each of its halves
is ``A``. Where a boundary falls inside a unit of a group (whole heads), the dims are pinned
as before.
"""

from __future__ import annotations

import torch
from helpers import assert_oracles, group_with
from torch import nn

import fxsym


class Ghost(nn.Module):
    """timm's ``GhostModule``: ``cat([x1, cheap(x1)])[:, :self.out_chs]``."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.out_chs = cout
        self.primary = nn.Conv2d(cin, cout // 2, 1)
        self.cheap = nn.Conv2d(cout // 2, cout // 2, 3, padding=1, groups=cout // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = self.primary(x)
        out = torch.cat([x1, self.cheap(x1)], 1)
        return out[:, :self.out_chs]


class GhostResidual(nn.Module):
    """A stem conv, then a ghost bottleneck added to its input, then a gate of one group."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.ghost1 = Ghost(8, 12)
        self.ghost2 = Ghost(12, 8)
        self.gate = nn.Conv2d(8, 8, 1)
        self.head = nn.Conv2d(8, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.stem(x)
        y = self.ghost2(self.ghost1(s)) + s
        return self.head(y * torch.sigmoid(self.gate(y)))


class HeadsAgainstHalves(nn.Module):
    """Heads of 3 channels added to two halves of 3 channels each... of a group of 2-channel
    units: the boundary at 3 falls inside a unit, so both sides are pinned."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a(x)
        h = self.b(x).view(*x.shape[:-1], 3, 2)
        h = (h * h.sum(-1, keepdim=True)).flatten(-2)
        return torch.cat([a, a], -1) + h


def test_a_plain_dim_meets_a_group_concatenated_with_itself() -> None:
    torch.manual_seed(0)
    model = GhostResidual().eval()
    x = torch.randn(2, 3, 6, 6)
    sm = assert_oracles(model, (x,))
    group = group_with(sm, "stem", "out_channels")
    assert ("ghost2.primary", "out_channels") in group.members
    assert ("gate", "out_channels") in group.members
    assert not sm.why_constant("ghost1.primary", "out_channels")
    sizes = {g.name: max(1, g.size // 2) for g in sm.groups()}
    fxsym.resize(model, sm, sizes)
    assert model.stem.out_channels == 4 and model.gate.out_channels == 4
    assert model(x).shape == (2, 5, 6, 6)


def test_a_boundary_inside_a_unit_pins_both_operands() -> None:
    torch.manual_seed(0)
    model = HeadsAgainstHalves().eval()
    sm = fxsym.analyze(model, example_inputs=(torch.randn(2, 4),))
    assert sm.why_constant("b", "out_features")
    assert sm.why_constant("a", "out_features")
