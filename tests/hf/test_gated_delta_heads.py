"""Qwen3-Next's gated delta net resized by whole key heads.

Its ``in_proj_qkvz`` holds, per key head, a query and a key of ``linear_key_head_dim`` and
``r = linear_num_value_heads // linear_num_key_heads`` value heads and gates of
``linear_value_head_dim``; ``in_proj_ba`` the ``r`` betas and decays per key head; the causal
``conv1d`` runs over the query | key | value concatenation; ``dt_bias`` and ``A_log`` hold
one entry per value head and ``out_proj`` reads the value heads. A key head with its value
heads is one unit of one group (tests/test_fused_head_blocks.py has the rules on small
modules). Resized, the model equals a Qwen3-Next built from the config the resize wrote
(fewer key and value heads) holding the kept heads' weights, sliced here by hand, in float64.
"""

from __future__ import annotations

import copy

import torch
import transformers
from ckpt_helpers import LAYERED, tiny_config
from helpers import group_with

import fxsym


def _config() -> object:
    overrides = dict(LAYERED["qwen3_next"], layer_types=["linear_attention", "full_attention"])
    config = tiny_config("qwen3_next", num_hidden_layers=2, **overrides)
    config._experts_implementation = "eager"  # grouped_mm takes no float64
    return config


def _sliced_state(model: torch.nn.Module, keep: dict[int, list[int]]) -> dict[str, torch.Tensor]:
    """The state dict of ``model`` with only the ``keep[layer]`` key heads of each gated delta
    net, their weights cut out by hand from each parameter's layout."""
    config = model.config
    nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv, r = config.linear_key_head_dim, config.linear_value_head_dim, nv // nk
    width, key_dim = 2 * dk + 2 * r * dv, nk * dk
    state = model.state_dict()
    for layer, heads in keep.items():
        p = f"model.layers.{layer}.linear_attn."

        def rows(t: torch.Tensor, n: int, offset: int = 0, heads: list[int] = heads
                 ) -> torch.Tensor:
            return torch.cat([t[offset + h * n:offset + (h + 1) * n] for h in heads])

        conv = state[p + "conv1d.weight"]
        state[p + "conv1d.weight"] = torch.cat([rows(conv, dk), rows(conv, dk, key_dim),
                                                rows(conv, r * dv, 2 * key_dim)])
        state[p + "in_proj_qkvz.weight"] = rows(state[p + "in_proj_qkvz.weight"], width)
        state[p + "in_proj_ba.weight"] = rows(state[p + "in_proj_ba.weight"], 2 * r)
        state[p + "dt_bias"] = rows(state[p + "dt_bias"], r)
        state[p + "A_log"] = rows(state[p + "A_log"], r)
        state[p + "out_proj.weight"] = rows(state[p + "out_proj.weight"].T, r * dv).T
    return state


def test_key_heads_of_the_gated_delta_net_resize_as_a_smaller_model() -> None:
    """Before: in_proj_qkvz, in_proj_ba and conv1d were pinned ('a size read from one dim
    reshapes another' at the fused views)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config()).double().eval()
    ids = torch.randint(3, 300, (2, 10), generator=torch.Generator().manual_seed(0))
    sm = fxsym.analyze(model, example_inputs={"input_ids": ids})
    keep = {0: [1]}
    names = {}
    for layer in keep:
        p = f"model.layers.{layer}.linear_attn"
        heads = group_with(sm, f"{p}.in_proj_qkvz", "out_features")
        assert heads.size == 2
        for member in [(f"{p}.in_proj_ba", "out_features"), (f"{p}.conv1d", "weight:0"),
                       (p, "A_log:0"), (p, "dt_bias:0"), (f"{p}.out_proj", "in_features"),
                       (p, "attr:num_k_heads"), (p, "attr:num_v_heads")]:
            assert member in heads.members, member
        names[layer] = heads.name
    original = copy.deepcopy(model)
    fxsym.resize(model, sm, {names[layer]: heads for layer, heads in keep.items()})
    assert (model.config.linear_num_key_heads, model.config.linear_num_value_heads) == (1, 2)
    config = _config()
    config.linear_num_key_heads, config.linear_num_value_heads = 1, 2
    reference = transformers.AutoModelForCausalLM.from_config(config).double().eval()
    reference.load_state_dict(_sliced_state(original, keep), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits,
                                   reference(input_ids=ids).logits, rtol=1e-12, atol=1e-12)
        assert torch.equal(model.generate(ids, max_new_tokens=4, do_sample=False),
                           reference.generate(ids, max_new_tokens=4, do_sample=False))
