"""Tied embeddings and the output contract of task models (issue 9, item 7).

T5 and Bart share one embedding between encoder, decoder and ``lm_head``. Their task models'
contract is ``logits`` (and ``loss``), so ``encoder_last_hidden_state`` does not pin ``d_model``:
it is one resizable group holding every place of the shared tensor, and after a resize the
tensor is still shared, with no warning.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import build
from helpers import assert_oracles

import fxsym
from fxsym.tracer import resolve_example_inputs


def _shared_places(model: torch.nn.Module) -> list[list[str]]:
    places: dict[int, list[str]] = {}
    for name, mod in model.named_modules(remove_duplicate=False):
        for pname, p in mod._parameters.items():
            if p is not None:
                places.setdefault(id(p), []).append(f"{name}.{pname}")
    return [v for v in places.values() if len(v) > 1]


@pytest.mark.parametrize("model_type", ["t5", "bart"])
def test_d_model_is_one_group_and_the_embedding_stays_shared(model_type: str) -> None:
    model = build(model_type)
    sm = assert_oracles(model, resolve_example_inputs(model, None))
    assert sm.output_contract == ("logits",)
    (embed,) = [p for p in _shared_places(model) if p[0].endswith("shared.weight")]
    hidden = [g for g in sm.groups() if ("lm_head", "in_features") in g.members]
    assert len(hidden) == 1, [g.name for g in sm.groups()]
    group = hidden[0]
    assert group.size == 64
    if model_type == "t5":  # T5's embeddings are leaves: their symbols are members
        assert {("encoder.embed_tokens", "embedding_dim"),
                ("decoder.embed_tokens", "embedding_dim")} <= set(group.members)
    keep = torch.randperm(64, generator=torch.Generator().manual_seed(1))[:40]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # Bart keeps 4 heads of 16 in a d_model of 40, and BartConfig derives head_dim from
        # d_model // heads: the config is marked, with a warning
        warnings.filterwarnings("ignore", "[^ ]*config does not describe", fxsym.ResizeWarning)
        fxsym.resize(model, sm, {group.name: keep})
    tensors = {model.get_parameter(p) for p in embed}
    assert len(tensors) == 1 and next(iter(tensors)).shape == (100, 40)
    inputs = resolve_example_inputs(model, None)
    assert model(**inputs).logits.shape[-1] == 100


def test_every_output_is_kept_when_asked() -> None:
    model = build("t5")
    sm = fxsym.analyze(model, outputs="*")
    assert sm.output_contract is None
    assert not any(("lm_head", "in_features") in g.members for g in sm.groups())


def test_a_base_model_keeps_every_output() -> None:
    model = build("t5")
    base = model.get_encoder()
    sm = fxsym.analyze(base)
    assert sm.output_contract is None
