"""Guards and input-shape merges in real models (random weights, nothing downloaded).

* timm ``edgenext_xx_small``: its cross-covariance attention merges heads back with
  ``reshape(B, N, C)``, ``C`` read from the block's input, whose channels are fixed there:
  the heads cannot shrink (they were a group, and halving it crashed);
* ultralytics YOLO11n (built from ``yolo11n.yaml``): ``C2PSA``'s attention does the same;
  and YOLOv8n/YOLO11n after an eval forward (``Detect``'s anchors kept on the module);
* diffusers ``UNet2DConditionModel`` from a small config: ``Downsample2D``/``Upsample2D``
  assert ``hidden_states.shape[1] == self.channels`` (the attribute is tied; halving its
  group tripped the assert) and ``Upsample2D`` compares ``numel()`` with ``2**31`` (a guard
  that holds for every size).

Each: analyze, the permutation oracle passes, every group halved runs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import fxsym
from fxsym.oracles import check_permutation, check_shrink, check_values


def _oracles(model: nn.Module, inputs: Any, seeds: tuple[int, ...] = (0, 1)) -> fxsym.SymMap:
    sm = fxsym.analyze(model, example_inputs=inputs)
    assert sm.groups()
    perm = check_permutation(model, sm, inputs, seeds=seeds)
    assert perm.ok, perm
    shrink = check_shrink(model, sm, inputs)
    assert shrink.ok, shrink
    return sm


def _members(sm: fxsym.SymMap) -> set[tuple[str, str]]:
    return {m for g in sm.groups() for m in g.members}


def test_edgenext_heads_merged_back_by_the_inputs_channels() -> None:
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("edgenext_xx_small", pretrained=False).eval()
    sm = _oracles(model, (torch.randn(1, 3, 64, 64),))
    xca = [name for name, m in model.named_modules() if type(m).__name__ == "CrossCovarianceAttn"]
    assert xca
    members = _members(sm)
    for name in xca:
        assert (f"{name}.qkv", "out_features") not in members
    merged = {name for name in xca for e in sm.trace_report
              if e.where.startswith(name) and "size read from a fixed dim" in e.message}
    assert merged, sm.trace_report  # the others are pinned before for other reasons


@pytest.mark.parametrize("yaml", ["yolov8n.yaml", "yolo11n.yaml"])
def test_yolo_after_an_eval_forward(yaml: str) -> None:
    """ultralytics' build runs a forward, and so does a user measuring the model: ``Detect``
    keeps anchors and strides computed from the feature maps' spatial sizes and constant
    strides. They depend on nothing a resize changes, so the resizes of the oracles go on."""
    ultralytics = pytest.importorskip("ultralytics")
    torch.manual_seed(0)
    model = ultralytics.YOLO(yaml).model.eval()
    inputs = (torch.randn(1, 3, 64, 64),)
    sm = fxsym.analyze(model, example_inputs=inputs)
    with torch.no_grad():
        model(*inputs)
    head = type(model.model[-1]).__name__
    assert head == "Detect" and model.model[-1].anchors.numel()
    name = str(len(model.model) - 1)
    assert sm.derived_state[f"model.{name}"] == {
        "anchors": "invariant", "strides": "invariant", "shape": "derived"}
    attn = [name for name, m in model.named_modules() if type(m).__name__ == "Attention"]
    assert bool(attn) == yaml.startswith("yolo11")  # C2PSA's
    groups = {m: g for g in sm.groups() for m in g.members}
    for name in attn:  # heads merged back by the input's C: pinned, or tied to C's size
        heads = groups.get((f"{name}.qkv.conv", "out_channels"))
        assert heads is None or heads.same_size, heads
    assert check_permutation(model, sm, inputs, seeds=(0,)).ok
    shrink = check_shrink(model, sm, inputs)
    assert shrink.ok, shrink
    values = check_values(model, sm, inputs)
    assert values.status != "failed", values


def test_unet_upsample_assert_and_numel() -> None:
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model = diffusers.UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
        attention_head_dim=8, norm_num_groups=8).eval()
    inputs = {"sample": torch.randn(1, 4, 8, 8), "timestep": torch.tensor(1),
              "encoder_hidden_states": torch.randn(1, 3, 32)}
    sm = _oracles(model, inputs)
    groups = {m: g.name for g in sm.groups() for m in g.members}
    up = groups.get(("up_blocks.0.upsamplers.0", "attr:channels"))
    assert up is not None and up == groups[("up_blocks.0.upsamplers.0.conv", "in_channels")]
    assert not sm.trace_report.of_kind("guard"), sm.trace_report.of_kind("guard")
