"""Attention leaves: head units, grouped-query ties, fused projections, rotary head_dim."""

from __future__ import annotations

import torch
from conftest import build
from helpers import group_with

import fxsym
from fxsym.tracer import resolve_example_inputs


def _run(model: torch.nn.Module) -> torch.Tensor:
    inputs = resolve_example_inputs(model, None)
    with torch.no_grad():
        return model(**inputs).logits


def test_grouped_query_heads_keep_each_kv_head_with_its_query_group() -> None:
    model = build("llama")  # 4 query heads, 2 key/value heads, head_dim 16
    attn = model.model.layers[0].self_attn
    q, k, o = (attn.q_proj.weight.clone(), attn.k_proj.weight.clone(),
               attn.o_proj.weight.clone())
    sm = fxsym.analyze(model)
    heads = group_with(sm, "model.layers.0.self_attn", "heads")
    assert heads.size == 2
    assert group_with(sm, "model.layers.0.self_attn", "queries_per_kv").size == 2
    head_dim = sm.get_symbol(attn, "head_dim")
    assert head_dim.is_constant and not head_dim.is_sortable  # rotary pairs its halves
    fxsym.resize(model, sm, {heads.name: [1]})
    # key/value head 1 serves query heads 2 and 3: rows 32..63 of q, 16..31 of k
    torch.testing.assert_close(attn.q_proj.weight, q[32:64])
    torch.testing.assert_close(attn.k_proj.weight, k[16:32])
    torch.testing.assert_close(attn.o_proj.weight, o[:, 32:64])
    assert attn.num_key_value_groups == 2
    assert _run(model).shape == (2, 8, 100)


def test_queries_per_kv_shrinks_every_group_alike() -> None:
    model = build("mistral")
    attn = model.model.layers[1].self_attn
    q = attn.q_proj.weight.clone()
    sm = fxsym.analyze(model)
    queries = group_with(sm, "model.layers.1.self_attn", "queries_per_kv")
    fxsym.resize(model, sm, {queries.name: [1]})
    # query heads 1 and 3 (the second of each group) remain
    torch.testing.assert_close(attn.q_proj.weight, torch.cat([q[16:32], q[48:64]]))
    assert attn.num_key_value_groups == 1 and attn.k_proj.out_features == 32
    assert _run(model).shape == (2, 8, 100)


def test_gpt2_fused_qkv_keeps_heads_in_all_three_thirds() -> None:
    model = build("gpt2")
    attn = model.transformer.h[0].attn
    w = attn.c_attn.weight.clone()  # Conv1D: (in, 3 * 64)
    sm = fxsym.analyze(model)
    assert group_with(sm, "transformer.h.0.attn", "head_dim").is_sortable  # no rotary here
    fxsym.resize(model, sm, {group_with(sm, "transformer.h.0.attn", "heads").name: [2, 0]})
    cols = [*range(32, 48), *range(0, 16)]
    expected = torch.cat([w[:, cols], w[:, [64 + c for c in cols]],
                          w[:, [128 + c for c in cols]]], 1)
    torch.testing.assert_close(attn.c_attn.weight, expected)
    assert (attn.c_attn.nf, attn.c_proj.nx, attn.split_size, attn.num_heads) == (96, 32, 32, 2)
    assert _run(model).shape == (2, 8, 100)


def test_unprojected_heads_are_the_outgoing_symbol() -> None:
    model = build("bert")
    self_attn = model.bert.encoder.layer[0].attention.self
    sm = fxsym.analyze(model)
    g = group_with(sm, "bert.encoder.layer.0.attention.self", "heads")
    assert g.size == 4
    assert ("bert.encoder.layer.0.attention.output.dense", "in_features") in g.members
    fxsym.resize(model, sm, {g.name: [3]})
    assert self_attn.query.out_features == 16 and self_attn.all_head_size == 16
    assert self_attn.num_attention_heads == 1
    assert model.bert.encoder.layer[0].attention.output.dense.in_features == 16
    inputs = resolve_example_inputs(model, None)
    with torch.no_grad():
        assert model(**inputs).logits.shape == (2, 3)


def test_opt_head_count_attribute_follows_the_resize() -> None:
    model = build("opt")  # OPT writes num_heads into its view
    sm = fxsym.analyze(model)
    attn = model.model.decoder.layers[0].self_attn
    name = "model.decoder.layers.0.self_attn"
    fxsym.resize(model, sm, {group_with(sm, name, "heads").name: [0, 3],
                             group_with(sm, name, "head_dim").name: 8})
    assert (attn.num_heads, attn.head_dim, attn.q_proj.out_features) == (2, 8, 16)
    assert _run(model).shape == (2, 8, 100)


def test_head_layout_attributes_are_declared_members_kept_by_resize() -> None:
    """The resize rule only slices projections: ``num_heads``/``head_dim``/``split_size``
    follow through the SymInfo's declarations, which users see as group members."""
    model = build("gpt2")
    sm = fxsym.analyze(model)
    attn = model.transformer.h[0].attn
    assert {str(e) for e in sm.sym_info(attn).attributes.values()} == {
        "heads", "head_dim", "heads * head_dim"}
    name = "transformer.h.0.attn"
    assert {(name, "attr:num_heads"), (name, "attr:split_size")} <= set(
        group_with(sm, name, "heads").members)
    assert (name, "attr:head_dim") in group_with(sm, name, "head_dim").members
    fxsym.resize(model, sm, {group_with(sm, name, "heads").name: [3, 0],
                             group_with(sm, name, "head_dim").name: 5})
    assert (attn.num_heads, attn.head_dim, attn.split_size) == (2, 5, 10)
    assert attn.c_attn.nf == 30
    assert _run(model).shape == (2, 8, 100)
