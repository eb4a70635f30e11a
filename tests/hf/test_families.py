"""Every acceptance family: analyze with no inputs, both oracles, and the expected groups."""

from __future__ import annotations

import pytest
import torch
from conftest import build
from helpers import assert_oracles, group_with

import fxsym
from fxsym.tracer import resolve_example_inputs

FAMILIES = ["gpt2", "llama", "mistral", "qwen2", "opt", "bert", "distilbert", "t5", "vit"]
LAYERS = (0, 1)

#: per family: (attention module path, MLP producer path) with {i} for the layer
PATHS = {
    "gpt2": ("transformer.h.{i}.attn", ["transformer.h.{i}.mlp.c_fc"]),
    "llama": ("model.layers.{i}.self_attn", ["model.layers.{i}.mlp.gate_proj"]),
    "mistral": ("model.layers.{i}.self_attn", ["model.layers.{i}.mlp.gate_proj"]),
    "qwen2": ("model.layers.{i}.self_attn", ["model.layers.{i}.mlp.gate_proj"]),
    "opt": ("model.decoder.layers.{i}.self_attn", ["model.decoder.layers.{i}.fc1"]),
    "bert": ("bert.encoder.layer.{i}.attention.self",
             ["bert.encoder.layer.{i}.intermediate.dense"]),
    "distilbert": ("distilbert.transformer.layer.{i}.attention",
                   ["distilbert.transformer.layer.{i}.ffn.lin1"]),
    "t5": (None, ["encoder.block.{i}.layer.1.DenseReluDense.wi",
                  "decoder.block.{i}.layer.2.DenseReluDense.wi"]),
    "vit": ("vit.layers.{i}.attention", ["vit.layers.{i}.mlp.fc1"]),
}


#: per family: a member of the hidden-size group
HIDDEN = {
    "gpt2": ("transformer.wte", "embedding_dim"),
    "opt": ("model.decoder.embed_tokens", "embedding_dim"),
    "bert": ("bert.embeddings.word_embeddings", "embedding_dim"),
    "distilbert": ("distilbert.embeddings.word_embeddings", "embedding_dim"),
    "t5": ("lm_head", "in_features"),
    "vit": ("vit.embeddings.patch_embeddings.projection", "out_channels"),
}


def _hidden_group(family: str, sm: fxsym.SymMap) -> fxsym.SymGroup:
    key = HIDDEN.get(family, ("model.embed_tokens", "embedding_dim"))
    found = [g for g in sm.groups() if key in g.members]
    assert len(found) == 1, [g.name for g in sm.groups()]
    assert sm.analysis is not None
    if ("lm_head", "in_features") in sm.analysis.symbol_dims:  # the LM head reads the hidden
        assert ("lm_head", "in_features") in found[0].members
    return found[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_family_analyzes_without_inputs_and_passes_both_oracles(family: str) -> None:
    model = build(family)
    sm = fxsym.analyze(model)  # no example inputs: the hf plugin supplies them
    inputs = resolve_example_inputs(model, None)
    sm2 = assert_oracles(model, inputs, min_groups=3)
    assert [g.name for g in sm.groups()] == [g.name for g in sm2.groups()]
    hidden = _hidden_group(family, sm)
    assert hidden.size == 64 and hidden.is_sortable
    attn_path, mlp_paths = PATHS[family]
    for i in LAYERS:
        for mlp in mlp_paths:
            g = group_with(sm, mlp.format(i=i), "out_features")
            assert g.size == 128 and g.is_sortable and len(g.members) >= 2
        if attn_path is None:
            continue
        heads = group_with(sm, attn_path.format(i=i), "heads")
        assert heads.is_sortable
        # attention input and output (projected or not) meet the hidden size
        attn = attn_path.format(i=i)
        assert (attn, "hidden") in hidden.members


def test_t5_self_attention_heads_are_tied_across_each_stack() -> None:
    """T5 attention shares one per-head position bias across a stack's layers: it is traced
    through (not a leaf), and the heads of every self-attention layer form one group."""
    model = build("t5")
    sm = fxsym.analyze(model)
    for stack in ("encoder", "decoder"):
        g = group_with(sm, f"{stack}.block.0.layer.0.SelfAttention.q", "out_features")
        assert g.size == 4 and g.is_sortable  # units are heads of d_kv features
        members = set(g.members)
        for i in LAYERS:
            attn = f"{stack}.block.{i}.layer.0.SelfAttention"
            assert {(f"{attn}.{p}", "out_features") for p in "qkv"} <= members
            assert (f"{attn}.o", "in_features") in members
        assert (f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias",
                "embedding_dim") in members
    # cross-attention heads are groups of their own (tests/hf/test_other_families.py)
    cross = group_with(sm, "decoder.block.0.layer.1.EncDecAttention.q", "out_features")
    assert ("decoder.block.0.layer.0.SelfAttention.q", "out_features") not in cross.members


@pytest.mark.parametrize("family", ["qwen3", "gemma", "roberta"])
def test_other_families_need_no_code_of_their_own(family: str) -> None:
    model = build(family)
    sm = assert_oracles(model, resolve_example_inputs(model, None), min_groups=3)
    members = [m for g in sm.groups() for m in g.members]
    assert any(symbol == "heads" for _, symbol in members)
    assert any(q.endswith(("gate_proj", "intermediate.dense")) and s == "out_features"
               for q, s in members)


def test_tied_embeddings_and_lm_head_are_resized_together() -> None:
    model = build("gpt2")
    assert model.lm_head.weight is model.transformer.wte.weight
    sm = fxsym.analyze(model)
    g = group_with(sm, "transformer.wte", "embedding_dim")
    assert ("lm_head", "in_features") in g.members
    keep = torch.arange(0, 64, 2)
    fxsym.resize(model, sm, {g.name: keep})
    assert model.lm_head.weight is model.transformer.wte.weight  # still one parameter
    assert model.lm_head.weight.shape == (100, 32)
    with torch.no_grad():
        assert model(input_ids=torch.randint(0, 100, (2, 5))).logits.shape == (2, 5, 100)
