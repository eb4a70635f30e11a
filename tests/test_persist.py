"""fxsym.save / fxsym.load: safetensors + the plan, replayed on a fresh model (issue 12)."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import fxsym

torchvision = pytest.importorskip("torchvision")


def _small_vit() -> nn.Module:
    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                                num_heads=2, hidden_dim=16, mlp_dim=32)


def _timm_mobilenet() -> nn.Module:
    timm = pytest.importorskip("timm")
    return timm.create_model("mobilenetv3_small_050", num_classes=10)


def _resnet18() -> nn.Module:
    return torchvision.models.resnet18(num_classes=10)


def _seq(first: str = "conv") -> nn.Module:
    return nn.Sequential(OrderedDict([
        (first, nn.Conv2d(3, 8, 3)), ("bn", nn.BatchNorm2d(8)), ("relu", nn.ReLU()),
        ("pool", nn.AdaptiveAvgPool2d(1)), ("flat", nn.Flatten()),
        ("fc1", nn.Linear(8, 6)), ("act", nn.ReLU()), ("fc2", nn.Linear(6, 2))]))


def _pruned(build: Callable[[], nn.Module], x: torch.Tensor, tmp_path: Path, **kw: object
            ) -> tuple[nn.Module, fxsym.Plan]:
    torch.manual_seed(0)
    model = build().eval()
    sm = fxsym.analyze(model, example_inputs=(x,))
    plan = fxsym.plan(model, sm, **kw)  # type: ignore[arg-type]
    plan.apply(model, sm)
    fxsym.save(model, tmp_path, plan)
    return model, plan


def _snapshot(model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {n: (t, t.detach().clone()) for n, t in model.state_dict(keep_vars=True).items()}


def _untouched(model: nn.Module, before: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> bool:
    now = model.state_dict(keep_vars=True)
    return now.keys() == before.keys() and all(
        now[n] is t and torch.equal(t.detach(), copy) for n, (t, copy) in before.items())


@pytest.mark.parametrize("build, shape", [
    (_resnet18, (2, 3, 32, 32)),
    (_small_vit, (2, 3, 32, 32)),
    (_timm_mobilenet, (2, 3, 64, 64)),
], ids=["resnet18", "vit", "timm-mobilenetv3"])
def test_save_load_round_trip_gives_equal_outputs(build: Callable[[], nn.Module],
                                                  shape: tuple[int, ...],
                                                  tmp_path: Path) -> None:
    x = torch.randn(shape)
    # fine-tuned stand-in: weights that differ from a fresh model's
    model, plan = _pruned(build, x, tmp_path, ratio=0.5, importance="l1")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    fxsym.save(model, tmp_path, plan)
    assert plan.params_after < plan.params_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fxsym.json", "model.safetensors"]
    json.loads((tmp_path / "fxsym.json").read_text())  # plain data
    torch.manual_seed(1)
    fresh = build().eval()
    assert fxsym.load(fresh, tmp_path) is fresh
    with torch.no_grad():
        assert torch.allclose(fresh(x), model(x), atol=1e-6)
    assert {n: p.shape for n, p in fresh.named_parameters()} == \
        {n: p.shape for n, p in model.named_parameters()}


def test_a_plan_of_another_architecture_is_rejected_untouched(tmp_path: Path) -> None:
    _pruned(_resnet18, torch.randn(1, 3, 32, 32), tmp_path, ratio=0.5)
    other = torchvision.models.resnet34(num_classes=10).eval()
    before = _snapshot(other)
    with pytest.raises(fxsym.PlanMismatchError, match=r"the model has group 'layer1\.2"):
        fxsym.load(other, tmp_path)
    assert _untouched(other, before)
    with pytest.raises(fxsym.PlanMismatchError, match=r"plan is for a torchvision\.models"):
        fxsym.load(_seq(), tmp_path)


def test_a_renamed_module_is_named(tmp_path: Path) -> None:
    _pruned(_seq, torch.randn(1, 3, 8, 8), tmp_path, ratio=0.5)
    renamed = _seq("conv_a")
    before = _snapshot(renamed)
    with pytest.raises(fxsym.PlanMismatchError, match=r"group 'conv.out_channels' .*no module "
                       "'conv'"):
        fxsym.load(renamed, tmp_path)
    assert _untouched(renamed, before)


def _edit_plan(tmp_path: Path, edit: Callable[[dict[str, object]], None]) -> None:
    path = tmp_path / "fxsym.json"
    data = json.loads(path.read_text())
    edit(data["plan"])
    path.write_text(json.dumps(data))


def test_an_index_out_of_range_is_rejected_untouched(tmp_path: Path) -> None:
    _pruned(_seq, torch.randn(1, 3, 8, 8), tmp_path, ratio=0.5)

    def bump(plan: dict[str, object]) -> None:
        groups = plan["groups"]
        assert isinstance(groups, list)
        groups[0]["keep"][-1] = groups[0]["size"]

    _edit_plan(tmp_path, bump)
    fresh = _seq()
    before = _snapshot(fresh)
    with pytest.raises(fxsym.PlanMismatchError, match=r"'conv.out_channels': index 8 out of"):
        fxsym.load(fresh, tmp_path)
    assert _untouched(fresh, before)


def test_weights_that_do_not_fit_the_plan_are_rejected_untouched(tmp_path: Path) -> None:
    _pruned(_seq, torch.randn(1, 3, 8, 8), tmp_path, ratio=0.5)

    def more(plan: dict[str, object]) -> None:
        groups = plan["groups"]
        assert isinstance(groups, list)
        groups[0]["keep"] = list(range(groups[0]["size"] - 1))

    _edit_plan(tmp_path, more)
    fresh = _seq()
    before = _snapshot(fresh)
    with pytest.raises(fxsym.PlanMismatchError, match=r"conv\.weight"):
        fxsym.load(fresh, tmp_path)
    assert _untouched(fresh, before)


def test_a_model_pruned_twice_replays_both_plans(tmp_path: Path) -> None:
    x = torch.randn(2, 3, 8, 8)
    model, first = _pruned(_seq, x, tmp_path, ratio=0.25, scope="uniform")
    sm = fxsym.analyze(model, example_inputs=(x,))
    second = fxsym.plan(model, sm, ratio=0.5, scope="uniform")
    second.apply(model, sm)
    fxsym.save(model, tmp_path, second, history=[first])
    fresh = _seq().eval()
    fxsym.load(fresh, tmp_path)
    assert torch.equal(fresh(x), model(x))
    with pytest.raises(fxsym.PlanError, match="apply the plan first"):
        fxsym.save(_seq(), tmp_path / "again", second)
