"""The cached-path trials of analyze are remembered by what decides them
(:mod:`fxsym_plugins_hf.trialkey`): a model analyzed again, or another of the same build, reuses
the answer; patched code or state the key cannot describe runs the trials again.

The trials are seen by a plugin whose ``fxsym_after_resize`` counts the resizes of meta copies
(only the trials resize those). A new plugin object is a new key, so each test starts with no
answer remembered.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
import transformers

import fxsym

IDS = torch.tensor([[1, 5, 9, 12, 40, 7, 3, 22]])


class _Trials:
    """Counts the trials' resizes (of meta copies)."""

    def __init__(self) -> None:
        self.count = 0

    @fxsym.hookimpl
    def fxsym_after_resize(self, model: Any, symmap: Any, kept: Any, sizes: Any) -> None:
        if next(model.parameters()).is_meta:
            self.count += 1


def _manager() -> tuple[fxsym.PluginManager, _Trials]:
    pm = fxsym.PluginManager()
    fxsym.load_plugins(manager=pm, allow=["nn", "hf"])
    trials = _Trials()
    pm.register(trials, name="trials")
    return pm, trials


def _rwkv() -> Any:
    config = transformers.AutoConfig.for_model(
        "rwkv", hidden_size=64, num_hidden_layers=2, vocab_size=100, attention_hidden_size=64,
        intermediate_size=128, context_length=32)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _answer(sm: Any) -> tuple[Any, ...]:
    """What an analysis says: its groups and its report lines about the cached path."""
    groups = tuple((g.name, g.size, g.members, g.step) for g in sm.groups())
    lines = tuple((e.where, e.message) for e in sm.trace_report.entries
                  if e.kind == "untraced-path")
    return groups, lines


@pytest.mark.filterwarnings("ignore::fxsym.ResizeWarning")
def test_a_model_analyzed_again_reuses_the_trials_answer() -> None:
    """RWKV (its hidden size and attention widths pinned by the trials): analyzed again, and
    another RWKV of the same build (other random weights), no trial runs; the three analyses
    have the same groups and the same report lines, the first's found by the trials."""
    pm, trials = _manager()
    with fxsym.use_plugins(pm):
        model = _rwkv()
        first = _answer(fxsym.analyze(model, example_inputs={"input_ids": IDS}))
        ran = trials.count
        again = _answer(fxsym.analyze(model, example_inputs={"input_ids": IDS}))
        torch.manual_seed(1)
        other = _answer(fxsym.analyze(_rwkv(), example_inputs={"input_ids": IDS}))
    assert ran >= 2, "the trials ran: RWKV's joint trial fails, each group tried alone"
    assert first[1], "the trials pinned groups"
    assert trials.count == ran
    assert again == first and other == first


def _helper(model: Any) -> None:
    """What the cached path of :class:`_LM` calls first (patched below)."""


class _LM(transformers.LlamaForCausalLM):
    """A Llama whose cached path calls :func:`_helper` on the model first."""

    def prepare_inputs_for_generation(self, *args: Any, **kwargs: Any) -> Any:
        _helper(self)
        return super().prepare_inputs_for_generation(*args, **kwargs)


def _llama(cls: type) -> Any:
    config = transformers.AutoConfig.for_model(
        "llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
    torch.manual_seed(0)
    return cls._from_config(config).eval()


def _other_helper(model: Any) -> None:
    """Another helper: the trials cannot know what it does without running it."""


def _other_method(self: Any, *args: Any, **kwargs: Any) -> Any:
    return transformers.LlamaForCausalLM.prepare_inputs_for_generation(self, *args, **kwargs)


@pytest.mark.filterwarnings("ignore::fxsym.ResizeWarning")
def test_code_patched_between_analyses_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """One model analyzed four times: again as it was (no trial), then with a helper of its
    class's module patched, then with a method of its class patched (the trials run each
    time: the code they would run is not the code they ran)."""
    pm, trials = _manager()
    model = _llama(_LM)
    counts = []
    with fxsym.use_plugins(pm):
        for patch in (None, None, (sys.modules[__name__], "_helper", _other_helper),
                      (_LM, "prepare_inputs_for_generation", _other_method)):
            if patch is not None:
                monkeypatch.setattr(*patch)
            fxsym.analyze(model, example_inputs={"input_ids": IDS})
            counts.append(trials.count)
    assert counts[0] >= 1 and counts[1] == counts[0]
    assert counts[3] > counts[2] > counts[1]


@pytest.mark.filterwarnings("ignore::fxsym.ResizeWarning")
def test_state_the_key_cannot_describe_runs_the_trials() -> None:
    """A module holding a tensor that is no parameter or buffer has no key: each analysis runs
    the trials."""
    pm, trials = _manager()
    model = _llama(transformers.LlamaForCausalLM)
    model.model.table = torch.arange(3)
    with fxsym.use_plugins(pm):
        first = _answer(fxsym.analyze(model, example_inputs={"input_ids": IDS}))
        again = _answer(fxsym.analyze(model, example_inputs={"input_ids": IDS}))
    assert trials.count == 2 and again == first
