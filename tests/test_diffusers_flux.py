"""diffusers' Flux transformer from a small config (random weights, nothing downloaded): its
attention splits the projections into heads with ``unflatten(-1, (-1, attn.head_dim))``
(issue 30 §1).

``unflatten`` now reads a split dim as ``view`` does (``tests/test_unflatten.py``). Here the
heads are pinned, each for a reason the report names, and everything else passes the
oracles in float64. Before, the single-stream block's value projection was a group whose
halving crashed in SDPA (query heads and value heads no longer equal).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import assert_oracles, has_group_with
from torch import nn

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


def test_flux_value_projection_is_never_cut_inside_a_head() -> None:
    """The single-stream block's ``to_v.out_features`` is in no group (halving it would
    leave the query with more heads than the value), the report says what pinned the heads
    of both blocks, and the groups kept pass the permutation, shrink and value oracles."""
    model, inputs = flux()
    sm = assert_oracles(model, inputs, min_groups=5)
    for block in ("single_transformer_blocks.0", "transformer_blocks.0"):
        for proj in ("to_q", "to_k", "to_v"):
            assert not has_group_with(sm, f"{block}.attn.{proj}", "out_features")
        lines = [str(e) for e in sm.trace_report.entries
                 if e.kind == "boundary" and e.where.startswith(f"{block}.attn")]
        assert lines, sm.trace_report
