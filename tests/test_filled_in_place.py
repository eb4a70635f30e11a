"""A tensor built empty and filled piece by piece (DeepSeek MLA's key: ``new_empty`` of the
heads' shape, then ``key[..., :nope].copy_(k_nope)`` and ``key[..., nope:].copy_(k_rot)``).

``x.new_empty(sizes)``, ``torch.empty`` and ``empty_like`` are sized like a constant fill
(their entries are whatever the code writes next): a dim sized by a size read from an elastic
dim follows it. ``dst.copy_(src)`` writes ``src``, broadcast, into ``dst``: an elementwise op
whose result is ``dst``, so ``src``'s groups are tied to the entries it fills. The heads of
such a key stay a group, with the projection that produces them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import assert_oracles, group_with
from torch import nn

import fxsym


class FilledKey(nn.Module):
    """Heads of a per-head key part and a part shared by every head, joined by filling an
    empty tensor."""

    def __init__(self, hidden: int = 8, heads: int = 4, nope: int = 3, rope: int = 2) -> None:
        super().__init__()
        self.nope, self.rope = nope, rope
        self.q = nn.Linear(hidden, heads * (nope + rope))
        self.k = nn.Linear(hidden, heads * nope)
        self.shared = nn.Linear(hidden, rope)
        self.v = nn.Linear(hidden, heads * 4)
        self.o = nn.Linear(heads * 4, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, -1, self.nope + self.rope).transpose(1, 2)
        k_nope = self.k(x).view(b, s, -1, self.nope).transpose(1, 2)
        k_rot = self.shared(x).view(b, 1, s, self.rope).expand(-1, k_nope.shape[1], -1, -1)
        key = k_nope.new_empty(*k_nope.shape[:-1], self.nope + self.rope)
        key[..., :self.nope].copy_(k_nope)
        key[..., self.nope:].copy_(k_rot)
        v = self.v(x).view(b, s, -1, 4).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, key, v)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


def test_heads_of_a_key_filled_in_place_are_a_group() -> None:
    torch.manual_seed(0)
    model = FilledKey()
    inputs = (torch.randn(2, 5, 8),)
    sm = assert_oracles(model, inputs)
    heads = group_with(sm, "q", "out_features")
    assert heads.size == 4
    assert {("k", "out_features"), ("v", "out_features"), ("o", "in_features")} <= set(
        heads.members)
    fxsym.resize(model, sm, {heads.name: [2, 0]})
    assert model.q.out_features == 10 and model.k.out_features == 6
    assert model(*inputs).shape == (2, 5, 8)


class EmptyLike(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        out = torch.empty_like(h)
        out.copy_(h.relu())
        return self.fc2(out)


def test_empty_like_then_copy_keeps_the_group() -> None:
    torch.manual_seed(0)
    sm = assert_oracles(EmptyLike(), (torch.randn(2, 4),))
    assert group_with(sm, "fc1", "out_features").size == 6
