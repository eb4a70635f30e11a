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


@pytest.mark.parametrize("family", ["gemma3_text", "qwen3", "llama4_text", "zamba2"])
def test_layers_that_differ_each_get_their_own_layout(family: str) -> None:
    """Decoder layers alike in their tensors but not in what they do (gemma3's sliding and
    global attention, qwen3's window up to ``max_window_layers``, llama4's chunked layers
    without rope, zamba2's shared attention called from several layers): the layout equals
    the oracle's (a trial resize of whole-model probe copies), so nothing found for one
    layer stands for another."""
    import transformers
    from ckpt_helpers import LAYERED, tiny_config

    torch.manual_seed(0)
    config = tiny_config(family, num_hidden_layers=4, **LAYERED[family])
    m = transformers.AutoModelForCausalLM.from_config(config).eval()
    assert_same_layout(m, fxsym.analyze(m))
