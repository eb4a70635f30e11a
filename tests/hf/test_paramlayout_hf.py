"""The layout derived from the analysis equals the probe layout on transformers families
(issue 22 §6): attention leaves (heads, queries per key/value head, head dims), GPT-2's
transposed Conv1D, fused qkv, tied embeddings, MoE experts."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from helpers import assert_same_layout, assert_shapes_counted

import fxsym

FAMILIES = ["llama", "gpt2", "bert", "t5", "qwen2", "mixtral", "falcon", "bloom", "opt", "vit",
            "gpt_bigcode", "phi3"]


@pytest.mark.parametrize("family", FAMILIES)
def test_direct_layout_equals_the_probe_layout(family: str,
                                               tiny: Callable[..., torch.nn.Module]) -> None:
    m = tiny(family)
    assert_same_layout(m, fxsym.analyze(m))


def test_tied_embeddings_agree(tiny: Callable[..., torch.nn.Module]) -> None:
    m = tiny("llama", tie_word_embeddings=True)
    lay = assert_same_layout(m, fxsym.analyze(m))
    assert "lm_head.weight" not in lay.shapes  # one parameter, under its first name


@pytest.mark.parametrize("family", ["llama", "gpt2", "mixtral"])
def test_changed_shapes_count_heads_and_head_dims_crosswise(
        family: str, tiny: Callable[..., torch.nn.Module]) -> None:
    m = tiny(family)
    assert_shapes_counted(fxsym.paramlayout.layout(m, fxsym.analyze(m)))
