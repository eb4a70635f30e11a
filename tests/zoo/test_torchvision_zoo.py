"""Both oracles over torchvision's classification zoo.

The default suite runs a representative subset (``test_zoo_subset``); ``pytest -m zoo`` runs
every classification model (``test_zoo_all``). Every model must have at least one group (a
classifier whose every size is pinned is an analysis that found nothing), except those listed
in ``NO_GROUP`` with the reason.
"""

from __future__ import annotations

import pytest
import torch

torchvision = pytest.importorskip("torchvision")

from helpers import assert_oracles  # noqa: E402

from fxsym.oracles import coverage  # noqa: E402

ALL = torchvision.models.list_models(module=torchvision.models)

#: the default subset, with the least coverage a pruning expert would accept
SUBSET = {
    "resnet18": 0.9, "resnet50": 0.95, "vgg11_bn": 0.85, "mobilenet_v2": 0.95,
    "densenet121": 0.95, "efficientnet_b0": 0.95, "mobilenet_v3_small": 0.95,
    "convnext_tiny": 0.95, "shufflenet_v2_x0_5": 0.8, "squeezenet1_1": 0.9,
    "regnet_x_400mf": 0.95, "googlenet": 0.85, "swin_t": 0.95,
    # ViT reshapes by its hidden_dim attribute, tied to the residual width (issue 11)
    "vit_b_16": 0.95,
}


#: coverage floors checked by ``pytest -m zoo`` only (models too slow for the default subset)
ZOO_FLOORS = {
    # heads from attributes, a relative-position bias table, width tied to whole heads
    "maxvit_t": 0.95,
    # the 4-block stages; the 8-block stage cannot be exact groups (tests/test_channel_shuffle)
    "shufflenet_v2_x1_0": 0.8,
}


#: models allowed to have no group at all, each with the reason (none known today)
NO_GROUP: dict[str, str] = {}


def input_size(name: str) -> int:
    if name.startswith(("vit_", "swin", "maxvit")):
        return 224
    return 299 if name.startswith("inception") else 64


def _check(name: str, min_coverage: float = 0.0) -> None:
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None).eval()
    size = input_size(name)
    sm = assert_oracles(model, (torch.randn(1, 3, size, size),),
                        min_groups=0 if name in NO_GROUP else 1,
                        expect_unchecked=name in NO_GROUP)
    assert coverage(sm) >= min_coverage, (name, coverage(sm))


@pytest.mark.parametrize("name", sorted(SUBSET))
def test_zoo_subset(name: str) -> None:
    _check(name, SUBSET[name])


@pytest.mark.zoo
@pytest.mark.parametrize("name", ALL)
def test_zoo_all(name: str) -> None:
    _check(name, SUBSET.get(name, ZOO_FLOORS.get(name, 0.0)))
