"""DeepSeek's mixture of experts (issue 21 §1): the experts, behind a router that picks
routing groups first (V3's ``n_group``/``topk_group``, V2's ``group_limited_greedy``), are a
routed group per layer whose unit is one routing group (``n_routed_experts // n_group``
experts: the router views its scores as ``n_group`` blocks, see
``tests/test_grouped_routing.py``); the router's rows, its ``e_score_correction_bias`` and
every fused expert tensor's expert dim are members, and the config's ``n_routed_experts``
and ``n_group`` follow an expert-pruned model through ``save_pretrained`` and transformers'
own ``from_pretrained``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import assert_oracles, group_with
from torch import nn

import fxsym
from fxsym.oracles import check_permutation
from fxsym.tracer import resolve_example_inputs

transformers = pytest.importorskip("transformers")

_BASE: dict[str, Any] = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=2, vocab_size=50, max_position_embeddings=32, first_k_dense_replace=1,
    q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8,
    n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2,
    moe_intermediate_size=16, n_shared_experts=1)
CONFIGS: dict[str, dict[str, Any]] = {
    "deepseek_v3": _BASE,
    "deepseek_v2": dict(_BASE, topk_method="group_limited_greedy"),
}


def build(model_type: str, **overrides: Any) -> nn.Module:
    cfg = transformers.AutoConfig.for_model(model_type, **{**CONFIGS[model_type], **overrides})
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_experts_are_routed_in_whole_routing_groups(model_type: str) -> None:
    model = build(model_type)
    sm = assert_oracles(model, resolve_example_inputs(model, None), min_groups=3)
    moe = "model.layers.1.mlp"
    experts = group_with(sm, f"{moe}.experts", "gate_up_proj:0")
    assert experts.routed and experts.size == 4 and experts.unit == 2
    assert experts.min_size == 2  # topk_group routing groups
    members = set(experts.members)
    assert {(f"{moe}.experts", "down_proj:0"), (f"{moe}.gate", "weight:0"),
            (f"{moe}.gate", "attr:num_group"), (f"{moe}.gate", "attr:num_experts")} <= members
    if model_type == "deepseek_v3":
        assert (f"{moe}.gate", "e_score_correction_bias:0") in members
    width = group_with(sm, f"{moe}.experts", "gate_up_proj:1")
    assert not width.routed and (f"{moe}.experts", "down_proj:2") in width.members


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_expert_pruned_model_round_trips_through_from_pretrained(
        model_type: str, tmp_path: Any) -> None:
    """Routing groups 3 and 0 kept: experts 6, 7, 0, 1 in that order; ``n_routed_experts``
    4 and ``n_group`` 2 in the saved config; transformers' loader gives identical logits."""
    model = build(model_type)
    sm = fxsym.analyze(model)
    moe = model.model.layers[1].mlp
    down, rows = moe.experts.down_proj.detach().clone(), moe.gate.weight.detach().clone()
    experts = group_with(sm, "model.layers.1.mlp.experts", "gate_up_proj:0")
    fxsym.resize(model, sm, {experts.name: [3, 0]})
    assert (model.config.n_routed_experts, model.config.n_group) == (4, 2)
    assert model.config.topk_group == 2
    assert not getattr(model.config, "fxsym_nonuniform", None)
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert (loaded.config.n_routed_experts, loaded.config.n_group) == (4, 2)
    kept = [6, 7, 0, 1]
    layer = loaded.model.layers[1].mlp
    assert torch.equal(layer.experts.down_proj, down[kept])
    assert torch.equal(layer.gate.weight, rows[kept])
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits,
                                   rtol=0, atol=0)


