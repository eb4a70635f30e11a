"""Small convolutional nets with group norms, shared by the tests of both ways a group norm
can change (``tests/test_group_norm.py``: whole norm groups, ``num_groups`` follows;
``tests/test_group_norm_keep.py``: ``num_groups`` stays) and by the command line's
``--norm-groups`` test, which names them as ``group_norm_nets:ConvGN``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvGN(nn.Module):
    """conv -> GroupNorm(``groups`` over 16 channels) -> conv."""

    def __init__(self, groups: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.norm = nn.GroupNorm(groups, 16)
        self.conv2 = nn.Conv2d(16, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.conv2(F.silu(self.norm(self.conv1(x))))
        return out


class ConcatGN(nn.Module):
    """Two branches of ``a`` and ``b`` channels concatenated under one GroupNorm."""

    def __init__(self, a: int, b: int, groups: int) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, a, 1)
        self.b = nn.Conv2d(3, b, 1)
        self.norm = nn.GroupNorm(groups, a + b)
        self.out = nn.Conv2d(a + b, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(self.norm(torch.cat([self.a(x), self.b(x)], dim=1)))
        return out


class NormedConcatGN(nn.Module):
    """A diffusers up block's skip: two branches, each under a GroupNorm of its own, then
    concatenated under one GroupNorm (64 channels in norm groups of 8, 32 in norm groups of 4,
    96 in norm groups of 12: the sixth straddles the two)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 64, 1)
        self.norm_a = nn.GroupNorm(8, 64)
        self.b = nn.Conv2d(3, 32, 1)
        self.norm_b = nn.GroupNorm(8, 32)
        self.norm = nn.GroupNorm(8, 96)
        self.out = nn.Conv2d(96, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.a(x), self.b(x)
        h = torch.cat([a + self.norm_a(a), b + self.norm_b(b)], dim=1)
        out: torch.Tensor = self.out(self.norm(h))
        return out


class LiteralGroups(nn.Module):
    """``F.group_norm`` with the group count written as a number (it cannot follow a resize,
    it can stay)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 1)
        self.conv2 = nn.Conv2d(16, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.conv2(F.group_norm(self.conv1(x), 4))
        return out


def inputs() -> tuple[torch.Tensor]:
    """A float64 batch of two 3-channel 6x6 maps, the input of every net here."""
    return (torch.randn(2, 3, 6, 6, dtype=torch.float64),)
