"""Real models whose analysis crashed although they run eagerly (issue 30 §6).

* The state-space and linear-attention hybrids (Bamba, Falcon-H1, Zamba2, Mamba2,
  Qwen3-Next) analyzed with ``input_ids`` alone: their recurrent layers' mask builder returns
  ``None`` (no padding to zero), or a leaf returns ``(out, None)``; a proxy of that ``None``
  passed the model's ``mask is not None`` checks and was indexed. A call of value ``None`` now
  gives the model a plain ``None``.
* SigLIP 2's vision tower: transformers' ``torch_compilable_check`` calls its condition when
  ``callable(cond)``, which an fx proxy is.
* RWKV: ``hasattr(weight, "SCB")`` was true of a proxy (any attribute made a lazy proxy);
  a proxy of a known value now has the attributes its value has.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from ckpt_helpers import LAYERED, tiny_config
from helpers import assert_oracles

import fxsym
from fxsym.oracles import coverage

#: model type -> config overrides (4 layers: each kind of layer twice)
HYBRIDS: dict[str, dict[str, Any]] = {
    **{k: LAYERED[k] for k in ("bamba", "falcon_h1", "zamba2", "qwen3_next")},
    "mamba2": dict(num_heads=8, head_dim=16, n_groups=1, state_size=8, expand=2,
                   chunk_size=4),
}
#: coverage reached with or without an attention mask. Mamba2's and Zamba2's mixers were
#: below 0.75 until the heads followed the split, the scan's repeat_interleave and the gated
#: norm's view (tests/test_mamba_mixer_sizes.py) and their conv1d counted by its weight.
#: Qwen3-Next's gated delta net was a leaf for its item assignments (0.52); traced (a
#: setitem node), its hidden size became a group (0.74, 31 of 42 producers); its key heads,
#: each with its query, key, value heads and gates, are one group since the fused views'
#: per-head widths keep their value (``num_v_heads`` a member, ``r`` per key head: see
#: tests/test_fused_head_blocks.py and tests/hf/test_gated_delta_heads.py), which adds
#: in_proj_qkvz, in_proj_ba and conv1d of both linear-attention layers (0.881, 37 of 42).
#: The uncovered producers are lm_head (the vocabulary) and each MoE layer's
#: shared_expert_gate (one output, broadcast)
COVERAGE = {"bamba": 0.75, "falcon_h1": 0.75, "zamba2": 0.75, "qwen3_next": 0.85,
            "mamba2": 0.75}


def _hybrid(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = tiny_config(family, num_hidden_layers=4, **HYBRIDS[family])
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("family", sorted(HYBRIDS))
def test_hybrids_analyze_from_input_ids_alone(family: str) -> None:
    """Before: ModelError 'NoneType' object is not subscriptable, in the mamba / linear
    attention layers' padding mask."""
    model = _hybrid(family)
    ids = torch.randint(3, 300, (2, 10), generator=torch.Generator().manual_seed(0))
    sm = assert_oracles(model, {"input_ids": ids})
    assert coverage(sm) >= COVERAGE[family]
    with_mask = fxsym.analyze(model, example_inputs={"input_ids": ids,
                                                     "attention_mask": torch.ones_like(ids)})
    assert [g.members for g in sm.groups()] == [g.members for g in with_mask.groups()]


def test_siglip2_vision_tower_traces_through_transformers_value_checks() -> None:
    """Before: ModelError 'Tensor' object has no attribute '__call__' (the check called the
    traced ``(spatial_shapes > 0).all()``)."""
    config = transformers.AutoConfig.for_model(
        "siglip2_vision_model", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_channels=3, num_patches=16, patch_size=4)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config).eval()
    inputs = {"pixel_values": torch.randn(2, 16, 48),
              "pixel_attention_mask": torch.ones(2, 16, dtype=torch.long),
              "spatial_shapes": torch.tensor([[4, 4], [4, 4]])}
    sm = assert_oracles(model, inputs)
    members = {m for g in sm.groups() for m in g.members}
    for i in (0, 1):
        assert (f"encoder.layers.{i}.mlp.fc1", "out_features") in members
        assert (f"encoder.layers.{i}.self_attn.q_proj", "out_features") in members
    from transformers.utils import import_utils
    with pytest.raises(ValueError, match="positive size"):  # the check itself still checks
        import_utils.torch_compilable_check(torch.tensor(False),
                                            "Resized positional embeddings must have a "
                                            "positive size.")


def test_rwkv_traces_and_its_quantization_branch_is_not_taken() -> None:
    """Before: ModelError 'Tensor' object has no attribute 'SCB' in ``_rescale_layers``,
    with or without example inputs."""
    config = transformers.AutoConfig.for_model(
        "rwkv", hidden_size=64, num_hidden_layers=2, vocab_size=100, attention_hidden_size=64,
        intermediate_size=128, context_length=32)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    sm = fxsym.analyze(model)
    assert not model.rwkv.layers_are_rescaled  # the trace wrote nothing into the model
    sm = assert_oracles(model, {"input_ids": ids})
    members = {m for g in sm.groups() for m in g.members}
    assert ("rwkv.blocks.0.feed_forward.key", "out_features") in members
