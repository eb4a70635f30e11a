"""Depth pruning of transformers decoders (issue 22 §3): the decoder layers are a depth group;
dropping layers equals skipping them in the original model (identity in their place), the
config follows (``num_hidden_layers``, ``layer_types``), ``layer_idx`` is renumbered, and the
result round-trips through ``save_pretrained``/``from_pretrained`` and generates with a cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import fxsym

transformers = pytest.importorskip("transformers")

_BASE = dict(hidden_size=64, intermediate_size=128, vocab_size=128, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64)
#: model_type -> config overrides; sliding windows shorter than the inputs, so the layers'
#: masks differ and a layer given another layer's mask changes the logits
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": dict(use_sliding_window=True, sliding_window=4, max_window_layers=2),
    "gemma2": dict(sliding_window=4, head_dim=8),
}
IDS = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(0))


def _build(model_type: str) -> Any:
    cfg = transformers.AutoConfig.for_model(model_type, **{**_BASE, **FAMILIES[model_type]})
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def _skipping(model: Any, dropped: list[int]) -> torch.Tensor:
    """Logits of ``model`` with the ``dropped`` layers replaced by the identity."""
    ref = type(model)(model.config).eval()
    ref.load_state_dict(model.state_dict())
    for i in dropped:
        ref.model.layers[i].register_forward_hook(lambda m, args, out: args[0])
    with torch.no_grad():
        return ref(IDS).logits  # type: ignore[no-any-return]


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_depth_pruned_decoder_round_trips(model_type: str, tmp_path: Path) -> None:
    model = _build(model_type)
    types = getattr(model.config, "layer_types", None)
    sm = fxsym.analyze(model)
    group = sm.depth_group("model.layers.depth")
    assert group.size == 4
    assert ("self_attn", "layer_idx") in group.positions
    assert bool(group.varying_inputs) == (types is not None and len(set(types)) > 1)
    expected = _skipping(model, [1])
    fxsym.resize(model, sm, {"model.layers.depth": [0, 2, 3]})
    with torch.no_grad():
        logits = model(IDS).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)
    assert model.config.num_hidden_layers == 3
    if types is not None:
        assert model.config.layer_types == [types[0], types[2], types[3]]
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == [0, 1, 2]

    model.save_pretrained(tmp_path)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert again.config.num_hidden_layers == 3
    assert getattr(again.config, "layer_types", None) == getattr(model.config, "layer_types",
                                                                 None)
    with torch.no_grad():
        torch.testing.assert_close(again(IDS).logits, logits, rtol=0, atol=0)
    cached = again.generate(IDS, max_new_tokens=6, do_sample=False)
    uncached = again.generate(IDS, max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)
    assert torch.equal(cached, model.generate(IDS, max_new_tokens=6, do_sample=False))


def test_width_and_depth_together_round_trip(tmp_path: Path) -> None:
    model = _build("qwen2")
    sm = fxsym.analyze(model)
    plan = fxsym.plan(model, sm, ratio=0.5, scope="uniform")
    choices: dict[str, Any] = dict(plan.choices())
    choices["model.layers.depth"] = [1, 3]
    fxsym.resize(model, sm, choices)
    assert len(model.model.layers) == 2
    model.save_pretrained(tmp_path)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(again(IDS).logits, model(IDS).logits, rtol=0, atol=0)


def test_plan_by_layers_saves_a_plain_checkpoint(tmp_path: Path) -> None:
    model = _build("qwen2")
    sm = fxsym.analyze(model)
    plan = fxsym.plan(model, sm, layers=2, ratio=0.25, scope="uniform")
    (depth,) = plan.depth
    assert depth.name == "model.layers.depth" and len(depth.keep) == 2
    plan.apply(model, sm)
    assert plan.params_after == sum(p.numel() for p in model.parameters())
    fxsym.save(model, tmp_path, plan)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert again.config.num_hidden_layers == 2
    types = ["full_attention", "full_attention", "sliding_attention", "sliding_attention"]
    assert again.config.layer_types == [types[i] for i in depth.keep]
    with torch.no_grad():
        torch.testing.assert_close(again(IDS).logits, model(IDS).logits, rtol=0, atol=0)
    fresh = _build("qwen2")
    fxsym.load(fresh, tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(fresh(IDS).logits, model(IDS).logits, rtol=0, atol=0)


def test_depth_with_a_config_that_cannot_describe_the_width(tmp_path: Path) -> None:
    """Gemma2's embedding scale follows the hidden size only through the config: a width plan
    makes the checkpoint fxsym's own type, whose loader replays the plan, depth included."""
    model = _build("gemma2")
    sm = fxsym.analyze(model)
    plan = fxsym.plan(model, sm, layers=[0, 2, 3], ratio=0.25, scope="uniform")
    with pytest.warns(fxsym.ResizeWarning):
        plan.apply(model, sm)
    assert getattr(model.config, "fxsym_nonuniform", None)
    fxsym.save(model, tmp_path, plan)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path,
                                                              trust_remote_code=True).eval()
    assert len(again.model.layers) == 3
    with torch.no_grad():
        torch.testing.assert_close(again(IDS).logits, model(IDS).logits, rtol=0, atol=0)
