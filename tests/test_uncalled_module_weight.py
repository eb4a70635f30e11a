"""Soundness of sizes tied across groups (``reshape(b, n, c)`` with ``c`` read from another
group, :func:`tie_equal_sizes`): a resize changes a group only through its producers, so a
searchable group tied to a group nothing resizes is pinned with a report line.

The case that found it: a parameter of a module the model reads with ``get_attr`` but never
calls (``F.linear(x, self.qkv.weight, bias)``: timm's EVA attention) produced nothing; halving
the stream left the heads merged back into it whole, and the shrunk model failed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import assert_oracles, has_group_with
from torch import nn


class UncalledQKV(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 4, bias: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.inp = nn.Linear(5, dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.q_bias = nn.Parameter(torch.randn(dim)) if bias else None
        self.register_buffer("k_bias", torch.zeros(dim), persistent=False)
        self.v_bias = nn.Parameter(torch.randn(dim)) if bias else None
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        b, n, c = h.shape
        if self.q_bias is None:
            qkv = F.linear(h, self.qkv.weight)
        else:
            bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
            qkv = F.linear(h, weight=self.qkv.weight, bias=bias)
        q, k, v = qkv.reshape(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c)
        return self.head(h + self.proj(o))


def test_an_uncalled_modules_weight_is_never_resized_alone() -> None:
    """Nothing resizes the projection yet: the stream its heads are merged back into keeps
    their size, so the stream is pinned and the shrink runs."""
    model = UncalledQKV().double().eval()
    sm = assert_oracles(model, (torch.randn(2, 6, 5, dtype=torch.float64),), min_groups=0,
                        expect_unchecked=True)
    assert not has_group_with(sm, "inp", "out_features")


def test_a_size_tied_to_a_group_no_producer_resizes_is_pinned() -> None:
    """Soundness, whatever produces the projection: where a group without a searchable
    producer keeps the stream's size (``reshape(b, n, c)``), the stream is pinned with a
    report line rather than resized alone."""

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(5, 8)
            self.pos = nn.Parameter(torch.randn(8))
            self.head = nn.Linear(8, 3)
            self.other = nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inp(x)
            b, n, c = h.shape
            o = (x.new_ones(b, n, 1) * self.pos).reshape(b, n, c)
            return self.head(h) + self.other(o)

    model = Tied().double().eval()
    sm = assert_oracles(model, (torch.randn(2, 6, 5, dtype=torch.float64),), min_groups=0,
                        expect_unchecked=True)
    assert not has_group_with(sm, "inp", "out_features")
    assert any("no producer resizes" in e.message for e in sm.trace_report.entries)
