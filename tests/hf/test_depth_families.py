"""Depth on every decoder family transformers ships with per-layer config fields (issue 29 §2).

Each family's tiny checkpoint (4 layers, random weights) is depth-pruned by
:func:`fxsym.prune_checkpoint`, by positions and by a count ranked on calibration text; the
output loads with a plain ``from_pretrained`` (its ``config.json`` of the family's own type)
and generates. By positions, its logits are those of the original model with the dropped
layers replaced by the identity, and the in-memory prune (``fxsym.plan(layers=...)`` +
apply) generates what the loaded checkpoint does. The positions drop a layer before others
of another kind, so that every per-layer field must be renumbered: ``layer_types``,
``no_rope_layers``, ``mlp_only_layers``, ``attn_layer_indices``, a rule's parameter
(``first_k_dense_replace``, ``decoder_sparse_step``), the ``layer_idx`` of a hybrid's
attention (which only some blocks hold).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_helpers import LAYERED, TEXT, checkpoint

import fxsym

transformers = pytest.importorskip("transformers")

_WINDOW = dict(sliding_window=4)
_HYBRID_MAMBA = dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8,
                     mamba_chunk_size=16)
#: model_type -> (config overrides, the positions kept of 4 layers)
FAMILIES: dict[str, tuple[dict[str, Any], list[int]]] = {
    "smollm3": (dict(no_rope_layer_interval=2), [1, 2]),
    "gemma2": (dict(_WINDOW, head_dim=16), [1, 2]),
    "gemma3_text": (dict(_WINDOW, head_dim=16, sliding_window_pattern=2), [1, 2]),
    "qwen2": (dict(_WINDOW, use_sliding_window=True, max_window_layers=2), [1, 2]),
    "qwen3": (dict(_WINDOW, use_sliding_window=True, max_window_layers=2, head_dim=16),
              [1, 2]),
    "cohere2": (dict(_WINDOW, sliding_window_pattern=2), [1, 2]),
    "olmo3": (dict(_WINDOW), [1, 2]),
    "exaone4": (dict(_WINDOW, sliding_window_pattern=2), [1, 2]),
    "gpt_oss": (dict(_WINDOW, num_local_experts=4, num_experts_per_tok=2, head_dim=16,
                     intermediate_size=32), [1, 2]),
    # sparse where (i + 1) % 2 == 0 and i not in mlp_only_layers: only layer 1
    "qwen2_moe": (dict(moe_intermediate_size=32, intermediate_size=48, num_experts=4,
                       num_experts_per_tok=2, shared_expert_intermediate_size=24,
                       decoder_sparse_step=2, mlp_only_layers=[3]), [0, 2]),
    "qwen3_moe": (dict(moe_intermediate_size=32, intermediate_size=128, num_experts=4,
                       num_experts_per_tok=2, mlp_only_layers=[1], head_dim=16), [1, 2]),
    "deepseek_v3": (dict(num_attention_heads=2, num_key_value_heads=2, first_k_dense_replace=1,
                         q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=4,
                         qk_nope_head_dim=4, v_head_dim=8, n_routed_experts=8, n_group=4,
                         topk_group=2, num_experts_per_tok=2, moe_intermediate_size=16,
                         n_shared_experts=1), [1, 2]),
    # attention and experts where i % 2 == 1: the two offsets become 0
    "jamba": (dict(num_experts=2, expert_layer_period=2, expert_layer_offset=1,
                   attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8, mamba_d_conv=4,
                   mamba_expand=2), [1, 2]),
    "bamba": (dict(_HYBRID_MAMBA, attn_layer_indices=[1, 3]), [1, 2]),
    "falcon_h1": (dict(_HYBRID_MAMBA, head_dim=16, mamba_d_ssm=128), [1, 2]),
    "qwen3_next": (dict(head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2,
                        linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
                        num_experts_per_tok=2, moe_intermediate_size=32,
                        shared_expert_intermediate_size=32, full_attention_interval=2),
                   [1, 2]),
    "granitemoehybrid": (dict(_HYBRID_MAMBA, layer_types=["mamba", "attention"] * 2,
                              num_local_experts=4, num_experts_per_tok=2), [1, 2]),
    "lfm2": (dict(layer_types=["conv", "full_attention"] * 2, block_ff_dim=192), [1, 2]),
}
IDS = torch.randint(3, 300, (1, 8), generator=torch.Generator().manual_seed(0))


def _source(tmp_path: Path, family: str) -> Path:
    src = tmp_path / "in"
    checkpoint(src, family, num_hidden_layers=4, pad_token_id=0, **FAMILIES[family][0])
    return src


def _skipping(src: Path, dropped: list[int]) -> torch.Tensor:
    """Logits of the checkpoint ``src`` with the ``dropped`` layers replaced by the
    identity (a hook giving back the layer's hidden states)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()

    def identity(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        hidden = args[0] if args else kwargs["hidden_states"]
        return (hidden, *out[1:]) if isinstance(out, tuple) else hidden

    for i in dropped:
        model.model.layers[i].register_forward_hook(identity, with_kwargs=True)
    with torch.no_grad():
        return model(IDS, use_cache=False).logits  # type: ignore[no-any-return]


def _plain(out: Path, family: str) -> Any:
    """The pruned checkpoint ``out``, loaded by a plain ``from_pretrained`` (no remote
    code): its config is of the family's own type."""
    assert json.loads((out / "config.json").read_text())["model_type"] == family
    return transformers.AutoModelForCausalLM.from_pretrained(out).eval()


def _generate(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(IDS, max_new_tokens=4, do_sample=False)  # type: ignore[no-any-return]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_depth_by_positions_loads_plainly_and_generates(family: str, tmp_path: Path) -> None:
    """The kept layers renumbered in every per-layer field: the output is the original with
    the dropped layers skipped, loads without remote code and generates; the in-memory prune
    generates the same tokens."""
    src = _source(tmp_path, family)
    keep = FAMILIES[family][1]
    out = tmp_path / "out"
    fxsym.prune_checkpoint(src, out, layers=keep)
    pruned = _plain(out, family)
    assert len(pruned.model.layers) == len(keep)
    with torch.no_grad():
        logits = pruned(IDS, use_cache=False).logits
    dropped = [i for i in range(4) if i not in keep]
    torch.testing.assert_close(logits, _skipping(src, dropped), rtol=1e-5, atol=1e-5)
    tokens = _generate(pruned)
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    sm = fxsym.analyze(model)
    fxsym.plan(model, sm, layers=keep).apply(model, sm)
    assert torch.equal(_generate(model), tokens)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_depth_by_count_loads_plainly_and_generates(family: str, tmp_path: Path) -> None:
    """Two layers kept, ranked by block importance on calibration text (a hybrid keeps one
    attention layer whatever the ranking): the output loads without remote code and
    generates what the in-memory prune of those layers does."""
    src = _source(tmp_path, family)
    out = tmp_path / "out"
    count = 2
    plan = fxsym.prune_checkpoint(src, out, layers=count, calibration=[TEXT])
    (depth,) = plan.depth
    pruned = _plain(out, family)
    assert len(pruned.model.layers) == count
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    sm = fxsym.analyze(model)
    fxsym.plan(model, sm, layers=list(depth.keep)).apply(model, sm)
    assert torch.equal(_generate(model), _generate(pruned))


def test_bamba_in_memory_renumbers_the_attention_of_the_blocks_holding_one(
        tmp_path: Path) -> None:
    """Bamba's attention sits in some blocks only: its ``layer_idx`` (like the mixers' in
    the others) is a position, renumbered when layers are dropped, so the cache's layer of
    that index is an attention one and generate works."""
    src = _source(tmp_path, "bamba")
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    sm = fxsym.analyze(model)
    (group,) = sm.depth_groups()
    assert {("self_attn", "layer_idx"), ("mamba", "layer_idx")} <= set(group.positions)
    fxsym.plan(model, sm, layers=[1, 2]).apply(model, sm)
    assert model.model.layers[0].self_attn.layer_idx == 0
    assert model.model.layers[1].mamba.layer_idx == 1
    assert model.config.attn_layer_indices == [0]
    assert _generate(model).shape == (1, 12)


@pytest.mark.parametrize("keep, first_k", [([1, 2], 0), ([0, 2, 3], 1)])
def test_a_rule_parameter_follows_the_kept_blocks(keep: list[int], first_k: int,
                                                  tmp_path: Path) -> None:
    """DeepSeek-V3's dense layers are the first ``first_k_dense_replace``: dropping the dense
    one makes it 0, keeping it leaves it 1 (found by building, not by its name)."""
    src = _source(tmp_path, "deepseek_v3")
    out = tmp_path / "out"
    fxsym.prune_checkpoint(src, out, layers=keep)
    assert _plain(out, "deepseek_v3").config.first_k_dense_replace == first_k


#: sparse where (i + 1) % moe_layer_interval == 0 between the start and end indices: layers
#: 1 and 3 of 4
ERNIE = dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=32, moe_layer_interval=2,
             moe_layer_start_index=0, moe_layer_end_index=3, moe_num_shared_experts=0)


def test_two_rule_fields_change_together(tmp_path: Path) -> None:
    """Ernie 4.5 MoE's layers 1, 2 (sparse, dense) are an interval of 1 ending at 0: neither
    field alone gives them, the pair does (before: refused, the config 'cannot describe')."""
    src = tmp_path / "in"
    checkpoint(src, "ernie4_5_moe", num_hidden_layers=4, pad_token_id=0, **ERNIE)
    out = tmp_path / "out"
    fxsym.prune_checkpoint(src, out, layers=[1, 2])
    pruned = _plain(out, "ernie4_5_moe")
    assert (pruned.config.moe_layer_interval, pruned.config.moe_layer_end_index) == (1, 0)
    with torch.no_grad():
        logits = pruned(IDS, use_cache=False).logits
    torch.testing.assert_close(logits, _skipping(src, [0, 3]), rtol=1e-5, atol=1e-5)


def test_blocks_no_config_can_order_are_written_as_fxsym_pruned(tmp_path: Path) -> None:
    """Ernie 4.5 MoE chooses its sparse layers by an interval between two indices: layers
    1, 2, 3 (sparse, dense, sparse) are no interval's. The config cannot describe them, so
    the checkpoint is of fxsym's own type (hence trust_remote_code), the warning says which
    block differs and how, and the loaded model is the original with layer 0 skipped."""
    src = tmp_path / "in"
    checkpoint(src, "ernie4_5_moe", num_hidden_layers=4, pad_token_id=0, **ERNIE)
    out = tmp_path / "out"
    with pytest.warns(fxsym.ResizeWarning, match=r"block 0 of model.layers built from it has "
                      r"mlp:class 'Ernie4_5_MoeMLP', the block kept there "
                      r"'Ernie4_5_MoeSparseMoeBlock'"):
        fxsym.prune_checkpoint(src, out, layers=[1, 2, 3])
    data = json.loads((out / "config.json").read_text())
    assert data["model_type"] == "fxsym_pruned"
    assert data["pruned_config"]["fxsym_nonuniform"] == {
        "blocks": {"model.layers.0": 1, "model.layers.1": 2, "model.layers.2": 3}}
    assert data["pruned_config"]["moe_layer_interval"] == 2  # as it was: no partial answer
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    with torch.no_grad():
        logits = pruned.eval()(IDS, use_cache=False).logits
    torch.testing.assert_close(logits, _skipping(src, [0]), rtol=1e-5, atol=1e-5)
    assert _generate(pruned).shape == (1, 12)


def test_a_hybrid_whose_kept_kinds_no_config_orders_is_refused(tmp_path: Path) -> None:
    """Jamba's layers 0, 1, 3 (Mamba, attention, attention) are no attention period's and
    the model picks each layer's mask by position: refused, naming both causes, nothing
    written."""
    src = _source(tmp_path, "jamba")
    out = tmp_path / "out"
    with pytest.raises(fxsym.ResizeError, match=r"cannot describe the blocks of model.layers "
                       r"kept \(\[0, 1, 3\]\).*block 2 of model.layers built from it has "
                       r":class 'JambaMambaDecoderLayer'.*read values the model chooses by "
                       r"position"):
        fxsym.prune_checkpoint(src, out, layers=[0, 1, 3])
    assert not out.exists()


def test_blocks_sharing_a_transformer_are_refused(tmp_path: Path) -> None:
    """Zamba2's hybrid layers share one transformer (tied parameters), whose adapters and
    cache slots are chosen by the layer's position: no depth group, and the refusal says
    so (before: the mixed classes were silently no depth group, the message named a list
    inside the shared transformer)."""
    src = tmp_path / "in"
    checkpoint(src, "zamba2", num_hidden_layers=4, pad_token_id=0, tie_word_embeddings=True,
               mamba_d_state=8, mamba_headdim=16, mamba_ngroups=1, n_mamba_heads=8,
               num_mem_blocks=1, use_mem_rope=True,
               layers_block_type=["mamba", "hybrid", "mamba", "hybrid"])
    with pytest.raises(fxsym.PlanError, match=r"blocks model.layers.1 and model.layers.3 share "
                       r"the parameter shared_transformer"):
        fxsym.prune_checkpoint(src, tmp_path / "out", layers=[0, 1])


HYBRIDS = ["bamba", "granitemoehybrid", "jamba", "lfm2", "qwen3_next"]


def _attention_blocks(family: str) -> list[int]:
    """The positions of the attention layers of the family's 4 tiny layers (1 and 3 here)."""
    return [1, 3]


@pytest.mark.parametrize("family", ["bamba", "granitemoehybrid"])
def test_a_count_keeps_an_attention_layer(family: str, tmp_path: Path) -> None:
    """Ranked by block importance, the two layers kept would be the state-space ones (0 and
    2; asserted from the scores): the best-ranked attention layer replaces the lower-ranked
    of them, the plan's note says so, and the output loads with a plain from_pretrained and
    generates as the in-memory prune of those layers (before: [0, 2] written, generate
    failed in transformers' cache)."""
    src = tmp_path / "in"
    checkpoint(src, family, num_hidden_layers=4, pad_token_id=0, **LAYERED[family])
    out = tmp_path / "out"
    plan = fxsym.prune_checkpoint(src, out, layers=2, calibration=[TEXT])
    scores = torch.tensor(plan.extra["block_importance"])
    assert sorted(scores.topk(2).indices.tolist()) == [0, 2]
    attention = _attention_blocks(family)
    best = max(attention, key=lambda i: float(scores[i]))
    worst = min((0, 2), key=lambda i: float(scores[i]))
    (depth,) = plan.depth
    assert list(depth.keep) == sorted({0, 2, best} - {worst})
    assert any(note.startswith(f"layers=2 keeps block {best} of model.layers in place of "
                               f"block {worst}") for note in plan.extra["notes"])
    pruned = _plain(out, family)
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    sm = fxsym.analyze(model)
    fxsym.plan(model, sm, layers=list(depth.keep)).apply(model, sm)
    assert torch.equal(_generate(model), _generate(pruned))


@pytest.mark.parametrize("family", HYBRIDS)
def test_positions_keeping_no_attention_layer_are_refused(family: str, tmp_path: Path) -> None:
    """Layers 0 and 2 of these hybrids are linear (state-space, convolution) ones only:
    transformers' cache of such a model has no sequence length and generate fails (as for an
    unpruned config of linear layers only). Refused before anything is written, in memory
    too, naming the kind and where it is (before: written, generate failed)."""
    src = tmp_path / "in"
    checkpoint(src, family, num_hidden_layers=4, pad_token_id=0, **LAYERED[family])
    out = tmp_path / "out"
    refusal = (r"keeping the blocks \[0, 2\] of model.layers keeps no block of the kind "
               r".+ \(positions \[1, 3\]\): without one, transformers' cache of the pruned "
               r"model cannot be used .* so generate would fail; keep one of them")
    with pytest.raises(fxsym.PlanError, match=refusal):
        fxsym.prune_checkpoint(src, out, layers=[0, 2])
    assert not out.exists()
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    sm = fxsym.analyze(model)
    with pytest.raises(fxsym.PlanError, match=refusal):
        fxsym.plan(model, sm, layers=[0, 2])
    fxsym.prune_checkpoint(src, out, layers=[0, 1])
    assert _generate(_plain(out, family)).shape == (1, 12)


@pytest.mark.parametrize("family", ["qwen3_next", "bamba"])
def test_a_resize_keeping_no_attention_layer_is_refused(family: str, tmp_path: Path) -> None:
    """fxsym.resize given the blocks directly: the hf plugin refuses the config it would
    write (its cache cannot be used) and the model is left as it was (before: a
    ResizeWarning, and a model generate fails on)."""
    src = _source(tmp_path, family)
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    sm = fxsym.analyze(model)
    (group,) = sm.depth_groups()
    before = _generate(model)
    with pytest.raises(fxsym.ResizeError, match=r"keeping the blocks \[0, 2\] of "
                       r"model.layers: transformers' cache of the pruned model cannot be used"):
        fxsym.resize(model, sm, {group.name: [0, 2]})
    assert len(model.model.layers) == 4
    assert torch.equal(_generate(model), before)


def test_the_search_skips_a_depth_the_config_cannot_say(tmp_path: Path) -> None:
    """Jamba's three best-ranked layers here are 0, 1, 3 (Mamba, attention, attention): no
    attention period's, and the model picks each layer's mask by position, so keeping them
    is refused. The parameter-target search skips that depth, says so, and keeps the best
    of the others; the output generates (before: the whole prune was refused)."""
    src = tmp_path / "in"
    model = checkpoint(src, "jamba", num_hidden_layers=4, pad_token_id=0, **LAYERED["jamba"])
    target = int(sum(p.numel() for p in model.parameters()) * 0.7)
    out = tmp_path / "out"
    plan = fxsym.prune_checkpoint(src, out, target_params=target, search=True,
                                  calibration=[TEXT], calibration_tokens=64, seq_len=24)
    scores = torch.tensor(plan.extra["block_importance"])
    assert sorted(scores.topk(3).indices.tolist()) == [0, 1, 3]
    assert 3 not in {row["layers"] for row in plan.extra["search"]}
    (skipped,) = [n for n in plan.extra["notes"] if n.startswith("the search skipped")]
    assert skipped.startswith("the search skipped 3 blocks of model.layers: "
                              "JambaForCausalLM.config cannot describe the blocks of "
                              "model.layers kept ([0, 1, 3])")
    assert plan.extra["target"]["reached"] <= target
    remote = json.loads((out / "config.json").read_text())["model_type"] == "fxsym_pruned"
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=remote)
    assert _generate(pruned.eval()).shape == (1, 12)
