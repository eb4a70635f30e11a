"""diffusers' UNets from small configs (random weights, nothing downloaded), through the three
oracles in float64, with the coverage a real shrink gives (issue 21).

What used to pin their groups, each a mechanism with a test on a tiny module of its own:
the attention processors' ``head_dim = key.shape[-1] // attn.heads`` reshaping the query
(``tests/test_size_quotients.py``) and the up blocks' skip concatenations under a GroupNorm
whose norm groups straddle the parts (``tests/test_group_norm.py``).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from helpers import assert_oracles, group_with
from torch import nn

import fxsym

diffusers = pytest.importorskip("diffusers")


def _projections(model: nn.Module) -> dict[str, int]:
    return {name: m.weight.shape[0] for name, m in model.named_modules()
            if isinstance(m, (nn.Conv2d, nn.Linear))}


def shrunk_share(model: nn.Module, sm: fxsym.SymMap) -> float:
    """The share of convs and linears whose output really shrinks when every group is halved
    (measured on the weights, as ``benchmarks/shrink_coverage.py`` does)."""
    clone, clone_sm = copy.deepcopy((model, sm))
    before = _projections(clone)
    fxsym.resize(clone, clone_sm, {g.name: max(1, g.size // 2) for g in sm.groups()})
    after = _projections(clone)
    return sum(after[k] < before[k] for k in before) / len(before)


def unet2d() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    model = diffusers.UNet2DModel(
        sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(32, 64), norm_num_groups=8,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    x = (torch.randn(1, 3, 8, 8, dtype=torch.float64), torch.tensor([10]))
    return model.double().eval(), x


def unet2d_condition(**config: Any) -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    model = diffusers.UNet2DConditionModel(**{**dict(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64), norm_num_groups=8, cross_attention_dim=24,
        attention_head_dim=8, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D")), **config})
    x = (torch.randn(1, 4, 8, 8, dtype=torch.float64), torch.tensor([10]),
         torch.randn(1, 7, 24, dtype=torch.float64))
    return model.double().eval(), x


def test_unet2d_attention_heads_and_skips_are_groups() -> None:
    model, x = unet2d()
    sm = assert_oracles(model, x, min_groups=10)
    attn = "down_blocks.1.attentions.0"
    heads = group_with(sm, f"{attn}.to_q", "out_features")
    for member in [(f"{attn}.to_k", "out_features"), (f"{attn}.to_v", "out_features"),
                   (f"{attn}.to_out.0", "in_features"), (attn, "attr:heads")]:
        assert member in heads.members
    # the output of an up block's first resnet is concatenated with a skip of 32 channels
    # under norm groups of 12: it keeps a part that changes by whole norm groups of both
    group_with(sm, "up_blocks.0.resnets.0.conv2", "out_channels")
    assert shrunk_share(model, sm) > 0.9


def test_unet2d_condition_self_and_cross_attention_are_groups() -> None:
    model, x = unet2d_condition()
    sm = assert_oracles(model, x, min_groups=10)
    block = "down_blocks.0.attentions.0.transformer_blocks.0"
    for attn in (f"{block}.attn1", f"{block}.attn2"):
        heads = group_with(sm, f"{attn}.to_q", "out_features")
        assert (f"{attn}.to_k", "out_features") in heads.members
        assert (attn, "attr:heads") in heads.members
    assert shrunk_share(model, sm) > 0.9


def test_config_follows_a_prune_it_can_describe_through_save_pretrained(tmp_path: Any) -> None:
    """A uniform plan whose sizes the config can hold round-trips through diffusers' own
    ``save_pretrained``/``from_pretrained``: the fields are found by what they size
    (``block_out_channels``, ``norm_num_groups`` — norm groups are dropped whole —, the heads
    ``attention_head_dim`` counts here), the outputs are the pruned model's. The config's
    Fourier time projection is as wide as ``time_embedding_dim``, fixed by its random
    frequencies, so the time-embedding MLP (which that field also sizes) stays out of the
    plan; equal block widths keep every skip concatenation in whole norm groups."""
    model, x = unet2d_condition(block_out_channels=(32, 32), time_embedding_type="fourier",
                                time_embedding_dim=64)
    sm = fxsym.analyze(model, example_inputs=x)
    time_mlp = [g.name for g in sm.groups()
                if any(m.startswith("time_embedding.") for m, _ in g.members)]
    fxsym.plan(model, sm, ratio=0.5, scope="uniform", exclude=time_mlp).apply(model, sm)
    config = model.config
    assert (config.block_out_channels, config.norm_num_groups) == ((16, 16), 4)
    assert (config.attention_head_dim, config.time_embedding_dim) == (4, 64)
    assert_round_trips(model, x, tmp_path)


def assert_round_trips(model: Any, x: Any, directory: Any) -> None:
    """diffusers' own ``save_pretrained`` then ``from_pretrained`` give back ``model``'s
    outputs (float64, to 1e-12)."""
    model.save_pretrained(directory)
    loaded = diffusers.UNet2DConditionModel.from_pretrained(directory).double().eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(*x).sample, model(*x).sample, rtol=1e-12,
                                   atol=1e-12)

def test_save_pretrained_refuses_a_prune_the_config_cannot_describe(tmp_path: Any) -> None:
    """Halving every group of a UNet with blocks of 32 and 64 channels leaves norm groups of
    several sizes (a skip concatenation keeps the norm groups it straddles) and a sinusoidal
    time projection as wide as the old ``block_out_channels[0]``: one config cannot hold
    that. diffusers' ``save_pretrained`` raises before writing a weight."""
    model, x = unet2d_condition()
    sm = fxsym.analyze(model, example_inputs=x)
    with pytest.warns(fxsym.ResizeWarning, match="block_out_channels"):
        fxsym.plan(model, sm, ratio=0.5, scope="uniform").apply(model, sm)
    with pytest.raises(fxsym.ResizeError, match="norm_num_groups"):
        model.save_pretrained(tmp_path)
    assert not list(tmp_path.glob("*.safetensors"))
    model(*x)  # the pruned model itself runs


