"""Qwen3-Next's full attention: its query projection holds a gate beside each query head
(``num_attention_heads * head_dim * 2`` rows, the output projection reads
``num_attention_heads * head_dim``). The config the resize writes counts query heads in the
field's units (measured on the model built from the config before the resize), so a model
resized by whole attention heads is saved by transformers' own ``save_pretrained`` and loaded
back by a plain ``from_pretrained`` as the same model.
"""

from __future__ import annotations

import warnings

import torch
import transformers
from ckpt_helpers import LAYERED, tiny_config

import fxsym


def _config() -> object:
    overrides = dict(LAYERED["qwen3_next"], layer_types=["linear_attention", "full_attention"])
    config = tiny_config("qwen3_next", num_hidden_layers=2, **overrides)
    config._experts_implementation = "eager"  # grouped_mm takes no float64
    return config


def test_gated_query_heads_halved_save_and_load_as_the_same_model(tmp_path: object) -> None:
    """Before: the config said num_attention_heads 8 (q_proj rows // head_dim, gate
    included) where the model kept 2 query heads: a ResizeWarning, and the checkpoint
    transformers wrote failed to load strictly."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config()).double().eval()
    ids = torch.randint(3, 300, (2, 10), generator=torch.Generator().manual_seed(0))
    sm = fxsym.analyze(model, example_inputs={"input_ids": ids})
    attn = "model.layers.1.self_attn"
    group = next(g for g in sm.groups() if (f"{attn}.k_proj", "out_features") in g.members)
    assert group.size == 2  # key/value heads, 2 query heads (each with its gate) per head
    assert {(f"{attn}.q_proj", "out_features"), (f"{attn}.o_proj", "in_features")} <= set(
        group.members)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fxsym.ResizeWarning)
        fxsym.resize(model, sm, {group.name: [1]})
    assert model.model.layers[1].self_attn.q_proj.out_features == 2 * 2 * 16
    config = model.config
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (2, 1, 16)
    assert not hasattr(config, "fxsym_nonuniform")
    model.save_pretrained(tmp_path)
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float64, experts_implementation="eager", output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched tensor
    loaded.eval()
    with torch.no_grad():
        expected, got = model(ids).logits, loaded(ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
