"""Targets (issue 22 §4): explicit sizes mapped to groups by what they hold, and the search of
uniform architectures for a parameter target, scored by calibration loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import fxsym
from fxsym.prune.search import active_params, roles, search, sizes_for

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
    assert result.best.loss == min(c.loss for c in result.candidates if c.scored)
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
    """A MoE's routed groups (the experts per layer) are not FFN widths: ``expert_ffn`` sizes
    the expert FFN width, ``experts`` the number of experts, and the config follows both;
    ``ffn`` (a dense FFN width, which this model has none of) names the role it has."""
    model = _build("qwen3_moe", moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                   decoder_sparse_step=1, head_dim=8)
    sm = fxsym.analyze(model)
    r = roles(sm)
    assert len(r.experts) == 4 and not set(r.experts) & set(r.expert_ffn)
    assert len(r.expert_ffn) == 4 and not r.ffn and not r.shared_ffn
    with pytest.raises(fxsym.PlanError, match=r"dense FFN width; .* --expert-ffn"):
        sizes_for(sm, ffn=16)
    sizes = sizes_for(sm, expert_ffn=16, experts=2)
    fxsym.plan(model, sm, sizes=sizes).apply(model, sm)
    assert (model.config.moe_intermediate_size, model.config.num_experts) == (16, 2)
    assert model.model.layers[0].mlp.experts.gate_up_proj.shape == (2, 32, 64)
    with pytest.raises(fxsym.PlanError, match="experts"):
        sizes_for(fxsym.analyze(_build("qwen3_moe", num_experts=4, num_experts_per_tok=2,
                                       head_dim=8)), experts=1)


_MOE = {"mixtral": dict(num_local_experts=4, intermediate_size=32),
        "qwen3_moe": dict(num_experts=4, moe_intermediate_size=32, decoder_sparse_step=1,
                          head_dim=8, intermediate_size=32)}


def _moe(model_type: str) -> Any:
    return _build(model_type, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  num_experts_per_tok=2, **_MOE[model_type])


def make_mixtral() -> Any:
    """A tiny Mixtral for the CLI (``test_targets:make_mixtral``)."""
    return _moe("mixtral")


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe"])
def test_experts_keep_n_per_layer_and_reload(model_type: str, tmp_path: Path) -> None:
    """``experts=3`` keeps 3 of 4 experts in every MoE layer: the fused tensors, the router's
    rows and the config's count follow, and plain ``from_pretrained`` gives the same logits;
    fewer experts than the router picks (2) is an error naming the reason."""
    model = _moe(model_type)
    sm = fxsym.analyze(model)
    r = roles(sm)
    assert len(r.experts) == 2
    with pytest.raises(fxsym.PlanError, match="an op picks 2 of group"):
        sizes_for(sm, experts=1)
    fxsym.plan(model, sm, sizes=sizes_for(sm, experts=3)).apply(model, sm)
    for layer in model.model.layers:
        assert layer.mlp.experts.gate_up_proj.shape[0] == 3
        assert layer.mlp.experts.down_proj.shape[0] == 3
        assert layer.mlp.gate.weight.shape[0] == 3
    field = "num_local_experts" if model_type == "mixtral" else "num_experts"
    assert getattr(model.config, field) == 3
    model.save_pretrained(tmp_path)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = BATCHES[0]["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe"])
def test_active_parameters_of_a_moe(model_type: str) -> None:
    """Per token: attention, norms, router and head whole, the expert tensors ``top_k / E``
    of them (2 of 4 experts), the embedding table not at all. Counted by hand from the
    config; one expert fewer takes only the router's row for it (a token still uses 2)."""
    model = _moe(model_type)
    sm = fxsym.analyze(model)
    h, v, f, e, k, layers = 64, 128, 32, 4, 2, 2
    heads, kv, hd = 4, 2, (16 if model_type == "mixtral" else 8)
    attention = h * heads * hd * 2 + 2 * h * kv * hd
    qk_norms = 2 * hd if model_type == "qwen3_moe" else 0
    per_layer = attention + qk_norms + 2 * h + e * h + k * (h * 2 * f + f * h)
    hand = layers * per_layer + h + v * h
    total, skipped = active_params(model, sm)
    assert skipped == {"model.embed_tokens.weight"}
    assert total == hand
    unused = v * h + layers * (e - k) * 3 * h * f
    assert sum(p.numel() for p in model.parameters()) == hand + unused
    fxsym.plan(model, sm, sizes=sizes_for(sm, experts=3)).apply(model, sm)
    assert active_params(model, fxsym.analyze(model))[0] == hand - layers * h


