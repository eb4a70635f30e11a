"""Mixture-of-experts families (issue 21, part 1): transformers 5 fuses each layer's experts
into 3-D parameters, ``experts.gate_up_proj`` ``[E, 2I, H]`` and ``experts.down_proj``
``[E, H, I]``, read per routed token by ``gate_up_proj[expert_ids]`` (the ``batched_mm``
experts kernel fxsym traces). The expert FFN width ``I`` (alike in every expert) is a group per
layer (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, GraniteMoE, PhiMoE); shared experts are plain MLPs.
The number of experts ``E`` is a group per layer too: the router's ``topk`` returns positions
along its rows, which index the fused expert tensors (see ``tests/test_experts.py``). It is
*routed*: permuting the experts is exact, dropping one changes the routing by design (the value
oracle does not check it), and a resize keeps at least ``num_experts_per_tok`` of them.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import assert_oracles, group_with
from torch import nn

import fxsym
from fxsym.tracer import resolve_example_inputs

transformers = pytest.importorskip("transformers")

_BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=100, max_position_embeddings=64, num_experts_per_tok=2)

#: model_type -> config overrides
MOE: dict[str, dict[str, Any]] = {
    "mixtral": dict(_BASE, intermediate_size=32, num_local_experts=4),
    "qwen3_moe": dict(_BASE, head_dim=16, moe_intermediate_size=32, intermediate_size=48,
                      num_experts=4, decoder_sparse_step=1),
    "qwen2_moe": dict(_BASE, moe_intermediate_size=32, intermediate_size=48,
                      shared_expert_intermediate_size=24, num_experts=4, decoder_sparse_step=1),
    "olmoe": dict(_BASE, intermediate_size=32, num_experts=4),
    "granitemoe": dict(_BASE, intermediate_size=32, num_local_experts=4),
    "phimoe": dict(_BASE, intermediate_size=32, num_local_experts=4),
}
#: where a family keeps a layer's experts, if not at ``mlp.experts``
EXPERTS = {"granitemoe": "block_sparse_moe.experts"}


def build_moe(model_type: str) -> nn.Module:
    cfg = transformers.AutoConfig.for_model(model_type, **MOE[model_type])
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


@pytest.mark.parametrize("family", sorted(MOE))
def test_expert_ffn_width_is_a_group_per_layer(family: str) -> None:
    model = build_moe(family)
    inputs = resolve_example_inputs(model, None)
    sm = assert_oracles(model, inputs, min_groups=3)
    path = EXPERTS.get(family, "mlp.experts")
    widths = [group_with(sm, f"model.layers.{i}.{path}", "gate_up_proj:1") for i in (0, 1)]
    assert widths[0].name != widths[1].name
    for i, width in enumerate(widths):
        experts = f"model.layers.{i}.{path}"
        assert width.size == 32
        assert {(experts, "gate_up_proj:1"), (experts, "down_proj:2")} <= set(width.members)
    fxsym.resize(model, sm, {widths[0].name: 16})
    experts = model.get_submodule(f"model.layers.0.{path}")
    assert experts.gate_up_proj.shape[1:] == (32, 64)
    assert experts.down_proj.shape[1:] == (64, 16)
    assert model.get_submodule(f"model.layers.1.{path}").down_proj.shape[2] == 32
    with torch.no_grad():
        assert model(**inputs).logits.shape[-1] == 100


def test_shared_expert_width_is_a_group() -> None:
    model = build_moe("qwen2_moe")
    sm = fxsym.analyze(model, example_inputs=resolve_example_inputs(model, None))
    shared = group_with(sm, "model.layers.0.mlp.shared_expert.gate_proj", "out_features")
    assert shared.size == 24
    assert ("model.layers.0.mlp.shared_expert.down_proj", "in_features") in shared.members


@pytest.mark.parametrize("family", sorted(MOE))
def test_experts_are_a_routed_group_per_layer(family: str) -> None:
    """Router rows and every fused expert tensor's expert dim, one group per layer; resizing
    it runs the model with the family's own experts kernel (``grouped_mm`` reads
    ``experts.num_experts``, which follows)."""
    model = build_moe(family)
    sm = fxsym.analyze(model, example_inputs=resolve_example_inputs(model, None))
    path = EXPERTS.get(family, "mlp.experts")
    groups = [group_with(sm, f"model.layers.{i}.{path}", "gate_up_proj:0") for i in (0, 1)]
    assert groups[0].name != groups[1].name
    for i, g in enumerate(groups):
        experts = f"model.layers.{i}.{path}"
        assert g.size == 4 and g.routed
        assert g.min_size == (1 if family == "phimoe" else 2)  # PhiMoE: max, then max again
        assert {(experts, "gate_up_proj:0"), (experts, "down_proj:0")} <= set(g.members)
        assert any(s == "weight:0" for _, s in g.members), g.members  # the router's rows
    fxsym.resize(model, sm, {groups[0].name: [3, 0]})
    experts = model.get_submodule(f"model.layers.0.{path}")
    assert experts.gate_up_proj.shape[0] == experts.down_proj.shape[0] == 2
    assert experts.num_experts == 2
    assert model.get_submodule(f"model.layers.1.{path}").gate_up_proj.shape[0] == 4
    with torch.no_grad():
        assert model(input_ids=torch.randint(0, 100, (2, 8))).logits.shape == (2, 8, 100)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_pruned_experts_round_trip_through_from_pretrained(family: str, tmp_path: Any) -> None:
    """A uniform plan halves every group, the experts and their width included: the config's
    experts and intermediate fields follow the fused expert tensors, so transformers' own
    loader rebuilds the model."""
    model = build_moe(family)
    sm = fxsym.analyze(model)
    fxsym.plan(model, sm, ratio=0.5, scope="uniform").apply(model, sm)
    experts = model.model.layers[0].mlp.experts
    assert experts.gate_up_proj.shape == (2, 32, 32)  # E, 2I and H halved
    assert experts.down_proj.shape == (2, 32, 16)
    assert model.config.num_experts == 2 and model.config.num_experts_per_tok == 2
    assert not getattr(model.config, "fxsym_nonuniform", None)
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.num_experts == 2
    assert loaded.model.layers[1].mlp.gate.weight.shape == (2, 32)
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits,
                                   rtol=0, atol=0)


def test_expert_pruned_checkpoint_keeps_the_chosen_experts(tmp_path: Any) -> None:
    """Only experts pruned, a different pair kept per layer: the saved checkpoint holds those
    experts' weights and router rows, in the order kept."""
    model = build_moe("mixtral")
    sm = fxsym.analyze(model)
    before = [layer.mlp.experts.down_proj.detach().clone() for layer in model.model.layers]
    rows = [layer.mlp.gate.weight.detach().clone() for layer in model.model.layers]
    keep = ([2, 0], [1, 3])
    fxsym.resize(model, sm, {group_with(sm, f"model.layers.{i}.mlp.experts",
                                        "down_proj:0").name: list(k) for i, k in enumerate(keep)})
    assert model.config.num_local_experts == 2
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    for i, k in enumerate(keep):
        layer = loaded.model.layers[i].mlp
        assert torch.equal(layer.experts.down_proj, before[i][list(k)])
        assert torch.equal(layer.gate.weight, rows[i][list(k)])
        assert layer.experts.num_experts == layer.gate.num_experts == 2
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits,
                                   rtol=0, atol=0)


