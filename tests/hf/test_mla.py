"""DeepSeek's multi-head latent attention (issue 21 §1): the low-rank widths between each
``*_a_proj``, its norm and its ``*_b_proj`` are groups. ``q_lora_rank`` runs
``q_a_proj -> q_a_layernorm -> q_b_proj``; ``kv_lora_rank`` is the first piece of
``kv_a_proj_with_mqa``'s output, split at ``[self.kv_lora_rank, self.qk_rope_head_dim]``
(attribute sizes), so the attribute is a member set by resize; the rope piece stays fixed.
The head dims (``qk_nope_head_dim``, ``v_head_dim``) and the heads are still pinned: the
key is rebuilt by ``expand`` to a size read from the heads, ``new_empty`` and slice copies.
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_oracles, group_with

from fxsym.tracer import resolve_example_inputs

transformers = pytest.importorskip("transformers")


def test_deepseek_v3_lora_ranks_are_groups() -> None:
    cfg = transformers.AutoConfig.for_model(
        "deepseek_v3", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, vocab_size=50, max_position_embeddings=32,
        first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=4,
        qk_nope_head_dim=4, v_head_dim=8)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    sm = assert_oracles(model, resolve_example_inputs(model, None))
    attn = "model.layers.0.self_attn"
    q = group_with(sm, f"{attn}.q_a_proj", "out_features")
    assert {(f"{attn}.q_a_layernorm", "weight:0"), (f"{attn}.q_b_proj", "in_features")} <= set(
        q.members)
    kv = group_with(sm, f"{attn}.kv_b_proj", "in_features")
    assert kv.size == 8
    assert {(f"{attn}.kv_a_proj_with_mqa", "out_features"), (attn, "attr:kv_lora_rank"),
            (f"{attn}.kv_a_layernorm", "weight:0")} <= set(kv.members)