def test_greedy_routing_of_deepseek_v2_keeps_single_experts() -> None:
    """V2's default ``greedy`` router reads no routing groups: the unit is one expert."""
    model = build("deepseek_v2", topk_method="greedy")
    sm = fxsym.analyze(model)
    experts = group_with(sm, "model.layers.1.mlp.experts", "gate_up_proj:0")
    assert experts.routed and experts.size == 8 and experts.unit == 1
    assert experts.min_size == 2


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_uniform_plan_round_trips_through_from_pretrained(model_type: str, tmp_path: Any) -> None:
    """Every group halved (hidden, MLA ranks, heads, FFN widths, routing groups): the config
    follows every size, ``num_attention_heads`` counted in whole heads of ``q_b_proj`` and
    ``num_key_value_heads`` with it (DeepSeek reads ``heads // kv_heads`` as
    ``num_key_value_groups``), and transformers' loader gives identical logits."""
    model = build(model_type, num_attention_heads=4, num_key_value_heads=4)
    sm = fxsym.analyze(model)
    fxsym.plan(model, sm, ratio=0.5, scope="uniform").apply(model, sm)
    c = model.config
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (16, 2, 2)
    assert (c.q_lora_rank, c.kv_lora_rank, c.moe_intermediate_size) == (8, 4, 8)
    assert (c.n_routed_experts, c.n_group) == (4, 2)
    assert not getattr(c, "fxsym_nonuniform", None)
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits,
                                   rtol=0, atol=0)


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_one_routing_group_keeps_single_experts(model_type: str, tmp_path: Any) -> None:
    """``n_group=1, topk_group=1`` (Kimi K2's and Moonlight's routing): the one routing group
    holds every expert, so the unit is one expert (the view to ``(-1, 1, E)`` and the expand to
    ``num_experts // num_group`` follow the experts); 3 of 8 kept, in that order:
    ``n_routed_experts`` 3 and ``n_group`` 1 in the saved config, and transformers' loader
    gives identical logits."""
    model = build(model_type, n_group=1, topk_group=1)
    sm = assert_oracles(model, resolve_example_inputs(model, None), min_groups=3)
    experts = group_with(sm, "model.layers.1.mlp.experts", "gate_up_proj:0")
    assert experts.routed and experts.size == 8 and experts.unit == 1
    assert experts.min_size == 2  # top_k experts (and the two best of the one group scored)
    down = model.model.layers[1].mlp.experts.down_proj.detach().clone()
    fxsym.resize(model, sm, {experts.name: [5, 0, 3]})
    assert (model.config.n_routed_experts, model.config.n_group) == (3, 1)
    assert not getattr(model.config, "fxsym_nonuniform", None)
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.equal(loaded.model.layers[1].mlp.experts.down_proj, down[[5, 0, 3]])
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits,
                                   rtol=0, atol=0)


@pytest.mark.parametrize(("n_group", "topk_group", "unit", "kept", "experts", "groups_after"),
                         [(1, 1, 1, [6, 1, 4], [6, 1, 4], 1), (2, 1, 4, [1], [4, 5, 6, 7], 1),
                          (4, 2, 2, [3, 0], [6, 7, 0, 1], 2)])
def test_routing_groups_of_one_two_and_four(n_group: int, topk_group: int, unit: int,
                                            kept: list[int], experts: list[int],
                                            groups_after: int, tmp_path: Any) -> None:
    """The experts' unit is one routing group (``n_routed_experts // n_group`` experts) where
    there are several, one expert where there is one: 1, 4 and 2 experts at a time for
    ``n_group`` 1, 2 and 4; the config follows (``n_group`` the routing groups kept) and plain
    ``from_pretrained`` gives the in-memory pruned model's logits."""
    model = build("deepseek_v3", n_group=n_group, topk_group=topk_group)
    sm = fxsym.analyze(model)
    group = group_with(sm, "model.layers.1.mlp.experts", "gate_up_proj:0")
    assert group.routed and (group.unit, group.size) == (unit, 8 // unit)
    down = model.model.layers[1].mlp.experts.down_proj.detach().clone()
    fxsym.resize(model, sm, {group.name: kept})
    assert (model.config.n_routed_experts, model.config.n_group) == (len(experts), groups_after)
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.equal(loaded.model.layers[1].mlp.experts.down_proj, down[experts])
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits,
                                   rtol=0, atol=0)


