"""DeepSeek's multi-head latent attention (issue 21 §1): the low-rank widths between each
``*_a_proj``, its norm and its ``*_b_proj`` are groups. ``q_lora_rank`` runs
``q_a_proj -> q_a_layernorm -> q_b_proj``; ``kv_lora_rank`` is the first piece of
``kv_a_proj_with_mqa``'s output, split at ``[self.kv_lora_rank, self.qk_rope_head_dim]``
(attribute sizes), so the attribute is a member set by resize; the rope piece stays fixed.
The heads are a group (``q_b_proj``'s and ``kv_b_proj``'s rows, ``o_proj``'s columns, in
whole heads): the key is rebuilt per head by ``new_empty`` of the heads' shape and two slice
``copy_``s, the shared rope part broadcast to the heads by ``expand`` to a size read from
them (see ``tests/test_filled_in_place.py``). The head dims (``qk_nope_head_dim``,
``v_head_dim``) stay pinned: the query and key are viewed with ``self.qk_head_dim`` and split
at attribute sizes of a dim no group sizes.
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_oracles, group_with

import fxsym
from fxsym.tracer import resolve_example_inputs

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("model_type", ["deepseek_v2", "deepseek_v3"])
def test_mla_lora_ranks_and_heads_are_groups(model_type: str) -> None:
    cfg = transformers.AutoConfig.for_model(
        model_type, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
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
    heads = group_with(sm, f"{attn}.q_b_proj", "out_features")
    assert heads.size == 2 and heads.unit == 8  # qk_nope_head_dim + qk_rope_head_dim
    assert {(f"{attn}.kv_b_proj", "out_features"), (f"{attn}.o_proj", "in_features")} <= set(
        heads.members)
    fxsym.resize(model, sm, {heads.name: [1]})
    mla = model.model.layers[0].self_attn
    assert (mla.q_b_proj.out_features, mla.kv_b_proj.out_features) == (8, 12)
    assert mla.o_proj.in_features == 8
    with torch.no_grad():
        assert model(input_ids=torch.randint(0, 50, (2, 8))).logits.shape == (2, 8, 50)
