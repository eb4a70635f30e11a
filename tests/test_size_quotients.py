"""A size divided by a size: ``head_dim = key.shape[-1] // self.heads`` (diffusers'
``Attention`` processors).

The quotient of two sizes stays the number the trace saw under every resize when the
dividend keeps that many times the divisor's size: the key's features are ``heads`` whole
heads of ``head_dim`` entries, the heads a group with the query's. A reshape of the query
by ``(b, -1, self.heads, head_dim)`` then keeps its heads a group (``heads`` a member),
and merging them back with ``self.heads * head_dim`` follows them. A quotient that cannot be
made constant (a size divided by one of another group that is not its multiple) pins.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from helpers import assert_oracles, group_with
from torch import nn

import fxsym


class KeySizedHeads(nn.Module):
    """Multi-head attention whose head size is read from the key's projection, as diffusers'
    ``AttnProcessor2_0`` does; ``cross`` attends to a context of its own width."""

    def __init__(self, dim: int = 16, heads: int = 4, cross: int | None = None) -> None:
        super().__init__()
        self.heads = heads
        self.inp = nn.Linear(dim, dim)
        self.to_q = nn.Linear(dim, dim)
        self.to_k = nn.Linear(cross or dim, dim)
        self.to_v = nn.Linear(cross or dim, dim)
        self.to_out = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        h = self.inp(x)
        b = h.shape[0]
        context = h if context is None else context
        q, k, v = self.to_q(h), self.to_k(context), self.to_v(context)
        inner_dim = k.shape[-1]
        head_dim = inner_dim // self.heads
        q = q.view(b, -1, self.heads, head_dim).transpose(1, 2)
        k = k.view(b, -1, self.heads, head_dim).transpose(1, 2)
        v = v.view(b, -1, self.heads, head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v)
        o = o.transpose(1, 2).reshape(b, -1, self.heads * head_dim)
        return self.head(self.to_out(o) + h)


class ForeignQuotient(nn.Module):
    """A reshape by ``12 // 5``, a quotient of sizes of two dims that no tie can keep equal
    to 2 under every resize (12 is not 2 * 5): both dims are pinned."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 12)
        self.b = nn.Linear(4, 5)
        self.out = nn.Linear(12, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.a(x), self.b(x)
        per = a.shape[-1] // b.shape[-1]
        return self.out(a.view(a.shape[0], -1, per).flatten(1)) + b.sum(-1, keepdim=True)


def _x(n: int = 5, dim: int = 16) -> torch.Tensor:
    return torch.randn(2, n, dim, dtype=torch.float64)


def test_head_dim_read_from_the_key_keeps_heads_a_group() -> None:
    model = KeySizedHeads().double().eval()
    sm = assert_oracles(model, (_x(),))
    heads = group_with(sm, "to_q", "out_features")
    assert (heads.size, heads.unit) == (4, 4)  # whole heads of head_dim = 4 features
    for member in [("to_k", "out_features"), ("to_v", "out_features"),
                   ("to_out", "in_features"), ("", "attr:heads")]:
        assert member in heads.members
    resized = copy.deepcopy(model)
    fxsym.resize(resized, fxsym.analyze(resized, example_inputs=(_x(),)),
                 {heads.name: torch.tensor([3, 1])})
    assert resized.heads == 2 and resized.to_k.out_features == 8
    x = _x()
    masked = copy.deepcopy(model)
    with torch.no_grad():  # heads 0 and 2 contribute nothing to to_out
        for h in (0, 2):
            masked.to_out.weight[:, 4 * h:4 * h + 4] = 0
    reordered = masked(x)
    torch.testing.assert_close(resized(x), reordered, rtol=1e-12, atol=1e-12)


def test_cross_attention_with_key_sized_heads() -> None:
    model = KeySizedHeads(cross=6).double().eval()
    inputs = (_x(), torch.randn(2, 3, 6, dtype=torch.float64))
    sm = assert_oracles(model, inputs, min_groups=2)
    heads = group_with(sm, "to_k", "out_features")
    assert ("to_q", "out_features") in heads.members and heads.size == 4


def test_a_quotient_of_unrelated_sizes_pins() -> None:
    model = ForeignQuotient().double().eval()
    sm = fxsym.analyze(model, example_inputs=(torch.randn(3, 4, dtype=torch.float64),))
    assert "reshapes another" in str(sm.why_constant("a", "out_features"))
    assert sm.why_constant("b", "out_features") is not None
