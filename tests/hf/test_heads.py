"""Hidden states consumed by heads (issue 19, §6): segmentation and multi-scale decoders.

A task model's contract is its ``logits`` (and ``loss``), so its hidden states are not
pinned; every head that reads them must be a member of their groups. Transformers 5 collects
hidden states with forward hooks installed on the first forward that asks for them; they
are part of how the model computes and run while it is traced, whether they were installed
before the analysis (an eager forward) or during its trace.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from helpers import assert_oracles
from torch import nn

transformers = pytest.importorskip("transformers")

import fxsym  # noqa: E402
from fxsym.oracles import check_permutation, check_shrink  # noqa: E402

SEGFORMER = dict(num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                 hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                 num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32,
                 num_labels=3, image_size=32)


def _segformer() -> nn.Module:
    cfg = transformers.AutoConfig.for_model("segformer", **SEGFORMER)
    torch.manual_seed(0)
    return transformers.SegformerForSemanticSegmentation(cfg).eval()


@pytest.mark.parametrize("run_first", [True, False], ids=["after-eager", "fresh"])
def test_segformer_stages_hold_the_decode_head_projections(run_first: bool) -> None:
    model = _segformer()
    x = {"pixel_values": torch.randn(1, 3, 32, 32)}
    if run_first:  # installs transformers' output-capturing hooks on the stages
        with torch.no_grad():
            model(**x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fxsym.ResizeWarning)  # non-uniform stage config
        sm = assert_oracles(model, x, min_groups=8)
    groups = {g.name: set(g.members) for g in sm.groups()}
    for i in (0, 1):
        stage = groups[f"segformer.stages.{i}.patch_embeddings.proj.out_channels"]
        assert (f"decode_head.linear_projections.{i}.proj", "in_features") in stage
    assert not sm.trace_report.fallbacks


@dataclasses.dataclass
class _Features(transformers.utils.ModelOutput):
    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


@dataclasses.dataclass
class _Plain:
    hidden_states: tuple[torch.Tensor, ...]


class _Backbone(nn.Module):
    def __init__(self, plain: bool) -> None:
        super().__init__()
        self.plain = plain
        self.s1 = nn.Conv2d(3, 8, 3, padding=1)
        self.s2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> _Features | _Plain:
        h1 = torch.relu(self.s1(x))
        h2 = torch.relu(self.s2(h1))
        return _Plain((h1, h2)) if self.plain else _Features(h2, (h1, h2))


class _MultiScale(nn.Module):
    """A head reading every field of its backbone's output container, returning another."""

    def __init__(self, plain: bool) -> None:
        super().__init__()
        self.backbone = _Backbone(plain)
        self.p1 = nn.Conv2d(8, 12, 1)
        self.p2 = nn.Conv2d(16, 12, 1)
        self.fuse = nn.Conv2d(12, 4, 1)

    def forward(self, x: torch.Tensor) -> _Features:
        features = self.backbone(x)
        h1, h2 = features.hidden_states
        y = self.p1(h1) + nn.functional.interpolate(self.p2(h2), size=h1.shape[2:])
        return _Features(self.fuse(y), features.hidden_states)


@pytest.mark.parametrize("plain", [False, True], ids=["model-output", "dataclass"])
def test_a_head_reading_a_field_of_an_output_container_is_a_member(plain: bool) -> None:
    torch.manual_seed(0)
    model = _MultiScale(plain).eval()
    x = (torch.randn(1, 3, 16, 16),)
    sm = fxsym.analyze(model, example_inputs=x, outputs=["last_hidden_state"])
    assert check_permutation(model, sm, x).ok and check_shrink(model, sm, x).ok
    groups = {g.name: set(g.members) for g in sm.groups()}
    assert ("p1", "in_channels") in groups["backbone.s1.out_channels"]
    assert ("p2", "in_channels") in groups["backbone.s2.out_channels"]


#: multi-scale decoders over a backbone's hidden states: (task class, model type, config)
DECODERS = {
    "dpt": ("DPTForDepthEstimation", dict(
        hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
        image_size=32, patch_size=8, backbone_out_indices=[0, 1, 2, 3],
        neck_hidden_sizes=[8, 16, 32, 32], fusion_hidden_size=16, head_hidden_size=8,
        reassemble_factors=[4, 2, 1, 0.5])),
    "upernet": ("UperNetForSemanticSegmentation", dict(
        backbone_config=dict(model_type="convnext", hidden_sizes=[8, 16, 24, 32],
                             depths=[1, 1, 1, 1],
                             out_features=["stage1", "stage2", "stage3", "stage4"]),
        hidden_size=16, auxiliary_channels=8, num_labels=3, use_auxiliary_head=False)),
}


@pytest.mark.parametrize("model_type", sorted(DECODERS))
def test_multi_scale_decoders_after_an_eager_forward(model_type: str) -> None:
    """Before the capturing hooks ran in the trace, DPT's neck raised on the trace (no hidden
    states) and UperNet's head fell back to a leaf reading none, with wrong stage groups."""
    auto, kwargs = DECODERS[model_type]
    cfg = transformers.AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(0)
    model = getattr(transformers, auto)(cfg).eval()
    x = {"pixel_values": torch.randn(1, 3, 32, 32)}
    with torch.no_grad():
        model(**x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fxsym.ResizeWarning)
        sm = assert_oracles(model, x, min_groups=10)
    assert not sm.trace_report.fallbacks
