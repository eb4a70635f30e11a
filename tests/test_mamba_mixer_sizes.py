"""Sizes in transformers' Mamba2 mixer that pinned its inner channels (issue 30 §6).

* The scan broadcasts ``B`` over the heads by ``B.repeat_interleave(num_heads // n_groups,
  dim=2, output_size=num_heads)``, ``num_heads`` read from the heads' dim and ``n_groups``
  1: a dim of one entry repeated a size that follows a dim is that dim (as by ``expand``).
* ``MambaRMSNormGated`` views its input as ``(last // self.group_size, self.group_size)``:
  the reshape ties the attribute to the dim it sizes before it checks the quotient, which
  then keeps the value 1 under every resize.
"""

from __future__ import annotations

import torch
from helpers import assert_oracles, group_with, stale_sizes
from torch import nn

import fxsym


class HeadsBroadcast(nn.Module):
    """``x`` in heads of ``head_dim`` entries; ``b`` of one group repeated over the heads."""

    def __init__(self, heads: int = 4, head_dim: int = 3, state: int = 2) -> None:
        super().__init__()
        self.n_groups = 1
        self.proj = nn.Linear(5, heads * head_dim)
        self.heads = nn.Linear(5, heads)
        self.to_b = nn.Linear(5, state)
        self.out = nn.Linear(heads * head_dim, 5)
        self.head_dim = head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, s, _ = x.shape
        h = self.proj(x).view(n, s, -1, self.head_dim)
        num_heads = h.shape[2]
        b = self.to_b(x).view(n, s, self.n_groups, -1)
        b = b.repeat_interleave(num_heads // self.n_groups, dim=2, output_size=num_heads)
        w = (b.sum(-1) * self.heads(x))[..., None]
        return self.out((h * w).reshape(n, s, -1))


class GatedGroupNorm(nn.Module):
    """``MambaRMSNormGated`` with one group, after the heads of the scan."""

    def __init__(self, inner: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(5, inner)
        self.gate = nn.Linear(5, inner)
        self.weight = nn.Parameter(torch.rand(inner) + 0.5)
        self.group_size = inner
        self.out = nn.Linear(inner, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, s, _ = x.shape
        heads = self.proj(x).view(n, s, -1, 2)  # heads of 2 entries, as the scan gives them
        h = heads.reshape(n, s, -1) * nn.functional.silu(self.gate(x))
        *prefix, last = h.shape
        groups = h.view(*prefix, last // self.group_size, self.group_size)
        groups = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + 1e-6)
        h = groups.view(*prefix, last)
        return self.out(self.weight * h)


def test_repeat_interleave_of_one_group_over_the_heads_follows_the_heads() -> None:
    """Before: the heads pinned ('floordiv, a size read from an elastic dim, is used as a
    number by repeat_interleave')."""
    torch.manual_seed(0)
    model = HeadsBroadcast().double().eval()
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    sm = assert_oracles(model, (x,))
    group = group_with(sm, "heads", "out_features")
    assert ("proj", "out_features") in group.members
    assert ("out", "in_features") in group.members
    fxsym.resize(model, sm, {group.name: 2})
    assert (model.proj.out_features, model.heads.out_features) == (6, 2)
    assert model(x).shape == (2, 3, 5)


def test_a_repeat_count_written_as_a_number_still_scales_the_block() -> None:
    """The rule above needs a size that follows a dim: ``repeat_interleave(4)`` of a dim of
    one entry gives a fixed dim, and the heads it meets are pinned (the entries within a
    head stay a group)."""

    class Fixed(HeadsBroadcast):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            n, s, _ = x.shape
            h = self.proj(x).view(n, s, -1, self.head_dim)
            b = self.to_b(x).view(n, s, 1, -1).repeat_interleave(4, dim=2)
            return self.out((h * b.sum(-1)[..., None]).reshape(n, s, -1))

    torch.manual_seed(0)
    model = Fixed().double().eval()
    sm = assert_oracles(model, (torch.randn(2, 3, 5, dtype=torch.float64),))
    assert group_with(sm, "proj", "out_features").size == 3  # within a head: heads pinned


def test_a_gated_norm_viewed_by_its_group_size_attribute_stays_a_group() -> None:
    """Before: 'a size read from one dim reshapes another' pinned the inner channels (the
    quotient ``last // self.group_size`` was checked before the attribute was tied)."""
    torch.manual_seed(0)
    model = GatedGroupNorm().double().eval()
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    sm = assert_oracles(model, (x,))
    group = group_with(sm, "proj", "out_features")
    assert {("gate", "out_features"), ("out", "in_features"), ("", "attr:group_size")} <= set(
        group.members)
    fxsym.resize(model, sm, {group.name: 2})
    assert model.group_size == 4 and model(x).shape == (2, 3, 5)
    assert not stale_sizes(model)
