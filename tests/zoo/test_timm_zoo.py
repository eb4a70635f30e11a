"""Both oracles over a few timm models built from their own code (random weights)."""

from __future__ import annotations

import pytest
import torch

timm = pytest.importorskip("timm")

from helpers import assert_oracles  # noqa: E402

from fxsym.oracles import coverage  # noqa: E402

#: model -> least coverage (timm's LayerNorm/LayerNorm2d are described by the nn plugin)
MODELS = {"convnext_atto": 0.95, "vit_tiny_patch16_224": 0.7, "regnetx_002": 0.95,
          "mobilenetv3_small_100": 0.95}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_timm_model(name: str) -> None:
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval()
    sm = assert_oracles(model, (torch.randn(1, 3, 224, 224),))
    assert coverage(sm) >= MODELS[name]
