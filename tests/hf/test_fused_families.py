"""Families whose attention cuts one fused projection (issue 11, part 2), traced through.

BLOOM views ``query_key_value`` as ``(heads, 3, head_dim)``; its heads are pinned by the
ALiBi bias, built from the head count, so each layer's ``head_dim`` (the same entries in
every head's query, key and value) is a group. Phi-3 slices ``qkv_proj`` at
``config.num_attention_heads * self.head_dim`` and ``+ self.num_key_value_heads *
self.head_dim``: with ``head_dim`` pinned (rotary), the bounds are linear in the head counts,
so the query and key blocks are tied to those attributes, and each layer's key/value heads
(with their query heads) are a group; the config field is shared, so both layers keep as
many heads.
"""

from __future__ import annotations

from conftest import build
from helpers import assert_oracles, group_with
from torch import nn

import fxsym
from fxsym.tracer import resolve_example_inputs


def _coverage(model: nn.Module, sm: fxsym.SymMap) -> float:
    """The share of Linear and Embedding modules whose output dim is a member of a group."""
    members = {m for g in sm.groups() for m in g.members}
    outputs = {nn.Linear: "out_features", nn.Embedding: "embedding_dim"}
    found = [(name, outputs[type(mod)]) in members for name, mod in model.named_modules()
             if type(mod) in outputs]
    return sum(found) / len(found)


def test_bloom_keeps_head_dim_of_the_interleaved_projection() -> None:
    model = build("bloom")
    sm = assert_oracles(model, resolve_example_inputs(model, None), min_groups=5)
    assert _coverage(model, sm) >= 0.8
    for i in (0, 1):
        attn = f"transformer.h.{i}.self_attention"
        head_dim = group_with(sm, attn, "attr:head_dim")
        assert head_dim.size == 16
        assert set(head_dim.members) == {(f"{attn}.query_key_value", "out_features"),
                                         (attn, "attr:head_dim"), (f"{attn}.dense", "in_features")}
    assert any(e.kind == "alternative" for e in sm.trace_report)


def test_phi3_keeps_the_heads_of_its_sliced_projection() -> None:
    model = build("phi3")
    sm = assert_oracles(model, resolve_example_inputs(model, None), min_groups=5)
    assert _coverage(model, sm) >= 0.8
    first, second = (group_with(sm, f"model.layers.{i}.self_attn", "attr:num_key_value_heads")
                     for i in (0, 1))
    assert first.size == second.size == 2  # key/value heads, each with its query heads
    for i, group in enumerate((first, second)):
        attn = f"model.layers.{i}.self_attn"
        assert {(f"{attn}.qkv_proj", "out_features"), (f"{attn}.o_proj", "in_features"),
                (attn, "attr:num_key_value_heads")} <= set(group.members)
    # config.num_attention_heads is read by both layers: their head counts stay equal
    assert (("model.layers.0.self_attn", "attr:config.num_attention_heads") in first.members)
    assert first.same_size == (second.name,)
    messages = [e.message for e in sm.trace_report]
    assert "a factor of a product of sizes bounding a slice" in messages  # head_dim
