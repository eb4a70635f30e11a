"""Families whose projections are subclasses with their own ``forward`` (Falcon's
``FalconLinear``: ``input @ self.weight.T``) and GPT-J, whose heads are split by shapes joined
from tuples: coverage counting every member, both oracles."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import build
from helpers import assert_oracles, group_with
from torch import nn
from transformers.pytorch_utils import Conv1D

import fxsym
from fxsym.tracer import resolve_example_inputs

#: a projection family -> (its output symbol, the parameter member a subclass traced into has)
OUTPUT: dict[type, tuple[str, str]] = {
    nn.Linear: ("out_features", "weight:0"), Conv1D: ("out_features", "weight:1"),
    nn.Embedding: ("embedding_dim", "weight:1")}


def coverage(model: nn.Module, sm: fxsym.SymMap) -> tuple[int, int]:
    """(projections whose output dim is a group member, projections), subclasses included."""
    members = {m for g in sm.groups() for m in g.members}
    live = total = 0
    for name, mod in model.named_modules():
        keys = next((k for cls, k in OUTPUT.items() if isinstance(mod, cls)), None)
        if keys is not None:
            total += 1
            live += any((name, k) in members for k in keys)
    return live, total


def test_falcon_linear_gets_the_groups_of_nn_linear() -> None:
    model = build("falcon")
    inputs = resolve_example_inputs(model, None)
    sm = assert_oracles(model, inputs, min_groups=5)
    live, total = coverage(model, sm)
    assert (live, total) == (9, 10)  # all but lm_head, the output contract
    for i in (0, 1):
        mlp = f"transformer.h.{i}.mlp"
        g = group_with(sm, f"{mlp}.dense_h_to_4h", "weight:0")
        assert g.size == 256 and g.is_sortable
        assert set(g.members) == {(f"{mlp}.dense_h_to_4h", "weight:0"),
                                  (f"{mlp}.dense_4h_to_h", "weight:1"),
                                  (f"{mlp}.dense_h_to_4h", "attr:out_features"),
                                  (f"{mlp}.dense_4h_to_h", "attr:in_features")}
        # multi-query: the fused projection is query heads, then one key and one value head
        attn = f"transformer.h.{i}.self_attention"
        heads = group_with(sm, attn, "attr:num_heads")
        assert heads.size == 4 and heads.is_sortable
        assert set(heads.members) == {(f"{attn}.query_key_value", "weight:0"),
                                      (attn, "attr:num_heads"), (f"{attn}.dense", "weight:1"),
                                      (f"{attn}.query_key_value", "attr:out_features"),
                                      (f"{attn}.dense", "attr:in_features")}
    hidden = next(g for g in sm.groups() if ("transformer.word_embeddings", "embedding_dim")
                  in g.members)
    assert ("transformer.h.0.self_attention.dense", "weight:0") in hidden.members
    name = group_with(sm, "transformer.h.0.self_attention", "attr:num_heads").name
    small, small_sm = copy.deepcopy((model, sm))
    fxsym.resize(small, small_sm, {name: [3, 1]})
    attn = small.transformer.h[0].self_attention
    assert attn.num_heads == 2 and attn.query_key_value.weight.shape == (2 * 16 + 2 * 16, 64)
    assert (attn.query_key_value.out_features, attn.dense.in_features) == (64, 32)
    original = model.transformer.h[0].self_attention.query_key_value.weight
    torch.testing.assert_close(attn.query_key_value.weight[:16], original[48:64])
    torch.testing.assert_close(attn.query_key_value.weight[32:], original[64:])
    out = small(**inputs).logits
    assert out.shape == model(**inputs).logits.shape and torch.isfinite(out).all()


def test_gptj_heads_follow_the_attribute_that_splits_them() -> None:
    model = build("gptj")
    inputs = resolve_example_inputs(model, None)
    sm = assert_oracles(model, inputs, min_groups=3)
    live, total = coverage(model, sm)
    assert live / total >= 0.9, (live, total)
    heads = group_with(sm, "transformer.h.0.attn.q_proj", "out_features")
    assert heads.size == 4
    assert ("transformer.h.0.attn", "attr:num_attention_heads") in heads.members
    small, small_sm = copy.deepcopy((model, sm))
    fxsym.resize(small, small_sm, {heads.name: 2})
    assert small.transformer.h[0].attn.num_attention_heads == 2
    out = small(**inputs).logits
    assert out.shape == model(**inputs).logits.shape and torch.isfinite(out).all()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_families_without_subclasses_keep_their_coverage(family: str) -> None:
    model = build(family)
    sm = fxsym.analyze(model)
    live, total = coverage(model, sm)
    assert live / total >= 0.9, (live, total)
