"""OLMo, DeBERTa-v2 and T5 (issue 11): coverage counting every member, both oracles.

* OLMo's LayerNorm has no weight and keeps ``self.normalized_shape = (hidden,)``, a tuple
  attribute: read element by element as sizes, it is tied to the hidden size instead of
  pinning it (``(norm, "attr:normalized_shape[0]")``).
* T5's cross-attention adds a zero position bias ``torch.zeros((1, self.n_heads, q, k))``:
  a tensor of one repeated value follows what sizes it, so the heads stay a group and
  ``n_heads`` follows a resize.
"""

from __future__ import annotations

import pytest
from conftest import build
from helpers import assert_oracles, group_with
from torch import nn

import fxsym
from fxsym.tracer import resolve_example_inputs

OUTPUT = {nn.Linear: "out_features", nn.Embedding: "embedding_dim"}


def _coverage(model: nn.Module, sm: fxsym.SymMap) -> float:
    """The share of Linear and Embedding modules whose output dim is a member of a group."""
    members = {m for g in sm.groups() for m in g.members}
    found = [(name, OUTPUT[type(mod)]) in members for name, mod in model.named_modules()
             if type(mod) in OUTPUT]
    return sum(found) / len(found)


@pytest.mark.parametrize("family", ["olmo", "deberta-v2", "t5"])
def test_family_coverage_and_both_oracles(family: str) -> None:
    model = build(family)
    sm = assert_oracles(model, resolve_example_inputs(model, None), min_groups=5)
    assert _coverage(model, sm) >= 0.8, [g.name for g in sm.groups()]


def test_olmo_layer_norms_follow_the_hidden_size() -> None:
    model = build("olmo")
    sm = fxsym.analyze(model)
    hidden = next(g for g in sm.groups() if ("model.embed_tokens", "embedding_dim") in g.members)
    assert hidden.size == 64 and hidden.is_sortable
    for norm in ("model.layers.0.input_layernorm", "model.layers.1.post_attention_layernorm",
                 "model.norm"):
        assert (norm, "attr:normalized_shape[0]") in hidden.members
    for i in (0, 1):
        assert (f"model.layers.{i}.self_attn.o_proj", "out_features") in hidden.members
    fxsym.resize(model, sm, {hidden.name: 32})
    assert model.model.norm.normalized_shape == (32,)
    inputs = resolve_example_inputs(model, None)
    assert model(**inputs).logits.shape[-1] == 100


def test_t5_cross_attention_heads_are_a_group() -> None:
    model = build("t5")
    sm = fxsym.analyze(model)
    g = group_with(sm, "decoder.block.0.layer.1.EncDecAttention.q", "out_features")
    assert g.size == 4 and g.is_sortable  # heads of d_kv features
    members = set(g.members)
    for i in (0, 1):  # the zero bias of layer 0 is shared by the later layers
        attn = f"decoder.block.{i}.layer.1.EncDecAttention"
        assert {(f"{attn}.{p}", "out_features") for p in "qkv"} <= members
        assert (f"{attn}.o", "in_features") in members
    assert ("decoder.block.0.layer.1.EncDecAttention", "attr:n_heads") in members
    fxsym.resize(model, sm, {g.name: [1, 3]})
    assert model.decoder.block[0].layer[1].EncDecAttention.n_heads == 2
    inputs = resolve_example_inputs(model, None)
    assert model(**inputs).logits.shape[-1] == 100
