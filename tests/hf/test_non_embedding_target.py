"""A target of non-embedding parameters, the count model cards quote (issue 31 §3):
``target_non_embedding_params`` / ``--target-non-embedding-params`` counts every parameter but
the embedding tables (tied to the head or not, as :mod:`fxsym.prune.embeddings` finds them), while
``target_params`` / ``--target-params`` stays the total. The search and the uniform plan reach
it; the result's non-embedding count is under the target and close to it, where a total
target of the same number gives another model. Tiny llama models from
``AutoConfig.for_model`` with random weights, tied and untied embeddings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_helpers import checkpoint

import fxsym
from fxsym.prune.cli import main

transformers = pytest.importorskip("transformers")

SMALL = dict(calibration_tokens=64, seq_len=16, round_to=8)
TIED = pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])


def _llama(tied: bool) -> Any:
    cfg = transformers.AutoConfig.for_model(
        "llama", hidden_size=64, intermediate_size=192, vocab_size=256, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=tied)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def llama_tied() -> Any:
    return _llama(True)


def llama_untied() -> Any:
    return _llama(False)


def _non_embedding(model: Any) -> int:
    """By hand: every parameter but the token table (a tied head is that table; an untied
    head is not a table)."""
    table = model.get_input_embeddings().weight
    return sum(p.numel() for p in model.parameters() if p is not table)


def _total(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


@TIED
def test_a_uniform_plan_reaches_a_non_embedding_target(tied: bool) -> None:
    """``fxsym.plan(target_non_embedding_params=N)``: the pruned model, counted by hand, has
    at most N non-embedding parameters and within 5 % of N; ``target_params=N`` gives a model
    of N parameters in all, far fewer non-embedding ones."""
    model = _llama(tied)
    sm = fxsym.analyze(model)
    target = _non_embedding(model) * 6 // 10
    plan = fxsym.plan(model, sm, target_non_embedding_params=target, scope="uniform",
                      round_to=8)
    total = fxsym.plan(model, sm, target_params=target, scope="uniform", round_to=8)
    plan.apply(model, sm)
    reached = _non_embedding(model)
    assert plan.extra["non_embedding"]["after"] == reached
    assert 0.95 * target <= reached <= target
    assert _total(model) > target  # the tables are not counted
    assert total.params_after <= target and total.extra["non_embedding"]["after"] < 0.9 * reached


@TIED
def test_the_checkpoint_search_reaches_a_non_embedding_target(tmp_path: Path, calib: Path,
                                                              tied: bool) -> None:
    """``prune_checkpoint(target_non_embedding_params=N, calibration=...)`` searches
    candidates counted without the tables: the kept one has at most N non-embedding
    parameters, close to N, recorded as the target reached; the output loads with
    ``from_pretrained`` and counts so by hand. ``target_params=N`` keeps fewer."""
    src = tmp_path / "in"
    model = checkpoint(src, "llama", num_hidden_layers=3, tie_word_embeddings=tied)
    target = _non_embedding(model) * 6 // 10
    plan = fxsym.prune_checkpoint(src, tmp_path / "ne", calibration=calib,
                                  target_non_embedding_params=target, **SMALL)
    record = plan.extra["target"]
    assert record["non_embedding"] and record["params"] == target
    assert len(plan.extra["search"]) > 1
    pruned = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ne")
    reached = _non_embedding(pruned)
    assert record["reached"] == plan.extra["non_embedding"]["after"] == reached
    assert 0.9 * target <= reached <= target
    by_total = fxsym.prune_checkpoint(src, tmp_path / "total", calibration=calib,
                                      target_params=target, **SMALL)
    assert by_total.params_after <= target < plan.params_after
    assert by_total.extra["non_embedding"]["after"] < reached


@TIED
def test_the_cli_prunes_a_model_in_memory_to_a_non_embedding_target(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tied: bool) -> None:
    """``fxsym prune MODEL --target-non-embedding-params N``: the search's table and the
    target line say non-embedding parameters; the count reached is under N and close; the
    summary shows both counts."""
    model = _llama(tied)
    target = _non_embedding(model) * 6 // 10
    out = tmp_path / "out"
    spec = f"test_non_embedding_target:llama_{'tied' if tied else 'untied'}"
    assert main(["prune", spec, "--target-non-embedding-params", str(target), "--round-to",
                 "8", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"candidates for {target:,} non-embedding parameters" in said
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out)
    reached = _non_embedding(pruned)
    assert f"reached {reached:,} non-embedding parameters" in said
    assert 0.9 * target <= reached <= target
    rows = [line for line in said.splitlines() if line.startswith(("parameters",
                                                                    "non-embedding"))]
    assert len(rows) == 2 and f"{_total(pruned):,}" in rows[0] and f"{reached:,}" in rows[1]


def test_a_non_embedding_target_above_the_model_is_refused() -> None:
    model = _llama(True)
    sm = fxsym.analyze(model)
    whole = _non_embedding(model)
    with pytest.raises(fxsym.PlanError, match=r"above the model's .* non-embedding"):
        fxsym.plan(model, sm, target_non_embedding_params=whole + 1, scope="uniform")