def test_sd_shaped_unet_round_trips_a_uniform_describable_prune(tmp_path: Any) -> None:
    """A Stable-Diffusion-shaped UNet: blocks of 32 and 64 channels under one
    ``norm_num_groups`` of 8 (the up blocks' skip concatenations of 64 + 32 channels straddle
    norm groups of 12). Analyzed with ``norm_groups="keep"`` every norm group loses as many
    channels, so ``norm_num_groups`` can stay; ``describable=True`` keeps whole what the config
    could not follow: here the time-embedding MLP, which ``time_embedding_dim`` sizes together
    with the Fourier projection's fixed random frequencies. A uniform half of everything else
    round-trips through diffusers' own ``save_pretrained``/``from_pretrained``."""
    model, x = unet2d_condition(time_embedding_type="fourier", time_embedding_dim=64)
    sm = fxsym.analyze(model, example_inputs=x, norm_groups="keep")
    assert fxsym.oracles.check_permutation(model, sm, x, seeds=(0,)).ok
    plan = fxsym.plan(model, sm, ratio=0.5, scope="uniform", describable=True)
    kept_whole = plan.extra["undescribed"]
    assert sorted(kept_whole) == [group_with(sm, f"time_embedding.linear_{i}",
                                             "out_features").name for i in (1, 2)]
    assert all("time_embedding_dim also sizes time_proj" in r for r in kept_whole.values())
    assert all(g.kept == g.size // 2 for g in plan.groups if g.name not in kept_whole)
    assert plan.params_after < plan.params_before / 3
    plan.apply(model, sm)
    config = model.config
    assert (config.block_out_channels, config.norm_num_groups) == ((16, 32), 8)
    assert (config.attention_head_dim, config.time_embedding_dim) == (4, 64)
    assert_round_trips(model, x, tmp_path)


def test_sinusoidal_time_projection_keeps_every_tied_group_whole() -> None:
    """The sinusoidal ``Timesteps`` projection is as wide as ``block_out_channels[0]`` and no
    resize can change it (its frequencies depend on its width), so that field cannot change:
    every group it sizes stays, and so does every group tied to one of those by a field
    (``attention_head_dim``, one head count for all blocks) or by a same-size class (a skip
    concatenation's norm groups keep as many channels of both levels). For this
    Stable-Diffusion shape that is every group: the describable plan changes nothing, and
    says why."""
    model, x = unet2d_condition()
    sm = fxsym.analyze(model, example_inputs=x, norm_groups="keep")
    plan = fxsym.plan(model, sm, ratio=0.5, scope="uniform", describable=True)
    assert all(g.keep is None for g in plan.groups)
    reasons = plan.extra["undescribed"]
    assert sorted(reasons) == sorted(g.name for g in sm.groups())
    conv_in = group_with(sm, "conv_in", "out_channels").name
    assert "block_out_channels[0] also sizes" in reasons[conv_in]
    assert "time_proj.num_channels" in reasons[conv_in]
    mid = group_with(sm, "mid_block.resnets.0.conv1", "out_channels").name
    assert "holds it and" in reasons[mid]
