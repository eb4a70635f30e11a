"""Complex views (DeepSeek-V2's rotary embedding: ``view_as_complex(x.reshape(..., -1, 2))``,
a product with ``torch.polar(ones, freqs)``, ``view_as_real(...).flatten(3)``): a last dim of
two fixed entries becomes one complex entry and back; the other dims keep their groups, so the
heads rotated this way stay a group."""

from __future__ import annotations

import torch
from helpers import assert_oracles, group_with
from torch import nn


class ComplexRotary(nn.Module):
    def __init__(self, hidden: int = 8, heads: int = 4, head_dim: int = 4) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.q = nn.Linear(hidden, heads * head_dim)
        self.o = nn.Linear(heads * head_dim, hidden)
        self.register_buffer("freqs", torch.rand(5, head_dim // 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        z = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        rot = torch.polar(torch.ones_like(self.freqs), self.freqs)
        q = torch.view_as_real(z * rot).flatten(3).type_as(q)
        return self.o(q.transpose(1, 2).reshape(b, s, -1))


def test_heads_rotated_through_complex_views_are_a_group() -> None:
    torch.manual_seed(0)
    sm = assert_oracles(ComplexRotary(), (torch.randn(2, 5, 8),))
    heads = group_with(sm, "q", "out_features")
    assert heads.size == 4 and heads.unit == 4
