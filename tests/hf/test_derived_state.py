"""Values a model computes from a size when it is built (issue 30 §5): Gemma, Gemma 2 and
Gemma 3 scale their embeddings by ``sqrt(hidden_size)``, kept as ``scalar_embed_scale`` and
the ``embed_scale`` buffer. A resize of the hidden size keeps the scale (the pruned model
computes what the original did on the units kept), so a config of the new hidden size cannot
describe it: a model built from it scales by ``sqrt`` of the new size. The pruned model and
the checkpoint it is saved as must be the same model:

* ``fxsym.plan(describable=True)`` keeps the hidden size whole, saying why, and the plain
  checkpoint ``save_pretrained`` writes loads back as the pruned model;
* a resize of the hidden size warns, ``fxsym.save`` (and ``fxsym prune``) write fxsym's own
  model type, which loads back as the resized model, and transformers' own ``save_pretrained``
  writes a config no model of which fits the weights (``from_pretrained`` refuses it instead
  of loading a model computing something else).

Float64, tiny configs, random weights."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from ckpt_helpers import checkpoint, tiny_config
from helpers import group_with

import fxsym
from fxsym.prune.cli import main

GEMMAS = ["gemma", "gemma2", "gemma3_text"]


def _model(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = tiny_config(family, head_dim=16)
    return transformers.AutoModelForCausalLM.from_config(config).eval().double()


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def _ids() -> torch.Tensor:
    return torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(1))


def _hidden(sm: fxsym.SymMap) -> fxsym.SymGroup:
    return group_with(sm, "model.embed_tokens", "weight:1")


@pytest.mark.parametrize("family", GEMMAS)
def test_a_describable_plan_keeps_the_hidden_size_the_embedding_scale_follows(
        family: str, tmp_path: Path) -> None:
    """Before, the plan halved the hidden size and the plain checkpoint loaded a model
    scaling its embeddings by sqrt(32) instead of sqrt(64): logits 0.02-0.05 apart."""
    model = _model(family)
    ids = _ids()
    sm = fxsym.analyze(model, example_inputs={"input_ids": ids})
    hidden = _hidden(sm)
    plan = fxsym.plan(model, sm, importance="l2", ratio=0.5, scope="uniform",
                      describable=True)
    why = plan.extra["undescribed"][hidden.name]
    assert "model.embed_tokens.scalar_embed_scale is 8" in why and "hidden_size" in why, why
    before = sum(p.numel() for p in model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("error", fxsym.ResizeWarning)  # the config describes the result
        plan.apply(model, sm)
    assert model.model.embed_tokens.weight.shape[1] == 64
    assert sum(p.numel() for p in model.parameters()) < before  # the rest was pruned
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float64).eval()
    torch.testing.assert_close(_logits(loaded, ids), _logits(model, ids), rtol=0, atol=1e-10)


@pytest.mark.parametrize("family", GEMMAS)
def test_a_hidden_resize_loads_back_as_the_resized_model_or_not_at_all(
        family: str, tmp_path: Path) -> None:
    """Before, ``save_pretrained`` wrote a plain checkpoint of hidden size 32 that
    ``from_pretrained`` loaded without a word, scaling the embeddings by sqrt(32)."""
    model = _model(family)
    ids = _ids()
    sm = fxsym.analyze(model, example_inputs={"input_ids": ids})
    hidden = _hidden(sm)
    with pytest.warns(fxsym.ResizeWarning, match="scalar_embed_scale is 8"):
        plan = fxsym.plan(model, sm, sizes={hidden.name: 32})
        plan.apply(model, sm)
    assert model.model.embed_tokens.weight.shape[1] == 32
    assert float(model.model.embed_tokens.embed_scale) == 8.0
    resized = _logits(model, ids)

    fxsym.save(model, tmp_path / "fxsym", plan)
    assert json.loads((tmp_path / "fxsym" / "config.json").read_text())[
        "model_type"] == "fxsym_pruned"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "fxsym", trust_remote_code=True, dtype=torch.float64).eval()
    torch.testing.assert_close(_logits(loaded, ids), resized, rtol=0, atol=1e-10)

    model.save_pretrained(tmp_path / "plain")
    with pytest.raises(RuntimeError, match="mismatch"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "plain")


def test_the_prune_command_writes_a_checkpoint_of_the_resized_model(tmp_path: Path) -> None:
    """``fxsym prune --hidden 32`` of a Gemma 3 checkpoint: fxsym's own model type, loading
    as the in-memory model pruned by the same plan (the scale of the old hidden size kept)."""
    src, out = tmp_path / "in", tmp_path / "out"
    checkpoint(src, "gemma3_text", head_dim=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fxsym.ResizeWarning)
        assert main(["prune", str(src), "--hidden", "32", "-o", str(out)]) == 0
        plan = fxsym.prune.persist.read_manifest(out)["plan"]
        model: Any = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
        sm = fxsym.analyze(model)
        plan.apply(model, sm)
    assert json.loads((out / "config.json").read_text())["model_type"] == "fxsym_pruned"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert loaded.model.embed_tokens.weight.shape[1] == 32
    assert float(loaded.model.embed_tokens.embed_scale) == 8.0
    ids = _ids()
    torch.testing.assert_close(_logits(loaded.eval(), ids), _logits(model, ids), rtol=0,
                               atol=0)
