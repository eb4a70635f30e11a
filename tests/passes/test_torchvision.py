"""The default pipeline on real torchvision models in eval mode: no BatchNorm left, same
outputs, the user's model untouched."""

from __future__ import annotations

import pytest
import torch
import torchvision
from passes_helpers import randomize_bn
from torch import nn

from fxsym.passes import optimize


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_default_pipeline_folds_every_batchnorm(name: str) -> None:
    torch.manual_seed(0)
    model = randomize_bn(getattr(torchvision.models, name)(num_classes=10)).eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    n_bn = sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())

    gm = optimize(model, example_inputs=(torch.randn(2, 3, 32, 32),))

    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in gm.modules())
    folded = gm.meta["fxsym_passes"]["patterns"]
    assert folded.status == "ok" and folded.changes == n_bn
    with torch.no_grad():
        for shape in [(1, 3, 32, 32), (3, 3, 48, 40)]:
            x = torch.randn(*shape)
            torch.testing.assert_close(gm(x), model(x), rtol=1e-4, atol=1e-4)
    # the user's model is untouched
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == n_bn
    after = model.state_dict()
    assert all(torch.equal(state[k], after[k]) for k in state)
