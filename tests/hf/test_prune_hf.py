"""Pruned Hugging Face models saved and loaded again (issue 12)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import build

import fxsym

transformers = pytest.importorskip("transformers")

INPUTS = {"input_ids": torch.tensor([[1, 5, 7, 9, 11, 2]])}


def _logits(model: torch.nn.Module, inputs: dict[str, Any] = INPUTS) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


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
    plan.apply(model, sm)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    fxsym.save(model, tmp_path, plan)
    fresh = build(model_type)
    fxsym.load(fresh, tmp_path)
    assert torch.allclose(_logits(fresh), _logits(model), atol=1e-5)
