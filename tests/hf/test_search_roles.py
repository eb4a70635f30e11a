"""The search knows what each width is (issue 29 §3).

A dense FFN's width, a routed expert's FFN width, a shared expert's width and the experts are
different roles (:func:`fxsym.search.roles`, from the groups' structure: a group sharing a
module with a routed group is an expert FFN width, an FFN-shaped group beside routed experts a
shared expert's, one in a block without them a dense FFN's; a rank between two sized groups,
MLA's, is none of them); sizes are given per role and the search sizes each from its own range.
A parameter target lands as close under it as the steps allow, the target given is printed
with what was reached, and a target above the model is an error. Tiny configs, random weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from ckpt_helpers import TEXT, checkpoint, n_params

import fxsym
from fxsym.prune.cli import main
from fxsym.prune.search import roles, search, sizes_for

#: qwen3_moe with a dense layer: dense FFN 128, expert FFN 32
DENSE_THEN_MOE: dict[str, Any] = dict(
    num_hidden_layers=2, intermediate_size=128, moe_intermediate_size=32, num_experts=4,
    num_experts_per_tok=2, mlp_only_layers=[1], head_dim=16)
BATCHES = [{"input_ids": torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(i))}
           for i in range(2)]


def _build(model_type: str, **config: Any) -> Any:
    base: dict[str, Any] = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                vocab_size=300, max_position_embeddings=64)
    cfg = transformers.AutoConfig.for_model(model_type, **{**base, **config})
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def test_dense_expert_and_shared_widths_are_roles_of_their_own() -> None:
    """qwen2_moe with a dense layer 1 and a shared expert: one group of each role."""
    model = _build("qwen2_moe", num_hidden_layers=2, intermediate_size=96,
                   moe_intermediate_size=32, shared_expert_intermediate_size=24, num_experts=4,
                   num_experts_per_tok=2, mlp_only_layers=[1])
    r = roles(fxsym.analyze(model))
    assert r.ffn == ("model.layers.1.mlp.gate_proj.out_features",)
    assert r.expert_ffn == ("model.layers.0.mlp.experts.gate_up_proj:1#0",)
    assert r.shared_ffn == ("model.layers.0.mlp.shared_expert.gate_proj.out_features",)
    assert r.experts == ("model.layers.0.mlp.gate.weight:0",)


def test_mla_ranks_are_no_ffn_width() -> None:
    """DeepSeek-V3: the dense first layer's MLP is an FFN, the MoE layer's experts and shared
    experts have their roles, and the ranks of MLA (``q_lora_rank``, ``kv_lora_rank``: between
    the hidden size and the heads) are none of them: the search keeps them."""
    model = _build("deepseek_v3", num_hidden_layers=2, intermediate_size=64, num_key_value_heads=4,
                   first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=8,
                   qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, n_routed_experts=8,
                   n_group=4, topk_group=2, num_experts_per_tok=2, moe_intermediate_size=16,
                   n_shared_experts=1)
    r = roles(fxsym.analyze(model))
    assert r.ffn == ("model.layers.0.mlp.gate_proj.out_features",)
    assert r.expert_ffn == ("model.layers.1.mlp.experts.gate_up_proj:1#0",)
    assert r.shared_ffn == ("model.layers.1.mlp.shared_experts.gate_proj.out_features",)
    assert len(r.other) == 4 and all(".self_attn." in n for n in r.other)


@pytest.mark.parametrize("model_type", ["falcon", "bloom", "gpt_bigcode", "gpt2", "llama"])
def test_attention_traced_through_is_no_ffn_width(model_type: str, tiny: Any) -> None:
    """Falcon's multi-query heads (one key head broadcast over the query heads), BLOOM's
    channels of a head (summed over by ``baddbmm`` with the ALiBi bias) and GPTBigCode's
    (summed over by ``scaled_dot_product_attention``) are attention, and GPT-2's ``head_dim``
    is none of the widths: the dense FFN role holds each block's MLP width only."""
    model = tiny(model_type)
    r = roles(fxsym.analyze(model))
    mlp = {"falcon": "mlp.dense_h_to_4h.weight:0", "bloom": "mlp.dense_h_to_4h.out_features",
           "gpt_bigcode": "mlp.c_fc.out_features", "gpt2": "mlp.c_fc.out_features",
           "llama": "mlp.gate_proj.out_features"}[model_type]
    assert len(r.ffn) == 2 and all(n.endswith(mlp) for n in r.ffn), r.ffn


def test_sizes_per_role_on_a_dense_then_moe_model() -> None:
    """``ffn`` sizes the dense layer, ``expert_ffn`` the experts, each in its own range."""
    model = _build("qwen3_moe", **DENSE_THEN_MOE)
    sm = fxsym.analyze(model)
    sizes = sizes_for(sm, ffn=64, expert_ffn=16)
    assert sizes == {"model.layers.1.mlp.gate_proj.out_features": 64,
                     "model.layers.0.mlp.experts.gate_up_proj:1#0": 16}
    fxsym.plan(model, sm, sizes=sizes).apply(model, sm)
    assert (model.config.intermediate_size, model.config.moe_intermediate_size) == (64, 16)