def _assert_pruned_as_in_memory(src: Path, out: Path, plan: fxsym.Plan, *, experts: int,
                                n_group: int, **analysis: Any) -> None:
    """The checkpoint ``out``, pruned from ``src`` by ``plan``, loads with plain
    ``from_pretrained`` with ``experts`` routed experts in ``n_group`` routing groups, and
    gives exactly the logits of the model of ``src`` pruned by ``plan`` in memory (analyzed
    with ``analysis``)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    plan.apply(model, fxsym.analyze(model, **analysis))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert (loaded.config.n_routed_experts, loaded.config.n_group) == (experts, n_group)
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits,
                                   rtol=0, atol=0)


def test_a_checkpoint_with_one_routing_group_prunes_experts_as_in_memory(tmp_path: Any) -> None:
    """``fxsym.prune_checkpoint`` of a DeepSeek-V3 checkpoint with one routing group, 5 of 8
    experts kept per MoE layer (l2): plain ``from_pretrained`` of the output gives the logits
    of the in-memory model pruned by the same plan (the router picks among the experts kept)."""
    from ckpt_helpers import checkpoint

    src, out = tmp_path / "in", tmp_path / "out"
    config = {k: v for k, v in _BASE.items() if k not in ("vocab_size", "hidden_size")}
    config.update(n_group=1, topk_group=1, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=4)
    checkpoint(src, "deepseek_v3", **config)
    plan = fxsym.prune_checkpoint(src, out, importance="l2", sizes={"experts": 5})
    assert [g.kept for g in plan.groups if g.name.endswith("gate.weight:0")] == [5, 5]
    _assert_pruned_as_in_memory(src, out, plan, experts=5, n_group=1)


@pytest.mark.parametrize(("model_type", "n_group", "topk_group", "n_experts", "kept"),
                         [("deepseek_v3", 1, 1, 8, 3), ("deepseek_v3", 2, 1, 8, 2),
                          ("deepseek_v3", 4, 2, 8, 2), ("deepseek_v3", 4, 2, 16, 2),
                          ("deepseek_v2", 2, 1, 8, 1)])
def test_kept_routing_groups_each_lose_the_same_experts(model_type: str, n_group: int,
                                                        topk_group: int, n_experts: int,
                                                        kept: int, tmp_path: Any) -> None:
    """``routing_groups="keep"``: the experts' unit is one expert position of every routing
    group (``n_routed_experts // n_group`` of them; with one routing group, one expert as
    without the option) and the permutation oracle holds. A plan keeping ``kept`` positions
    gives ``n_routed_experts = n_group * kept`` with ``n_group`` kept, and plain
    ``from_pretrained`` of the saved model gives exactly the logits of a model transformers
    builds from that config holding the same experts' weights. (``n_group`` 4 of 8 experts
    keeps both of each routing group: V3's router sums the best two of each; V2's
    ``group_limited_greedy`` scores a routing group by its best expert, so one may stay.)"""
    model = build(model_type, n_group=n_group, topk_group=topk_group,
                  n_routed_experts=n_experts)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    inputs = resolve_example_inputs(model, None)
    sm = fxsym.analyze(model, example_inputs=inputs, routing_groups="keep")
    per = n_experts // n_group
    group = group_with(sm, "model.layers.1.mlp.experts", "gate_up_proj:0")
    assert group.routed and (group.size, group.unit) == (per, 1)
    assert ("model.layers.1.mlp.gate", "attr:num_group") not in group.members
    assert check_permutation(model, sm, inputs).ok
    plan = fxsym.plan(model, sm, sizes={group.name: kept})
    assert plan.extra["analysis"] == {"routing_groups": "keep"}
    positions = plan.choices().get(group.name, list(range(per)))
    assert len(positions) == kept
    rows = [g * per + p for g in range(n_group) for p in positions]
    plan.apply(model, sm)
    assert (model.config.n_routed_experts, model.config.n_group) == (n_group * kept, n_group)
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    config = transformers.AutoConfig.for_model(model_type, **{
        **CONFIGS[model_type], "n_group": n_group, "topk_group": topk_group,
        "n_routed_experts": n_group * kept})
    reference = transformers.AutoModelForCausalLM.from_config(config).eval()
    experts = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias", "mlp.experts.")
    reference.load_state_dict({k: v[rows] if any(e in k for e in experts) else v
                               for k, v in state.items()})
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits,
                                   reference(input_ids=ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("spelled", ["analysis_options", "keyword"])
def test_a_checkpoint_keeps_its_routing_groups_as_in_memory(tmp_path: Any, spelled: str
                                                            ) -> None:
    """``fxsym.prune_checkpoint(..., analysis_options={"routing_groups": "keep"})`` of a
    DeepSeek-V3 checkpoint with two routing groups of 4 experts, 2 positions kept per MoE
    layer (l2): ``n_routed_experts`` 4 and ``n_group`` 2 in the output, and plain
    ``from_pretrained`` of it gives the logits of the in-memory model pruned by the same plan.
    The option as a keyword of its own (``routing_groups="keep"``, the old spelling) does the
    same, with a :class:`DeprecationWarning` naming ``analysis_options``."""
    from ckpt_helpers import checkpoint

    src, out = tmp_path / "in", tmp_path / "out"
    config = {k: v for k, v in _BASE.items() if k not in ("vocab_size", "hidden_size")}
    config.update(n_group=2, topk_group=1, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=4)
    checkpoint(src, "deepseek_v3", **config)
    if spelled == "keyword":
        with pytest.warns(DeprecationWarning, match="give analysis_options="):
            plan = fxsym.prune_checkpoint(src, out, importance="l2", sizes={"experts": 2},
                                          routing_groups="keep")
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            plan = fxsym.prune_checkpoint(src, out, importance="l2", sizes={"experts": 2},
                                          analysis_options={"routing_groups": "keep"})
    assert plan.extra["analysis"] == {"routing_groups": "keep"}
    assert [g.kept for g in plan.groups if g.name.endswith("gate.weight:0#0")] == [2, 2]
    _assert_pruned_as_in_memory(src, out, plan, experts=4, n_group=2, routing_groups="keep")


def test_the_command_keeps_a_checkpoints_routing_groups(tmp_path: Any) -> None:
    """``fxsym prune CKPT --routing-groups keep --experts 2``: 2 expert positions of each of
    the 2 routing groups, ``n_routed_experts`` 4 and ``n_group`` 2 for plain
    ``from_pretrained``."""
    from ckpt_helpers import checkpoint

    from fxsym.prune.cli import main

    src, out = tmp_path / "in", tmp_path / "out"
    config = {k: v for k, v in _BASE.items() if k not in ("vocab_size", "hidden_size")}
    config.update(n_group=2, topk_group=1)
    checkpoint(src, "deepseek_v3", **config)
    assert main(["prune", str(src), "--routing-groups", "keep", "--experts", "2",
                 "--importance", "l2", "-o", str(out)]) == 0
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert (loaded.config.n_routed_experts, loaded.config.n_group) == (4, 2)
