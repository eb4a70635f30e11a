"""The hf plugin claims only what the code it describes justifies, and claims it alike in
every process: look-alike attention gets no sortable heads, per-head bias tables pin the heads
they belong to, and groups do not depend on what was analyzed before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import transformers
from conftest import CONFIGS, build
from helpers import assert_oracles, has_group_with
from torch import nn
from transformers.models.llama.modeling_llama import LlamaAttention

import fxsym
from fxsym.tracer import resolve_example_inputs


class RolledHeads(LlamaAttention):
    """Llama's attention with a forward of its own that hands each head's output to the next
    head's slot: permuting heads no longer commutes with it."""

    def forward(self, hidden_states: torch.Tensor, position_embeddings: Any = None,
                attention_mask: torch.Tensor | None = None,
                **kwargs: Any) -> tuple[torch.Tensor, None]:
        b, s, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = k.repeat_interleave(self.num_key_value_groups, 1)
        v = v.repeat_interleave(self.num_key_value_groups, 1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
        out = out.roll(1, dims=1)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1)), None


def test_a_subclass_overriding_the_forward_of_known_attention_gets_no_sortable_heads() -> None:
    model = build("llama")
    old = model.model.layers[0].self_attn
    rolled = RolledHeads(model.config, 0)
    rolled.load_state_dict(old.state_dict())
    model.model.layers[0].self_attn = rolled
    sm = assert_oracles(model, resolve_example_inputs(model, None), min_groups=3)
    assert not any(has_group_with(sm, "model.layers.0.self_attn", s)
                   for s in ("heads", "head_dim", "queries_per_kv"))
    assert has_group_with(sm, "model.layers.1.self_attn", "heads")  # the genuine layer
    assert any(e.kind == "traced-into" and e.where == "model.layers.0.self_attn"
               for e in sm.trace_report)


class SummedHeads(nn.Module):
    """Looks like attention (q/k/v/o, ``hidden_states``, ``num_heads``, nothing else) but
    mixes its heads: head ``h`` of the output sums heads ``0..h``."""

    def __init__(self, hidden: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.num_heads, self.head_dim = heads, hidden // heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(hidden, hidden) for _ in range(4))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        b, s, _ = hidden_states.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.num_heads, self.head_dim).transpose(1, 2)

        q, k, v = (split(p(hidden_states)) for p in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v)
        out = out.cumsum(1)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class WithLookAlike(nn.Module):
    """A model carrying a transformers config (so the hf plugin prepares its trace)."""

    def __init__(self) -> None:
        super().__init__()
        self.config = transformers.PretrainedConfig()
        self.inp, self.attn, self.out = nn.Linear(8, 32), SummedHeads(), nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        return self.out(h + self.attn(h))


def test_a_look_alike_module_that_mixes_heads_gets_no_sortable_heads() -> None:
    model = WithLookAlike().eval()
    sm = assert_oracles(model, (torch.randn(2, 5, 8),))
    graph_targets = {n.target for n in sm.graph_module.graph.nodes if n.op == "call_module"}
    assert "attn" not in graph_targets and "attn.q_proj" in graph_targets  # traced through
    assert not any(g.name.startswith("attn.") and g.name.endswith(("heads", "head_dim"))
                   for g in sm.groups())


def _beit(**flags: bool) -> nn.Module:
    cfg = transformers.AutoConfig.for_model(
        "beit", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, image_size=32, patch_size=8, num_labels=3, **flags)
    torch.manual_seed(0)
    model = transformers.BeitForImageClassification(cfg).eval()
    with torch.no_grad():  # a zero table would hide a missing member
        for name, p in model.named_parameters():
            if name.endswith("relative_position_bias_table"):
                p.normal_()
    return model


@pytest.mark.parametrize("flag", ["use_relative_position_bias",
                                  "use_shared_relative_position_bias"])
def test_beit_relative_position_bias_table_pins_the_heads_it_biases(flag: str) -> None:
    model = _beit(**{flag: True})
    sm = assert_oracles(model, resolve_example_inputs(model, None), min_groups=3)
    assert not has_group_with(sm, "beit.layers.0.attention", "heads")
    assert has_group_with(sm, "beit.layers.0.attention", "head_dim")  # the bias has none
    assert has_group_with(sm, "beit.layers.0.mlp.fc1", "out_features")


def test_beit_without_a_per_head_bias_keeps_its_heads() -> None:
    model = _beit()
    sm = assert_oracles(model, resolve_example_inputs(model, None), min_groups=3)
    assert has_group_with(sm, "beit.layers.0.attention", "heads")


# -- history ---------------------------------------------------------------------------------
class OwnAttention(nn.Module):
    """Plain multi-head attention of our own, attention-shaped."""

    def __init__(self, hidden: int = 32, heads: int = 4, kv_in: int | None = None) -> None:
        super().__init__()
        self.num_heads = heads
        self.q_proj, self.o_proj = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(kv_in or hidden, hidden)
        self.v_proj = nn.Linear(kv_in or hidden, hidden)

    def forward(self, hidden_states: torch.Tensor, other: torch.Tensor | None = None
                ) -> torch.Tensor:
        b, s, _ = hidden_states.shape
        kv = hidden_states if other is None else other

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, -1, self.num_heads, t.shape[-1] // self.num_heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(split(self.q_proj(hidden_states)),
                                             split(self.k_proj(kv)), split(self.v_proj(kv)))
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class OwnModel(nn.Module):
    def __init__(self, kv_in: int | None = None) -> None:
        super().__init__()
        self.config = transformers.PretrainedConfig()
        self.inp, self.out = nn.Linear(8, 32), nn.Linear(32, 3)
        self.attn = OwnAttention(kv_in=kv_in)
        self.ctx = nn.Linear(8, kv_in) if kv_in else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        return self.out(h + self.attn(h, None if self.ctx is None else self.ctx(x)))


def _signature(model: nn.Module, inputs: Any = None) -> list[Any]:
    sm = fxsym.analyze(model, example_inputs=inputs)
    return sorted([g.name, g.size, g.is_sortable, sorted(map(list, g.members))]
                  for g in sm.groups())


def _target(name: str) -> list[Any]:
    if name == "own":
        torch.manual_seed(0)
        return _signature(OwnModel().eval(), (torch.randn(2, 5, 8),))
    return _signature(build(name))


def _fresh(name: str) -> list[Any]:
    here = Path(__file__).parent
    code = ("import json, sys; sys.path[:0] = sys.argv[1:3]; import test_soundness as t; "
            f"print(json.dumps(t._target({name!r})))")
    out = subprocess.run([sys.executable, "-c", code, str(here), str(here.parent)],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["llama", "own"])
def test_groups_do_not_depend_on_what_was_analyzed_before(name: str) -> None:
    fresh = _fresh(name)
    torch.manual_seed(0)  # an instance of the same class whose keys come from elsewhere
    fxsym.analyze(OwnModel(kv_in=16).eval(), example_inputs=(torch.randn(2, 5, 8),))
    for other in [f for f in CONFIGS if f != name][:20]:
        fxsym.analyze(build(other))
    assert json.loads(json.dumps(_target(name))) == fresh
