"""The search counts its candidates without building them (issue 31 §4): a candidate's
parameters are counted from the parameters' shapes once its groups keep so many units and its
blocks are kept (:func:`fxsym.prune.search.candidates`). Which parameters a choice of blocks
leaves out is remembered for that choice, since a search counts hundreds of plans of a few
depths; the counts must stay those of the model pruned for real."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from ckpt_helpers import n_params

import fxsym
import fxsym.prune.search.space as search_module
from fxsym.prune.search import candidates, sizes_for


def _llama() -> Any:
    import transformers

    cfg = transformers.AutoConfig.for_model(
        "llama", hidden_size=64, intermediate_size=192, vocab_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def test_each_candidate_counts_the_parameters_of_the_model_pruned_to_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every candidate of a search over depths and hidden sizes has the parameter count of the
    copy of the model pruned to its blocks and sizes; the blocks' renaming is asked once per
    parameter and choice of blocks, however many sizes are counted at that depth (before:
    once per parameter and count)."""
    model = _llama()
    sm = fxsym.analyze(model)
    asked: list[tuple[str, Any]] = []
    real = search_module.renamed

    def renamed(name: str, groups: Any, kept: Any) -> str | None:
        asked.append((name, tuple(sorted((k, tuple(v)) for k, v in kept.items()))))
        return real(name, groups, kept)

    monkeypatch.setattr(search_module, "renamed", renamed)
    depth = sm.depth_groups()[0]
    scores = {depth.name: torch.tensor([0.3, 0.1, 0.4, 0.2])}
    found = candidates(model, sm, target_params=n_params(model) * 6 // 10, round_to=8,
                       block_scores=scores)
    monkeypatch.setattr(search_module, "renamed", real)
    assert len({c.layers for c in found}) >= 2 and len({c.stream for c in found}) >= 2
    assert asked and len(asked) == len(set(asked)), "a fate under one choice asked twice"
    for c in found:
        blocks = sorted(sorted(range(4), key=lambda i: -scores[depth.name][i])[:c.layers])
        sizes = sizes_for(sm, hidden=c.stream, ffn=c.widths().get("ffn"))
        pruned, its = copy.deepcopy((model, sm))
        fxsym.plan(pruned, its, sizes=sizes, layers={depth.name: blocks},
                   importance="l2").apply(pruned, its)
        assert c.params == n_params(pruned), c
