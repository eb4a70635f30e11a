"""``expand`` of a size-1 dim to a size read from an elastic dim (DeepSeek MLA's shared rope
key, ``k_rot.expand(-1, k_nope.shape[1], -1, -1)``): the copies follow that dim's group."""

from __future__ import annotations

import torch
from helpers import assert_oracles, group_with
from torch import nn


class SharedKeyBroadcast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.Linear(6, 8)
        self.shared = nn.Linear(6, 3)
        self.out = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.heads(x).unsqueeze(-1)  # [b, 8, 1]
        s = self.shared(x).unsqueeze(1)  # [b, 1, 3]
        s = s.expand(-1, h.shape[1], -1)
        return self.out((h * s).sum(-1))


def test_expand_to_a_read_size_follows_the_dim() -> None:
    sm = assert_oracles(SharedKeyBroadcast().double(), (torch.randn(4, 6, dtype=torch.float64),))
    group_with(sm, "heads", "out_features")
