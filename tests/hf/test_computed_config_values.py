"""Config values the config class computes (read-only properties), after a resize.

xLSTM's config computes ``v_dim`` and ``qk_dim`` from ``hidden_size`` (rounded up to a multiple
of 64) while each mLSTM layer holds its own ``v_dim`` and ``qk_dim``; the model's cache is
sized by the config's values. After a hidden-size resize, the hf plugin's config update tried
to give the config a ``v_dim`` field of the modules' value and crashed on the read-only
property (the plugin failed, the resize was rolled back).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

import fxsym
from fxsym.search import sizes_for

IDS = torch.tensor([[1, 5, 9, 12, 40, 7, 3, 22]])


def _xlstm() -> Any:
    """A 2-block xLSTM of hidden size 128 (its config computes v_dim 128 and qk_dim 64, as its
    layers hold), random weights."""
    config = transformers.AutoConfig.for_model(
        "xlstm", hidden_size=128, num_hidden_layers=2, num_heads=8, vocab_size=300,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _logits(model: Any, use_cache: bool) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS, use_cache=use_cache).logits  # type: ignore[no-any-return]


def test_a_read_only_config_property_is_not_written_after_a_resize() -> None:
    """Hidden 128 -> 96: the config cannot be given v_dim (a property), so the layers' v_dim
    (128) is recorded per module; the config still computes 128, so the cached forward (sized
    by the config) and the uncached one give the same logits."""
    model = _xlstm()
    sm = fxsym.analyze(model)
    plan = fxsym.plan(model, sm, importance="l2", sizes=sizes_for(sm, hidden=96))
    with pytest.warns(fxsym.ResizeWarning, match="v_dim"):
        plan.apply(model, sm)
    assert model.config.hidden_size == 96 and model.config.v_dim == 128
    assert model.backbone.blocks[0].mlstm_layer.v_dim == 128
    assert model.config.fxsym_nonuniform["v_dim"] == {
        f"backbone.blocks.{i}.mlstm_layer": 128 for i in range(2)}
    torch.testing.assert_close(_logits(model, True), _logits(model, False), rtol=0, atol=0)
