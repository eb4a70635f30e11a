"""Config values the config class computes (read-only properties), after a resize.

xLSTM's config computes ``v_dim`` and ``qk_dim`` from ``hidden_size`` (rounded up to a multiple
of 64) while each mLSTM layer holds its own ``v_dim`` and ``qk_dim``; the model's cache is
sized by the config's values. After a hidden-size resize, the hf plugin's config update tried
to give the config a ``v_dim`` field of the modules' value and crashed on the read-only
property (the plugin failed, the resize was rolled back). Once it no longer crashed, a resize
the config's rounding does not absorb left the model's cache sized by a value its layers do
not hold (the cached forward failed: "matC_old has wrong shape"): refused now, by name.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

import fxsym
from fxsym.errors import ResizeError
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


def test_a_resize_leaving_a_computed_size_stale_is_refused() -> None:
    """Hidden 128 -> 64: the config would compute v_dim 64 while the layers hold 128, and the
    model's cache, sized by the config, fails (transformers: 'matC_old has wrong shape'). The
    resize is refused naming v_dim, the field it follows and the layers; the model is
    restored (same logits, the plugin still enabled: hidden 96 then resizes)."""
    model = _xlstm()
    want = _logits(model, True)
    sm = fxsym.analyze(model)
    plan = fxsym.plan(model, sm, importance="l2", sizes=sizes_for(sm, hidden=64))
    with pytest.raises(ResizeError) as refused:
        plan.apply(model, sm)
    message = str(refused.value)
    assert "xLSTMConfig.v_dim is computed from hidden_size" in message
    assert "gives 64" in message and "backbone.blocks.0.mlstm_layer and 1 more hold 128" in message
    assert model.config.hidden_size == 128
    torch.testing.assert_close(_logits(model, True), want, rtol=0, atol=0)
    fxsym.plan(model, sm, importance="l2", sizes=sizes_for(sm, hidden=96)).apply(model, sm)
    assert model.config.hidden_size == 96
