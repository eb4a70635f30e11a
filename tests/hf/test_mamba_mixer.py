"""Jamba's Mamba mixer (issue 21): ``in_proj`` gives the mixer's inner channels and the gate,
a causal depthwise ``F.conv1d`` (``groups=hidden_states.shape[1]``) reads the mixer's
``conv1d.weight`` without calling the module, ``dt_proj`` and ``out_proj`` close the block.
The inner channels are one group from ``in_proj`` through the conv (weight rows and bias, the
Conv1d's ``in_channels``/``out_channels``/``groups`` set with them) to ``out_proj``.
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_oracles, group_with

from fxsym.tracer import resolve_example_inputs

transformers = pytest.importorskip("transformers")


def test_jamba_mamba_inner_channels_are_a_group() -> None:
    cfg = transformers.AutoConfig.for_model(
        "jamba", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=50, num_experts=2,
        num_experts_per_tok=1, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
        expert_layer_offset=1, mamba_d_state=4, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    inputs = resolve_example_inputs(model, None)
    sm = assert_oracles(model, inputs)
    mixer = "model.layers.0.mamba"
    g = group_with(sm, f"{mixer}.conv1d", "weight:0")
    assert {(f"{mixer}.conv1d", "bias:0"), (f"{mixer}.dt_proj", "weight:0"),
            (f"{mixer}.out_proj", "in_features"), (f"{mixer}.conv1d", "attr:groups"),
            (f"{mixer}.conv1d", "attr:in_channels")} <= set(g.members)
