"""Config fields from groups, not from equal numbers (issue 19, §7).

After a resize the hf plugin writes into ``model.config`` the sizes the resized modules
have. Which modules a field describes must come from what the field sizes, never from a
length that happens to be equal: with ``vocab_size == intermediate_size`` the LM head maps
``(hidden, intermediate)`` too, and taking it for an MLP layer marked a uniform plan
non-uniform, so ``from_pretrained`` refused the model. These tiny configs make sizes collide
on purpose (vocab = intermediate = 2 * hidden; heads = key/value heads = head_dim): a uniform
plan, then ``save_pretrained`` and ``from_pretrained``, must give the same logits.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import fxsym

transformers = pytest.importorskip("transformers")

_DECODER = dict(hidden_size=64, intermediate_size=128, vocab_size=128, num_hidden_layers=2,
                num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=64)

#: model_type -> (auto class, config): vocab = intermediate = 2 * hidden, heads = head_dim
COLLIDING: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("AutoModelForCausalLM", _DECODER),
    "qwen2": ("AutoModelForCausalLM", _DECODER),
    "mistral": ("AutoModelForCausalLM", _DECODER),
    "gpt2": ("AutoModelForCausalLM", dict(n_embd=64, n_inner=128, vocab_size=128, n_layer=2,
                                          n_head=8, n_positions=64, bos_token_id=0,
                                          eos_token_id=0)),
    "bert": ("AutoModelForMaskedLM", dict(hidden_size=64, intermediate_size=128, vocab_size=128,
                                          num_hidden_layers=2, num_attention_heads=8,
                                          max_position_embeddings=64)),
    "opt": ("AutoModelForCausalLM", dict(hidden_size=64, ffn_dim=128, vocab_size=128,
                                         num_hidden_layers=2, num_attention_heads=8,
                                         max_position_embeddings=64, word_embed_proj_dim=64)),
}

INPUTS = {"input_ids": torch.tensor([[1, 5, 7, 9, 11, 2]])}


def _build(model_type: str, **overrides: Any) -> torch.nn.Module:
    auto, kwargs = COLLIDING[model_type]
    cfg = transformers.AutoConfig.for_model(model_type, **{**kwargs, **overrides})
    torch.manual_seed(0)
    return getattr(transformers, auto).from_config(cfg).eval()


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(**INPUTS).logits


@pytest.mark.parametrize("model_type", sorted(COLLIDING))
def test_uniform_plan_with_colliding_sizes_round_trips(model_type: str, tmp_path: Path) -> None:
    model = _build(model_type)
    sm = fxsym.analyze(model)
    # a head_dim of its own is what GPT-2's and OPT's configs cannot express (they derive
    # it as hidden // heads; tests/hf/test_resized_config.py): keep it
    fixed = [g.name for g in sm.groups() if g.name.endswith(".head_dim")
             and model_type in ("gpt2", "opt")]
    plan = fxsym.plan(model, sm, ratio=0.5, scope="uniform", importance="l2", exclude=fixed)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fxsym.ResizeWarning)  # a uniform plan: no guard
        plan.apply(model, sm)
    assert plan.params_after < plan.params_before
    assert not hasattr(model.config, "fxsym_nonuniform")
    assert model.config.vocab_size == 128
    model.save_pretrained(tmp_path)
    again = getattr(transformers, type(model).__name__).from_pretrained(tmp_path).eval()
    torch.testing.assert_close(_logits(again), _logits(model), rtol=0, atol=1e-5)


def test_the_readme_llama_keeps_its_vocabulary(tmp_path: Path) -> None:
    """The README's example config: vocab_size == intermediate_size == 128."""
    model = _build("llama", num_attention_heads=4, num_key_value_heads=2)
    sm = fxsym.analyze(model)
    mlp = [g for g in sm.groups() if ("model.layers.0.mlp.gate_proj", "out_features")
           in g.members]
    assert len(mlp) == 1
    fxsym.resize(model, sm, {g.name: g.size // 2 for g in sm.groups()
                             if ("model.layers.0.mlp.gate_proj", "out_features") in g.members
                             or ("model.layers.1.mlp.gate_proj", "out_features") in g.members})
    assert model.config.intermediate_size == 64 and model.config.vocab_size == 128
    assert not hasattr(model.config, "fxsym_nonuniform")
    model.save_pretrained(tmp_path)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(_logits(again), _logits(model), rtol=0, atol=1e-5)
