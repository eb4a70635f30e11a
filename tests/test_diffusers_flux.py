"""diffusers' Flux transformer from a small config (random weights, nothing downloaded): its
attention splits the projections into heads with ``unflatten(-1, (-1, attn.head_dim))``
(issue 30 §1).

``unflatten`` reads a split dim as ``view`` does (``tests/test_unflatten.py``): the heads are
the units of the query, key and value projections, and a shrink drops whole heads. Before,
the single-stream block's value projection was a group cut inside the heads, whose halving
crashed in SDPA (query heads and value heads no longer equal). What else pinned the heads,
each a mechanism with a tiny module of its own here: ``torch.nn.RMSNorm`` over each head's
features (a norm with no SymInfo is a boundary) and the joint attention's
``split_with_sizes`` back into text and image tokens (no op rule).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from helpers import assert_oracles, group_with
from torch import nn

import fxsym
from fxsym.oracles import check_values

diffusers = pytest.importorskip("diffusers")


def flux() -> tuple[nn.Module, dict[str, Any]]:
    """A Flux transformer of one double-stream and one single-stream block, 2 heads of 8."""
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=8,
        guidance_embeds=False, axes_dims_rope=(2, 2, 4))
    f64 = torch.float64
    inputs = dict(hidden_states=torch.randn(1, 4, 4, dtype=f64),
                  encoder_hidden_states=torch.randn(1, 3, 16, dtype=f64),
                  pooled_projections=torch.randn(1, 8, dtype=f64),
                  timestep=torch.tensor([0.5], dtype=f64), img_ids=torch.randn(4, 3, dtype=f64),
                  txt_ids=torch.randn(3, 3, dtype=f64), return_dict=False)
    return model.to(f64).eval(), inputs


def test_flux_heads_are_groups_of_whole_heads() -> None:
    """Each block's query, key and value projections are one group of 2 heads with the
    output projection's input; the groups pass the permutation, shrink and value oracles
    in float64. Halving the single-stream block's ``to_v.out_features`` keeps head 1 of
    every projection: the forward runs and equals the full model whose value projection
    writes zeros for head 0 (that head's attention output is then zero, as if dropped)."""
    model, inputs = flux()
    sm = assert_oracles(model, inputs, min_groups=5)
    single = "single_transformer_blocks.0"
    heads = group_with(sm, f"{single}.attn.to_v", "out_features")
    assert heads.size == 2
    for proj in ("to_q", "to_k"):
        assert (f"{single}.attn.{proj}", "out_features") in heads.members
    assert (f"{single}.proj_out", "in_features") in heads.members
    double = group_with(sm, "transformer_blocks.0.attn.to_v", "out_features")
    assert ("transformer_blocks.0.attn.add_v_proj", "out_features") in double.members
    assert heads.name not in check_values(model, sm, inputs).unchecked

    small, small_sm = copy.deepcopy((model, sm))
    fxsym.resize(small, small_sm, {heads.name: [1]})
    assert small.single_transformer_blocks[0].attn.to_v.weight.shape == (8, 16)
    zeroed = copy.deepcopy(model)
    with torch.no_grad():
        zeroed.single_transformer_blocks[0].attn.to_v.weight[:8] = 0
        zeroed.single_transformer_blocks[0].attn.to_v.bias[:8] = 0
        torch.testing.assert_close(small(**inputs)[0], zeroed(**inputs)[0])


class NormedHeads(nn.Module):
    """Features split into heads, each head normalised by ``torch.nn.RMSNorm``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 16)
        self.norm = nn.RMSNorm(4)
        self.b = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.norm(self.a(x).unflatten(-1, (-1, 4))).flatten(-2))


def test_rms_norm_over_head_features_keeps_the_heads() -> None:
    """``torch.nn.RMSNorm`` has the SymInfo of ``LayerNorm`` (its normalized features are an
    elastic dim): the heads pass through it (before: no SymInfo, a boundary pinning them)."""
    torch.manual_seed(0)
    model = NormedHeads().double().eval()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    sm = assert_oracles(model, x)
    assert group_with(sm, "a", "out_features").size == 4


class JointTokens(nn.Module):
    """Text and image tokens projected, joined along the sequence, split back with
    ``split_with_sizes``."""

    def __init__(self) -> None:
        super().__init__()
        self.text, self.image = nn.Linear(5, 8), nn.Linear(6, 8)
        self.out_text, self.out_image = nn.Linear(8, 2), nn.Linear(8, 3)

    def forward(self, t: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        joint = torch.cat([self.text(t), self.image(i)], dim=1).relu()
        a, b = joint.split_with_sizes([t.shape[1], i.shape[1]], dim=1)
        return self.out_text(a).sum(1) + self.out_image(b).sum(1)[:, :2]


def test_split_with_sizes_along_tokens_keeps_the_features() -> None:
    """``split_with_sizes`` is ``split``: cutting the tokens leaves the features' group
    (before: no op rule, a boundary pinning it)."""
    torch.manual_seed(0)
    model = JointTokens().double().eval()
    x = (torch.randn(2, 3, 5, dtype=torch.float64), torch.randn(2, 4, 6, dtype=torch.float64))
    sm = assert_oracles(model, x)
    assert ("image", "out_features") in group_with(sm, "text", "out_features").members
