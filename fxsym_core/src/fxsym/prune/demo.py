"""The built-in demo model of ``fxsym analyze``: a small residual CNN with a concat.

Imports from fxsym: nothing."""

from __future__ import annotations

import torch
from torch import nn


class DemoNet(nn.Module):
    """Stem, a residual block, a two-branch concat, and a linear head."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.block = nn.Sequential(
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 32, 3, padding=1), nn.BatchNorm2d(32),
        )
        self.left = nn.Conv2d(32, 24, 1)
        self.right = nn.Conv2d(32, 40, 3, padding=1)
        self.head = nn.Sequential(
            nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.relu(x + self.block(x))
        x = torch.cat([self.left(x), self.right(x)], dim=1)
        x = nn.functional.adaptive_avg_pool2d(x, 4)
        scores: torch.Tensor = self.head(x.flatten(1))
        return scores


def demo_model() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The demo model (eval mode, seeded weights) and an example input."""
    torch.manual_seed(0)
    return DemoNet().eval(), (torch.randn(1, 3, 32, 32),)
