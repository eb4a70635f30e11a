"""What the cached-path trial (:mod:`fxsym_plugins_hf.cachepath`) could not check is said.

The trial tells a size the forward refuses on every path (no finding about the cache) from one
the cache disagrees with by running the forward without a cache on the resized meta copy. Where
that forward cannot run on meta tensors at all (an ``.item()``, a branch on data), every size
looked refused: the trial found no size to try, returned nothing, and the analysis said nothing
while ``generate`` of the model resized failed. Where the forward refused each trial size of one
group, that group was left out of the trial without a word.

Now the first case is a ``<model>`` ``untraced-path`` line giving the forward's error, and each
group whose trial size fails the cached path is pinned as when the check runs (the failure may
be the forward's own at that size: in doubt, pinned); the second is a ``<model>`` line naming
the groups not tried, which stay searchable. The model: RWKV, whose recurrent state is sized by
the hidden size (its hidden size and attention widths break ``generate``), with a forward
pre-hook (part of the program: the trace runs it) checking the input's values or a width
without a cache only.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import transformers

import fxsym

IDS = torch.tensor([[1, 5, 9, 12, 40, 7, 3, 22]])
NEW_TOKENS = 4


def _rwkv(seed: int = 0) -> Any:
    """A 2-layer RWKV (hidden 64, attention 64, FFN 128), random weights, float64."""
    config = transformers.AutoConfig.for_model(
        "rwkv", hidden_size=64, num_hidden_layers=2, vocab_size=100, attention_hidden_size=64,
        intermediate_size=128, context_length=32)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config).double().eval()


def _checks_tokens(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
    """Without a cache, refuse a token id out of the vocabulary (``.item()``: no meta tensor
    can answer)."""
    if not kwargs.get("use_cache", True):
        if int(kwargs["input_ids"].max().item()) >= module.config.vocab_size:
            raise ValueError("a token id out of the vocabulary")


def _checks_width(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
    """Without a cache, refuse the first block's feed-forward at any width but 128."""
    if not kwargs.get("use_cache", True):
        if module.rwkv.blocks[0].feed_forward.key.out_features != 128:
            raise ValueError("the first feed-forward is 128 wide")


def _lines(sm: Any) -> dict[str, str]:
    return {e.where: e.message for e in sm.trace_report.entries if e.kind == "untraced-path"}


def _generate(model: Any) -> torch.Tensor:
    with torch.no_grad():
        out = model.generate(IDS, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False)
    return out  # type: ignore[no-any-return]


def _greedy(model: Any) -> torch.Tensor:
    ids = IDS
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=ids, use_cache=False).logits
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
    return ids


@pytest.mark.filterwarnings("ignore::fxsym.ResizeWarning")
def test_a_forward_that_cannot_run_on_meta_is_said_and_the_cache_still_tried() -> None:
    """The uncached forward calls ``.item()`` (no meta tensor can run it): a ``<model>`` line
    gives its error; the groups are those of the same model without the hook (the hidden size
    and attention widths pinned by their cached failure, their reasons saying the size may break
    every path); each group left halved generates as greedy decoding. Analyzed again, the
    remembered answer is the same; the hook removed, the trials run again and the line is gone.

    Before: no line, and the hidden size and attention widths stayed groups (halved hidden
    size: ``generate`` fails with 'Attempting to broadcast')."""
    plain = fxsym.analyze(_rwkv(), example_inputs={"input_ids": IDS})
    model = _rwkv()
    hook = model.register_forward_pre_hook(_checks_tokens, with_kwargs=True)
    sm = fxsym.analyze(model, example_inputs={"input_ids": IDS})
    lines = _lines(sm)
    assert "<model>" in lines, lines
    assert "Tensor.item() cannot be called on meta tensors" in lines["<model>"]
    assert "does not run on meta tensors" in lines["<model>"]
    assert ({(g.name, g.size) for g in sm.groups()}
            == {(g.name, g.size) for g in plain.groups()})
    pinned = {w for w in lines if w != "<model>"}
    assert pinned == {w for w in _lines(plain) if w != "<model>"} and pinned
    assert "rwkv.embeddings.embedding_dim" in pinned
    assert all("may break every path" in lines[w] and "cached forward" in lines[w]
               for w in pinned)
    assert not {g.name for g in sm.groups()} & pinned
    for group in sm.groups():
        resized, resized_map = copy.deepcopy((model, sm))
        fxsym.resize(resized, resized_map, {group.name: group.size // 2})
        assert torch.equal(_generate(resized), _greedy(resized)), group.name
    assert _lines(fxsym.analyze(model, example_inputs={"input_ids": IDS})) == lines
    hook.remove()
    assert _lines(fxsym.analyze(model, example_inputs={"input_ids": IDS})) == _lines(plain)


@pytest.mark.filterwarnings("ignore::fxsym.ResizeWarning")
def test_a_group_whose_every_trial_size_the_forward_refuses_is_named() -> None:
    """The uncached forward refuses the first feed-forward at any width but 128, so the trial
    cannot try that group: a ``<model>`` line names it as not tried, and it stays a group of
    its size (nothing shows its cache breaks); the hidden size and attention widths are pinned
    as without the hook; the second feed-forward halved generates as greedy decoding.

    Before: no ``<model>`` line, nothing said of the first feed-forward."""
    plain = fxsym.analyze(_rwkv(), example_inputs={"input_ids": IDS})
    model = _rwkv()
    model.register_forward_pre_hook(_checks_width, with_kwargs=True)
    sm = fxsym.analyze(model, example_inputs={"input_ids": IDS})
    lines = _lines(sm)
    first = "rwkv.blocks.0.feed_forward.key.out_features"
    assert "<model>" in lines, lines
    assert f"was not tried for {first}:" in lines["<model>"]
    assert "blocks.1" not in lines["<model>"]
    assert {w for w in lines if w != "<model>"} == {w for w in _lines(plain) if w != "<model>"}
    groups = {g.name: g.size for g in sm.groups()}
    assert groups == {g.name: g.size for g in plain.groups()} and groups[first] == 128
    second = "rwkv.blocks.1.feed_forward.key.out_features"
    resized, resized_map = copy.deepcopy((model, sm))
    fxsym.resize(resized, resized_map, {second: 64})
    assert torch.equal(_generate(resized), _greedy(resized))
