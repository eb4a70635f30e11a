"""Pruned Hugging Face models saved and loaded again (issue 12)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import CONFIGS, build
from helpers import group_with

import fxsym

transformers = pytest.importorskip("transformers")

INPUTS = {"input_ids": torch.tensor([[1, 5, 7, 9, 11, 2]])}


def _logits(model: torch.nn.Module, inputs: dict[str, Any] = INPUTS) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits

def _mlp(sm: fxsym.SymMap, layer: int) -> str:
    """The name of the group of a llama layer's MLP width."""
    return group_with(sm, f"model.layers.{layer}.mlp.gate_proj", "out_features").name


@pytest.mark.parametrize("model_type", ["llama", "bert"])
def test_uniform_plan_round_trips_through_from_pretrained(model_type: str,
                                                          tmp_path: Path) -> None:
    model = build(model_type)
    sm = fxsym.analyze(model)
    plan = fxsym.plan(model, sm, ratio=0.5, scope="uniform", importance="l2")
    plan.apply(model, sm)
    assert plan.params_after < plan.params_before
    model.save_pretrained(tmp_path)
    auto = getattr(transformers, type(model).__name__)
    again = auto.from_pretrained(tmp_path).eval()
    assert torch.allclose(_logits(again), _logits(model), atol=1e-5)


@pytest.mark.parametrize("model_type", ["llama", "bert"])
def test_non_uniform_plan_round_trips_through_fxsym_load(model_type: str,
                                                         tmp_path: Path) -> None:
    model = build(model_type)
    sm = fxsym.analyze(model)
    plan = fxsym.plan(model, sm, ratio=0.4, scope="global", importance="l1")
    assert len({g.kept for g in plan.groups if g.keep is not None}) > 1  # not uniform
    with pytest.warns(fxsym.ResizeWarning, match="fxsym_nonuniform"):
        plan.apply(model, sm)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    fxsym.save(model, tmp_path, plan)
    auto = getattr(transformers, CONFIGS[model_type][0])
    for load in (auto.from_pretrained, transformers.AutoConfig.from_pretrained):
        with pytest.raises(ValueError, match="trust_remote_code=True"):
            load(tmp_path)
    fresh = build(model_type)
    fxsym.load(fresh, tmp_path)
    torch.testing.assert_close(_logits(fresh), _logits(model), rtol=0, atol=0)


def test_a_config_the_largest_sizes_would_make_invalid_still_saves(tmp_path: Path) -> None:
    """LlamaConfig rejects a hidden size that is not a multiple of the heads; a global plan
    gives one (47 of 64 with 4 heads of 16), and the model still has 4 heads in some layer."""
    model = build("llama")
    sm = fxsym.analyze(model)
    plan = fxsym.plan(model, sm, ratio=0.4, scope="global", importance="l1")
    with pytest.warns(fxsym.ResizeWarning):
        plan.apply(model, sm)
    assert model.model.embed_tokens.embedding_dim % 4
    model.save_pretrained(tmp_path)  # did raise transformers' "hidden size (47) is not a ..."
    assert json.loads((tmp_path / "config.json").read_text())["hidden_size"] == 64
    with pytest.raises(RuntimeError, match="mismatch"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path)


def test_a_uniform_resize_after_a_non_uniform_one_lifts_the_mark(tmp_path: Path) -> None:
    model = build("llama")
    sm = fxsym.analyze(model)
    with pytest.warns(fxsym.ResizeWarning):
        fxsym.resize(model, sm, {_mlp(sm, 0): 64})
    assert "fxsym_nonuniform" in model.config.to_dict()
    sm = fxsym.analyze(model)
    fxsym.resize(model, sm, {_mlp(sm, 1): 64})
    assert "fxsym_nonuniform" not in model.config.to_dict()
    model.save_pretrained(tmp_path)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(_logits(again), _logits(model.eval()), rtol=0, atol=0)
