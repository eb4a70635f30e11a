"""The cached path ``generate`` runs is part of the program (issue 30 §6, the class found with
it).

fxsym traces a transformers model with ``use_cache=False``; ``generate`` runs the model with
its cache, on a path the trace never ran. RWKV allocates its recurrent state from
``config.hidden_size`` and writes the attention's own width into it; xLSTM sizes its cache by
``v_dim``, which its config computes from ``hidden_size`` (rounded up to 64) while the layers
hold their own. Halving the hidden size of either gave a model whose uncached forward runs and
whose ``generate`` fails. The hf plugin now tries that path on a meta copy resized
(:mod:`fxsym_plugins_hf.cachepath`) and the analysis pins what fails, with a reason.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import transformers

import fxsym

#: one row: RWKV's generate of a batch of two differs from its greedy decoding already
IDS = torch.tensor([[1, 5, 9, 12, 40, 7, 3, 22]])
NEW_TOKENS = 4


def _model(family: str) -> Any:
    """A 2-layer RWKV (hidden 64) or xLSTM (hidden 128, 8 heads), random weights, float64."""
    if family == "rwkv":
        config = transformers.AutoConfig.for_model(
            "rwkv", hidden_size=64, num_hidden_layers=2, vocab_size=100,
            attention_hidden_size=64, intermediate_size=128, context_length=32)
    else:
        config = transformers.AutoConfig.for_model(
            "xlstm", hidden_size=128, num_hidden_layers=2, num_heads=8, vocab_size=100,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).double().eval()


def _greedy(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """Greedy decoding by full forwards, no cache."""
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=ids, use_cache=False).logits
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
    return ids


def _generate(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False)
    return out  # type: ignore[no-any-return]


@pytest.mark.parametrize(("family", "hidden", "error"), [
    ("rwkv", ("rwkv.embeddings", "embedding_dim"), "broadcast"),
    ("xlstm", ("backbone.embeddings", "embedding_dim"), "matC_old has wrong shape"),
])
def test_every_group_halved_generates_as_greedy_decoding(family: str, hidden: tuple[str, str],
                                                         error: str) -> None:
    """Every searchable group halved: ``generate`` (the cache) gives the tokens greedy
    decoding by full forwards gives. The hidden size, which the cache disagrees with, is no
    group: an ``untraced-path`` report line says the cached forward failed and how (RWKV's
    attention widths too: its state, sized by the hidden size, is written with them).

    Before: xLSTM's hidden size was a group, and halved its ``generate`` failed ('matC_old has
    wrong shape'); RWKV's, once its attention's item assignments were traced, failed the same
    way (a state of 32 written with 64)."""
    model = _model(family)
    sm = fxsym.analyze(model, example_inputs={"input_ids": IDS})
    assert not any(hidden in g.members for g in sm.groups())
    lines = {e.where: e.message for e in sm.trace_report.entries if e.kind == "untraced-path"}
    assert "cached forward" in lines[".".join(hidden)] and error in lines[".".join(hidden)]
    assert not {g.name for g in sm.groups()} & set(lines), "each group named is pinned"
    assert sm.groups(), "the other groups stay searchable"
    for group in sm.groups():
        resized, resized_map = copy.deepcopy((model, sm))
        fxsym.resize(resized, resized_map, {group.name: group.size // 2})
        assert torch.equal(_generate(resized, IDS), _greedy(resized, IDS)), group.name
