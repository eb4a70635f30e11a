"""Models assembled from transformers building blocks need no code of their own; attention
the resize rule could not slice correctly is traced through instead of guessed."""

from __future__ import annotations

import pytest
import torch
from conftest import build
from helpers import assert_oracles, has_group_with
from torch import nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from fxsym.tracer import resolve_example_inputs


class Assembled(nn.Module):
    """Not a PreTrainedModel: an embedding, Llama decoder layers and a head."""

    def __init__(self) -> None:
        super().__init__()
        cfg = build("llama").config
        self.embed = nn.Embedding(100, 64)
        self.rotary = LlamaRotaryEmbedding(cfg)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i) for i in range(2))
        self.head = nn.Linear(64, 10)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        positions = torch.arange(ids.shape[1], device=ids.device)[None]
        cos_sin = self.rotary(h, positions)
        for layer in self.layers:
            h = layer(h, position_embeddings=cos_sin)
        return self.head(h)


def test_a_model_assembled_from_llama_blocks() -> None:
    model = Assembled().eval()
    sm = assert_oracles(model, (torch.randint(0, 100, (2, 6)),), min_groups=7)
    for member in [("embed", "embedding_dim"), ("layers.0.self_attn", "heads"),
                   ("layers.1.self_attn", "heads"), ("layers.0.self_attn", "queries_per_kv"),
                   ("layers.0.mlp.gate_proj", "out_features")]:
        assert has_group_with(sm, *member), member


def test_attention_with_per_head_tensors_is_traced_through() -> None:
    model = build("llama")
    attn = model.model.layers[0].self_attn
    attn.sinks = nn.Parameter(torch.zeros(4))  # per-head: a heads resize could not slice it
    sm = assert_oracles(model, {"input_ids": torch.randint(0, 100, (2, 8))}, min_groups=3)
    assert not has_group_with(sm, "model.layers.0.self_attn", "heads")
    assert has_group_with(sm, "model.layers.1.self_attn", "heads")
    nodes = [n for n in sm.graph_module.graph.nodes if n.op == "call_module"]
    assert "model.layers.0.self_attn.q_proj" in {n.target for n in nodes}  # traced through
    assert "model.layers.1.self_attn" in {n.target for n in nodes}  # still a leaf


@pytest.mark.parametrize("family", ["electra", "starcoder2", "dinov2"])
def test_more_families_find_their_heads(family: str) -> None:
    model = build(family)
    sm = assert_oracles(model, resolve_example_inputs(model, None), min_groups=3)
    assert any(symbol == "heads" for g in sm.groups() for _, symbol in g.members)


#: family -> a construct the trace report names (why some sizes stay constant)
REPORTED = {
    "phi3": "a factor of a product of sizes bounding a slice",  # head_dim of qkv_proj
    "olmo2": "",  # q_norm over all heads: attention traced through
    "falcon": "overrides forward of Linear",  # FalconLinear
    # relative position bias table: the index addresses its rows by position
    "swin": "getitem addresses an elastic dim by position",
    # one embedding weight read by encoder and decoder: one hidden size, which the encoder's
    # last hidden state (a model output) pins
    "bart": "reaches the model output",
    # the router's k stays as it is (the number of experts is a group: tests/hf/test_moe.py)
    "mixtral": "topk's k, the number of entries picked, stays as it is",
}


def test_multi_query_fused_projection_split_at_attribute_sizes() -> None:
    """gpt_bigcode's ``c_attn`` holds the queries, then one key and one value head, split at
    ``(self.embed_dim, self.kv_dim, self.kv_dim)``: the pieces stay groups and the
    attributes follow them."""
    model = build("gpt_bigcode")
    sm = assert_oracles(model, resolve_example_inputs(model, None))
    assert has_group_with(sm, "transformer.h.0.attn.c_attn", "out_features")
    assert has_group_with(sm, "transformer.h.0.attn", "attr:embed_dim")


@pytest.mark.parametrize("family", sorted(REPORTED))
def test_unsupported_constructs_stay_sound_and_are_reported(family: str) -> None:
    model = build(family)
    sm = assert_oracles(model, resolve_example_inputs(model, None), min_groups=0)
    assert sm.groups(), "some size is still found"
    assert any(REPORTED[family] in e.message for e in sm.trace_report)
