"""Targets (issue 22 §4): explicit sizes mapped to groups by what they hold, and the search of
uniform architectures for a parameter target, scored by calibration loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import fxsym
from fxsym.search import active_params, roles, search, sizes_for

transformers = pytest.importorskip("transformers")

_CFG = dict(hidden_size=64, intermediate_size=192, vocab_size=128, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64)
BATCHES = [{"input_ids": torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(i))}
           for i in range(2)]


def _build(model_type: str = "llama", **overrides: Any) -> Any:
    cfg = transformers.AutoConfig.for_model(model_type, **{**_CFG, **overrides})
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def test_roles_come_from_groups() -> None:
    model = _build()
    sm = fxsym.analyze(model)
    r = roles(sm)
    assert r.hidden == ("model.embed_tokens.embedding_dim",)
    assert r.layers == "model.layers.depth"
    assert len(r.ffn) == len(r.heads) == len(r.queries) == 4
    assert all(".mlp." in n for n in r.ffn)


def test_explicit_sizes_round_trip(tmp_path: Path) -> None:
    model = _build("qwen2")
    sm = fxsym.analyze(model)
    sizes = sizes_for(sm, hidden=48, ffn=96, heads=4, kv_heads=2)
    plan = fxsym.plan(model, sm, sizes=sizes, layers=[0, 1, 3])
    plan.apply(model, sm)
    cfg = model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.num_hidden_layers) == (48, 96, 4, 2, 3)
    model.save_pretrained(tmp_path)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = BATCHES[0]["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits, rtol=0, atol=0)
    with pytest.raises(fxsym.PlanError, match="multiple"):
        sizes_for(sm, heads=5, kv_heads=2)


def test_search_meets_the_target_and_lists_the_candidates() -> None:
    model = _build()
    sm = fxsym.analyze(model)
    before = sum(p.numel() for p in model.parameters())
    target = before // 2
    result = search(model, sm, target_params=target, batches=BATCHES, round_to=8)
    assert len(result.candidates) >= 5
    assert {c.layers for c in result.candidates} >= {4, 3, 2}
    assert all(c.params <= target for c in result.candidates)
    assert result.best.loss == min(c.loss for c in result.candidates)
    table = result.table()
    assert table.count("\n") >= len(result.candidates) and "<- kept" in table
    plan = result.plan
    assert plan.params_after <= target
    plan.apply(model, sm)
    assert sum(p.numel() for p in model.parameters()) == plan.params_after
    with torch.no_grad():
        assert torch.isfinite(model(**BATCHES[0]).logits).all()


def test_active_parameters_leave_out_the_lookup_table() -> None:
    model = _build()
    sm = fxsym.analyze(model)
    total, skipped = active_params(model, sm)
    assert skipped == {"model.embed_tokens.weight"}
    assert total == sum(p.numel() for p in model.parameters()) - 128 * 64
    result = search(model, sm, target_params=total // 2, batches=BATCHES, round_to=8,
                    active=True)
    assert all(c.params <= total // 2 for c in result.candidates)


def test_experts_are_a_role_of_their_own(tmp_path: Path) -> None:
    """A MoE's routed groups (the experts per layer) are not FFN widths: ``ffn`` sizes the
    expert FFN width, ``experts`` the number of experts, and the config follows both."""
    model = _build("qwen3_moe", moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                   decoder_sparse_step=1, head_dim=8)
    sm = fxsym.analyze(model)
    r = roles(sm)
    assert len(r.experts) == 4 and not set(r.experts) & set(r.ffn)
    sizes = sizes_for(sm, ffn=16, experts=2)
    fxsym.plan(model, sm, sizes=sizes).apply(model, sm)
    assert (model.config.moe_intermediate_size, model.config.num_experts) == (16, 2)
    assert model.model.layers[0].mlp.experts.gate_up_proj.shape == (2, 32, 64)
    with pytest.raises(fxsym.PlanError, match="experts"):
        sizes_for(fxsym.analyze(_build("qwen3_moe", num_experts=4, num_experts_per_tok=2,
                                       head_dim=8)), experts=1)