def test_active_target_search_on_a_moe() -> None:
    """``search(active=True)`` meets an active-parameter target on a MoE (widths and depth;
    the experts stay), and the kept plan's model has that many active parameters at most."""
    model = _moe("qwen3_moe")
    sm = fxsym.analyze(model)
    total, _ = active_params(model, sm)
    target = total * 3 // 4
    result = search(model, sm, target_params=target, batches=BATCHES, round_to=8, active=True)
    assert all(c.params <= target for c in result.candidates)
    result.plan.apply(model, sm)
    assert model.config.num_experts == 4
    assert active_params(model, fxsym.analyze(model))[0] == result.best.params


def test_cli_experts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fxsym.prune.cli import main

    assert main(["prune", "test_targets:make_mixtral", "--experts", "3", "--json",
                 "-o", str(tmp_path / "x")]) == 0
    plan = fxsym.Plan.from_json(capsys.readouterr().out)
    kept = {k: len(v) for k, v in plan.choices().items() if "mlp.gate" in k}
    assert kept == {f"model.layers.{i}.mlp.gate.weight:0": 3 for i in range(2)}
    assert main(["prune", "test_targets:make_mixtral", "--experts", "1",
                 "-o", str(tmp_path / "y")]) == 2
    assert "an op picks 2 of group" in capsys.readouterr().err


@pytest.mark.parametrize("model_type", ["olmoe", "qwen2_moe"])
def test_the_ffn_role_holds_the_mlp_and_expert_widths_only(model_type: str) -> None:
    """OLMoE normalises its queries and keys over every head (``q_norm`` over ``q_proj``'s
    output): its attention is traced through, so its key/value-head groups are rooted at
    ``q_proj.out_features``, not at an attention leaf's ``heads``. They are attention (their
    units are a batch dim of the product of queries and keys), not FFN widths: the expert
    FFN widths (``expert_ffn``) and the shared experts' MLP widths (``shared_ffn``) are
    exactly the MLP groups, and sizing them leaves the attention whole."""
    extra = dict(moe_intermediate_size=32, shared_expert_intermediate_size=24,
                 decoder_sparse_step=1) if model_type == "qwen2_moe" else {}
    model = _build(model_type, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                   intermediate_size=32, **extra)
    sm = fxsym.analyze(model)
    r = roles(sm)
    mlp = {g.name for g in sm.groups() if not g.routed and g.name not in r.hidden
           and all(".mlp." in q for q, _ in g.members)}
    assert len(mlp) == (4 if model_type == "qwen2_moe" else 2)
    assert set(r.expert_ffn) | set(r.shared_ffn) == mlp and not r.ffn
    assert len(r.shared_ffn) == (2 if model_type == "qwen2_moe" else 0)
    attention = {g.name for g in sm.groups()
                 if all(".self_attn" in q for q, _ in g.members)}
    assert len(attention) >= 2 and not attention & mlp
    assert attention <= set(r.heads) | set(r.queries) | set(r.attention)
    sizes = sizes_for(sm, expert_ffn=16,
                      shared_ffn=16 if model_type == "qwen2_moe" else None)
    assert set(sizes) == mlp