def test_the_search_sizes_each_width_from_its_own_range() -> None:
    """Every candidate gives the dense FFN and the expert FFN the same fraction of their own
    widths (rounded down to their steps: 8 entries for the grouped matmul of the experts)."""
    model = _build("qwen3_moe", **DENSE_THEN_MOE)
    sm = fxsym.analyze(model)
    target = int(n_params(model) * 0.7)
    result = search(model, sm, target_params=target, batches=BATCHES, round_to=1)
    assert result.candidates
    for c in result.candidates:
        assert c.params <= target and c.shared_ffn is None
        assert c.ffn is not None and c.expert_ffn is not None
        assert c.ffn <= 128 and c.expert_ffn <= 32 and c.expert_ffn % 8 == 0
        assert c.expert_ffn <= max(8, 32 * c.ffn // 128 + 8)
    assert any(c.ffn > 32 for c in result.candidates)
    bound = [c.params for c in result.candidates if (c.ffn, c.expert_ffn) != (128, 32)]
    assert bound and all(c.params >= min(bound) for c in result.candidates)  # none far under


def test_a_dense_then_moe_checkpoint_searches_to_a_target(tmp_path: Path) -> None:
    """``fxsym prune CKPT --target-params N --calib F`` on qwen3_moe with a dense layer (the
    report's ``an FFN width 64: group ...experts.gate_up_proj:1#0 has 32 units``): the
    output loads with plain ``from_pretrained`` and holds at most N parameters."""
    src = tmp_path / "in"
    original = checkpoint(src, "qwen3_moe", **DENSE_THEN_MOE)
    (tmp_path / "calib.txt").write_text(TEXT)
    target = int(n_params(original) * 0.7)
    out = tmp_path / "out"
    assert main(["prune", str(src), "--target-params", str(target), "--calib",
                 str(tmp_path / "calib.txt"), "--calib-tokens", "256", "--seq-len", "32",
                 "-o", str(out)]) == 0
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert n_params(pruned) <= target
    c = pruned.config
    assert c.intermediate_size <= 128 and c.moe_intermediate_size <= 32
    with torch.no_grad():
        assert torch.isfinite(pruned(input_ids=torch.tensor([[1, 5, 9, 12]])).logits).all()


def test_the_target_given_is_printed_with_what_was_reached(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--param-ratio 0.5`` on a llama checkpoint: the table is headed by the target (not
    ``candidates for 0 parameters``), every candidate lies within the steps of it (none far
    under: a smaller model offered where a wider one fits), and the reached count is said."""
    src = tmp_path / "in"
    original = checkpoint(src, "llama", num_hidden_layers=4)
    (tmp_path / "calib.txt").write_text(TEXT)
    total = n_params(original)
    target = int(total * 0.5)
    assert main(["prune", str(src), "--param-ratio", "0.5", "--calib",
                 str(tmp_path / "calib.txt"), "--calib-tokens", "256", "--seq-len", "32",
                 "-o", str(tmp_path / "out")]) == 0
    said = capsys.readouterr().out
    assert f"candidates for {target:,} parameters (--param-ratio 0.5 of {total:,}):" in said
    plan = fxsym.Plan.from_json(_plan_json(tmp_path / "out"))
    rows = plan.extra["search"]
    assert all(0.97 * target <= r["params"] <= target for r in rows), rows
    reached = plan.extra["target"]["reached"]
    assert plan.extra["target"]["params"] == target and reached == plan.params_after
    assert f"target: {target:,} parameters" in said and f"reached {reached:,} parameters" in said


def _plan_json(out: Path) -> str:
    import json

    return json.dumps(json.loads((out / "fxsym.json").read_text())["plan"])


def test_a_target_above_the_model_is_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A parameter target above the model's count is refused, never an unpruned copy: by
    ``fxsym.plan``, the search, ``prune_checkpoint`` and the CLI (checkpoint and in-memory
    model), each saying the model's count; ``OUT`` is not written."""
    model = _build("llama", num_hidden_layers=2, intermediate_size=96)
    sm = fxsym.analyze(model)
    above = n_params(model) + 1
    with pytest.raises(fxsym.PlanError, match=f"above the model's {n_params(model):,}"):
        fxsym.plan(model, sm, target_params=above)
    with pytest.raises(fxsym.PlanError, match="above the model's"):
        search(model, sm, target_params=above, batches=BATCHES)
    src = tmp_path / "in"
    original = checkpoint(src, "llama", num_hidden_layers=2)
    (tmp_path / "calib.txt").write_text(TEXT)
    above = n_params(original) + 1
    for kwargs in ({}, {"search": True, "calibration": tmp_path / "calib.txt"}):
        with pytest.raises(fxsym.PlanError, match=f"above the checkpoint's {above - 1:,}"):
            fxsym.prune_checkpoint(src, tmp_path / "out", target_params=above, **kwargs)
    assert not (tmp_path / "out").exists()
    capsys.readouterr()
    assert main(["prune", str(src), "--target-params", str(above), "--importance", "l2",
                 "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("fxsym: ")] == [
        f"fxsym: PlanError: target_params {above:,} is above the checkpoint's {above - 1:,} "
        f"parameters: nothing to prune; give a target under {above - 1:,}"]
    assert main(["prune", "test_search_roles:make_llama", "--target-params", "10000000",
                 "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("fxsym: ")] == [
        "fxsym: PlanError: the target of 10,000,000 parameters is above the model's 100,160: "
        "nothing to prune; give a target under 100,160"]
    assert not (tmp_path / "out").exists()


def make_llama() -> Any:
    """A tiny llama for the CLI (``test_search_roles:make_llama``)."""
    return _build("llama", num_hidden_layers=2, intermediate_size=96)