def _runs(model: nn.Module, dtype: torch.dtype) -> bool:
    """Whether ``model`` in ``dtype`` runs its own experts kernel (``grouped_mm``, the
    default) on a few tokens."""
    model = model.to(dtype)
    try:
        with torch.no_grad():
            model(input_ids=torch.randint(0, 100, (1, 8),
                                          generator=torch.Generator().manual_seed(0)))
    except RuntimeError as exc:
        assert "16 bytes" in str(exc)
        return False
    finally:
        model.float()
    return True


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("ratio", [0.2, 0.3, 0.5])
def test_plans_keep_sizes_the_grouped_mm_experts_kernel_runs(family: str, ratio: float) -> None:
    """transformers' default experts kernel (``grouped_mm``) needs 16-byte aligned rows of
    the fused expert tensors: the expert FFN width and the hidden size take multiples of 8
    (bfloat16) once pruned. A global plan of a tiny Qwen3-MoE used to keep widths such as 19
    and a hidden size of 55, and the pruned model failed at its first call."""
    model = build_moe(family)
    assert model.config._experts_implementation == "grouped_mm"
    sm = fxsym.analyze(model)
    path = EXPERTS.get(family, "mlp.experts")
    width = group_with(sm, f"model.layers.0.{path}", "gate_up_proj:1")
    hidden = group_with(sm, "model.embed_tokens", "embedding_dim")
    experts = group_with(sm, f"model.layers.0.{path}", "gate_up_proj:0")
    assert width.step == hidden.step == 8 and "grouped_mm" in width.step_reason
    assert experts.step == 1
    plan = fxsym.plan(model, sm, ratio=ratio)
    stepped = [g for g in plan.groups if sm.group(g.name).step > 1]
    assert stepped and all(g.kept % 8 == 0 or g.kept == g.size for g in stepped)
    assert set(plan.extra.get("steps", {})) == {g.name for g in stepped if g.kept < g.size}
    plan.apply(model, sm)
    assert _runs(model, torch.float32) and _runs(model, torch.bfloat16)


def test_explicit_expert_widths_off_the_kernel_step() -> None:
    """``sizes_for(expert_ffn=20)`` is refused, naming the kernel; ``plan(sizes=)`` rounds
    up."""
    from fxsym.prune.search import sizes_for

    model = build_moe("qwen3_moe")
    sm = fxsym.analyze(model)
    with pytest.raises(fxsym.PlanError, match=r"multiple of 8 entries .*grouped_mm"):
        sizes_for(sm, expert_ffn=20)
    with pytest.raises(fxsym.PlanError, match="grouped_mm"):
        sizes_for(sm, hidden=60)
    sizes = sizes_for(sm, expert_ffn=16, hidden=48)
    assert set(sizes.values()) == {16, 48}
    width = group_with(sm, "model.layers.0.mlp.experts", "gate_up_proj:1")
    plan = fxsym.plan(model, sm, sizes={width.name: 20})
    assert {g.name: g.kept for g in plan.groups}[width.name] == 24
    assert "grouped_mm" in plan.extra["steps"][width.name]["why"]
    plan.apply(model, sm)
    assert _runs(model, torch.bfloat16)


def test_a_model_without_fused_experts_has_no_step() -> None:
    cfg = transformers.AutoConfig.for_model("llama", **dict(_BASE, intermediate_size=30))
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    assert all(g.step == 1 for g in fxsym.analyze(model).groups())
