"""Soundness of sizes tied across groups (``reshape(b, n, c)`` with ``c`` read from another
group, :func:`tie_equal_sizes`): a resize changes a group only through its producers, so a
searchable group tied to a group nothing resizes is pinned with a report line.

The case that found it: a parameter of a module the model reads with ``get_attr`` but never
calls (``F.linear(x, self.qkv.weight, bias)``: timm's EVA attention) produced nothing; halving
the stream left the heads merged back into it whole, and the shrunk model failed. Such a
weight is now a producer like a functional op's own parameter, and the module's size
attributes follow the tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import assert_oracles, group_with, has_group_with, stale_sizes
from torch import nn

import fxsym


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


def test_an_uncalled_modules_weight_produces_and_its_sizes_follow() -> None:
    """The weight of a module never called is a producer (sliced as a parameter member); the
    module's ``in_features``/``out_features`` follow it, and the stream stays a group."""
    model = UncalledQKV().double().eval()
    sm = assert_oracles(model, (torch.randn(2, 6, 5, dtype=torch.float64),))
    assert ("proj", "out_features") in group_with(sm, "inp", "out_features").members
    heads = group_with(sm, "qkv", "weight:0")
    fxsym.resize(model, sm, {g.name: g.size // 2 for g in sm.groups()})
    assert heads.size > 1 and model.qkv.out_features == model.qkv.weight.shape[0] < 48
    assert model.qkv.in_features == model.qkv.weight.shape[1] == 8
    assert not stale_sizes(model)


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


def test_a_concatenated_bias_keeps_the_stream_a_group() -> None:
    """``F.linear(x, w, torch.cat((q_bias, k_bias, v_bias)))`` (a zero key-bias buffer): the
    weight's rows are cut at the parts' boundaries and tied to them part by part."""
    model = UncalledQKV(bias=True).double().eval()
    sm = assert_oracles(model, (torch.randn(2, 6, 5, dtype=torch.float64),))
    assert ("proj", "out_features") in group_with(sm, "inp", "out_features").members
    fxsym.resize(model, sm, {g.name: g.size // 2 for g in sm.groups()})
    assert model.q_bias.shape[0] < 16 and not stale_sizes(model)


def test_timm_eva02_tiny() -> None:
    """timm's ``eva02_tiny_patch14_224`` (random weights, two blocks, a 10-class head: its
    config has none): the stream, the heads of every attention (fused qkv on an uncalled
    ``nn.Linear`` with a concatenated bias; the rotary embedding keeps the head dim, so heads
    go whole) and every SwiGLU width are groups."""
    import timm

    model = timm.create_model("eva02_tiny_patch14_224", pretrained=False, img_size=56, depth=2,
                              num_classes=10).double().eval()
    sm = assert_oracles(model, (torch.randn(1, 3, 56, 56, dtype=torch.float64),))
    stream = group_with(sm, "patch_embed.proj", "out_channels")
    assert ("blocks.1.mlp.fc2", "out_features") in stream.members
    assert has_group_with(sm, "blocks.0.attn.qkv", "weight:0")
    assert has_group_with(sm, "blocks.0.mlp.fc1", "out_features")
    fxsym.resize(model, sm, {g.name: max(1, g.size // 2) for g in sm.groups()})
    assert model.blocks[0].attn.qkv.out_features == model.blocks[0].attn.qkv.weight.shape[0]
    assert not stale_sizes(model)
    assert model(torch.randn(1, 3, 56, 56, dtype=torch.float64)).shape == (1, 10)
