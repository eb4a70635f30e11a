"""A third-party plugin declares a role (``fxsym_roles``, issue 32 §1): the workflow sizes and
searches it as it does the hf plugin's transformer roles, with nothing of the core changed.

The plugin below knows a small UNet-like network's *channel levels* (the widths of its
encoder's and decoder's convolutions) and declares them one width role, ``levels``; a
request then sizes them by name (``sizes_for(symmap, levels=4)``) and the architecture search
for a parameter target sizes each of the role's width classes by one fraction. Checked with
and without the hf plugin beside it (its roles hold nothing of this model). The same way, a
plugin gives the loss the search scores candidates by (``fxsym_batch_loss``), and declares
the size its role is given by (``fxsym_size_options``): ``fxsym prune`` grows the flag.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from torch import nn

import fxsym
from fxsym.errors import PlanError
from fxsym.plugins.contracts import Role, RoleKind, RoleMap, SizeOption
from fxsym.prune.roles import roles
from fxsym.prune.search import Candidate, search, sizes_for


class UNet(nn.Module):
    """Two channel levels: ``enc1``'s channels (added back to ``dec``'s by the skip) and
    ``enc2``'s."""

    def __init__(self) -> None:
        super().__init__()
        self.enc1 = nn.Conv2d(3, 8, 3, padding=1)
        self.enc2 = nn.Conv2d(8, 16, 3, padding=1)
        self.dec = nn.Conv2d(16, 8, 3, padding=1)
        self.out = nn.Conv2d(8, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = torch.relu(self.enc1(x))
        x2 = torch.relu(self.enc2(nn.functional.max_pool2d(x1, 2)))
        y = torch.relu(self.dec(nn.functional.interpolate(x2, scale_factor=2.0))) + x1
        return self.out(y)


class ChannelLevels:
    """The third party's plugin: every searchable group of a convolution's output channels
    is a channel level (a width the search sizes)."""

    @fxsym.hookimpl
    def fxsym_roles(self, model: nn.Module, symmap: fxsym.SymMap) -> RoleMap | None:
        if not isinstance(model, UNet):
            return None
        convs = {q for q, m in model.named_modules() if isinstance(m, nn.Conv2d)}
        levels = tuple(g.name for g in symmap.groups()
                       if any(q in convs and s == "out_channels" for q, s in g.members))
        return RoleMap((Role("levels", "a UNet channel level", RoleKind.WIDTH, levels),))


class LevelSizes(ChannelLevels):
    """The same plugin declaring the size its role is given by: ``levels`` (a flag of
    ``fxsym prune``, ``--levels N``)."""

    @fxsym.hookimpl
    def fxsym_size_options(self) -> tuple[SizeOption, ...]:
        return (SizeOption("levels", "channels of every UNet channel level"),)


def seeded_unet() -> UNet:
    """The UNet of seed 0 (what ``fxsym prune test_plugin_roles:seeded_unet`` builds)."""
    torch.manual_seed(0)
    return UNet().eval()


@contextmanager
def _with_levels(allow: list[str], plugin: type[ChannelLevels] = ChannelLevels
                 ) -> Iterator[None]:
    pm = fxsym.PluginManager()
    fxsym.load_plugins(manager=pm, allow=allow)
    pm.register(plugin(), name="channel-levels")
    with fxsym.use_plugins(pm):
        yield


def _model() -> tuple[UNet, fxsym.SymMap]:
    torch.manual_seed(0)
    model = UNet().double().eval()
    return model, fxsym.analyze(model, example_inputs=(torch.randn(1, 3, 8, 8,
                                                                    dtype=torch.float64),))


def _masked(model: UNet, plan: fxsym.Plan, sm: fxsym.SymMap) -> UNet:
    """``model`` with the output channels ``plan`` drops zeroed in every conv producing them
    (weights and bias): what the pruned model computes, at full width."""
    masked = copy.deepcopy(model)
    for g in plan.groups:
        group = next(x for x in sm.groups() if x.name == g.name)
        drop = sorted(set(range(group.size)) - set(g.keep))
        for q, s in group.members:
            conv = masked.get_submodule(q)
            if s == "out_channels" and isinstance(conv, nn.Conv2d):
                with torch.no_grad():
                    conv.weight[drop] = 0
                    assert conv.bias is not None
                    conv.bias[drop] = 0
    return masked


@pytest.mark.parametrize("allow", [["nn"], ["nn", "hf"]])
def test_a_plugin_role_is_sized_by_its_name(allow: list[str]) -> None:
    """``sizes_for(symmap, levels=4)`` keeps 4 channels of both levels; the pruned model
    computes what the unpruned one does with the other channels zeroed (float64)."""
    with _with_levels(allow):
        model, sm = _model()
        r = roles(sm)
        assert r.levels == tuple(g.name for g in sm.groups())  # both levels, nothing else
        assert dict(r.widths()) == {"levels": r.levels}
        assert [label for label, _ in r.classes] == ["levels 8", "levels 16"]
        sizes = sizes_for(sm, levels=4)
        assert sorted(sizes.values()) == [4, 4] and set(sizes) == set(r.levels)
        plan = fxsym.plan(model, sm, sizes=sizes, importance="l2")
        x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
        with torch.no_grad():
            expected = _masked(model, plan, sm)(x)
        pruned, psm = copy.deepcopy((model, sm))
        plan.apply(pruned, psm)
        assert (pruned.enc1.out_channels, pruned.enc2.out_channels,
                pruned.dec.out_channels) == (4, 4, 4)
        with torch.no_grad():
            torch.testing.assert_close(pruned(x), expected, rtol=1e-12, atol=1e-12)
        with pytest.raises(PlanError, match="no role of the model is sized by 'ffn'"
                           if allow == ["nn"] else "no group of the model holds a dense FFN"):
            sizes_for(sm, ffn=4)


@pytest.mark.parametrize("allow", [["nn"], ["nn", "hf"]])
def test_the_search_sizes_a_plugin_width_role(allow: list[str]) -> None:
    """The search for a parameter target sizes the ``levels`` classes by one fraction each of
    its own width; the table has a column per class; the kept plan is under the target and
    its pruned model equals the masked model."""
    with _with_levels(allow):
        model, sm = _model()
        total = sum(p.numel() for p in model.parameters())
        torch.manual_seed(1)
        batches = [torch.randn(2, 3, 8, 8, dtype=torch.float64) for _ in range(2)]
        result = search(model, sm, target_params=total // 2, batches=batches, round_to=1,
                        importance="l2", shortlist=None)
        assert len(result.candidates) >= 1
        for c in result.candidates:
            widths = dict(c.classes)
            assert set(widths) == {"levels 8", "levels 16"}
            assert c.params <= total // 2
            assert abs(widths["levels 8"] / 8 - widths["levels 16"] / 16) <= 1 / 8 + 1e-9
            assert c.levels == widths["levels 16"]  # the role's widest class
        header = result.table().splitlines()[0]
        assert "levels 8" in header and "levels 16" in header
        assert [r["levels"] for r in result.rows()] == [c.levels for c in result.candidates]
        plan = result.plan
        x = batches[0]
        with torch.no_grad():
            expected = _masked(model, plan, sm)(x)
        pruned, psm = copy.deepcopy((model, sm))
        plan.apply(pruned, psm)
        assert sum(p.numel() for p in pruned.parameters()) == result.best.params
        with torch.no_grad():
            torch.testing.assert_close(pruned(x), expected, rtol=1e-12, atol=1e-12)


class MeanAbsolute:
    """A third party's loss for its model's output (``fxsym_batch_loss``): the mean absolute
    output of a 4-D tensor."""

    @fxsym.hookimpl
    def fxsym_batch_loss(self, output: object, batch: object) -> float | None:
        if isinstance(output, torch.Tensor) and output.dim() == 4:
            return float(output.abs().mean())
        return None


def test_the_search_scores_by_the_loss_a_plugin_gives() -> None:
    """With a plugin's ``fxsym_batch_loss``, every scored candidate's loss is the mean of
    that loss over the batches on its pruned model (not the mean squared error to the
    unpruned output, which scores the same candidates without it)."""
    torch.manual_seed(1)
    batches = [torch.randn(2, 3, 8, 8, dtype=torch.float64) for _ in range(2)]

    def searched() -> tuple[UNet, fxsym.SymMap, list[Candidate]]:
        model, sm = _model()
        total = sum(p.numel() for p in model.parameters())
        result = search(model, sm, target_params=total // 2, batches=batches, round_to=1,
                        importance="l2", shortlist=None)
        return model, sm, list(result.candidates)

    with _with_levels(["nn"]):
        _, _, by_mse = searched()
    pm = fxsym.PluginManager()
    fxsym.load_plugins(manager=pm, allow=["nn"])
    pm.register(ChannelLevels(), name="channel-levels")
    pm.register(MeanAbsolute(), name="mean-absolute")
    with fxsym.use_plugins(pm):
        model, sm, found = searched()
    assert [c.classes for c in found] == [c.classes for c in by_mse]
    for c in found:
        pruned, psm = copy.deepcopy((model, sm))
        assert c.plan is not None
        c.plan.apply(pruned, psm)
        with torch.no_grad():
            expected = sum(float(pruned(b).abs().mean()) for b in batches) / len(batches)
        assert c.loss == pytest.approx(expected, rel=1e-12)
    assert [c.loss for c in found] != [c.loss for c in by_mse]


def test_the_search_compares_the_tensor_a_plugin_gives() -> None:
    """Without a loss, the search in memory scores a candidate by the mean squared error of
    its output to the unpruned model's; a plugin says which tensor of an output stands for it
    (``fxsym_compared_output``, the hf plugin's: a ``ModelOutput``'s logits). Here a model
    returning ``{"aux": ..., "image": ...}``, whose plugin gives ``"image"``: every candidate's
    loss is that error on its pruned model, recomputed (rel 1e-12 in float64)."""

    class TwoOutputs(UNet):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
            image = super().forward(x)
            return {"aux": image.mean(dim=(1, 2, 3)), "image": image}

    class ImageOutput:
        @fxsym.hookimpl
        def fxsym_compared_output(self, output: object) -> torch.Tensor | None:
            return output["image"] if isinstance(output, dict) else None

    torch.manual_seed(1)
    batches = [torch.randn(2, 3, 8, 8, dtype=torch.float64) for _ in range(2)]
    pm = fxsym.PluginManager()
    fxsym.load_plugins(manager=pm, allow=["nn"])
    pm.register(ChannelLevels(), name="channel-levels")
    pm.register(ImageOutput(), name="image-output")
    with fxsym.use_plugins(pm):
        model = TwoOutputs().double().eval()
        sm = fxsym.analyze(model, example_inputs=(batches[0],))
        total = sum(p.numel() for p in model.parameters())
        found = list(search(model, sm, target_params=total // 2, batches=batches, round_to=1,
                            importance="l2", shortlist=None).candidates)
    assert found and all(c.scored for c in found)
    with torch.no_grad():
        reference = [model(b)["image"] for b in batches]
    for c in found:
        pruned, psm = copy.deepcopy((model, sm))
        assert c.plan is not None
        c.plan.apply(pruned, psm)
        with torch.no_grad():
            expected = sum(float(nn.functional.mse_loss(pruned(b)["image"], r))
                           for b, r in zip(batches, reference)) / len(batches)
        assert c.loss == pytest.approx(expected, rel=1e-12)


def test_a_plugin_size_option_is_a_flag_of_fxsym_prune(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A third party's ``fxsym_size_options`` (``levels``) is a flag of ``fxsym prune``
    (``--levels N``, in its help): the command keeps 4 channels of both levels, and the model
    it saved computes what the unpruned one does with the other channels zeroed. Without the
    declaration the flag is an unknown option."""
    from fxsym.prune.cli import main

    out = tmp_path / "pruned"
    argv = ["prune", "test_plugin_roles:seeded_unet", "--input-shape", "1,3,8,8", "--levels",
            "4", "-o", str(out), "--json"]
    with _with_levels(["nn"]):
        assert main(argv) == 2
        assert "unknown option --levels" in capsys.readouterr().err
        assert not out.exists()
    with _with_levels(["nn"], LevelSizes):
        with pytest.raises(SystemExit):
            main(["prune", "--help"])
        assert "--levels LEVELS channels of every UNet channel level" in " ".join(
            capsys.readouterr().out.split())
        assert main(argv) == 0
        plan = fxsym.Plan.from_json(capsys.readouterr().out)
        model = seeded_unet()
        sm = fxsym.analyze(model, example_inputs=(torch.randn(1, 3, 8, 8),))
        assert sorted(len(g.keep) for g in plan.groups) == [4, 4]
        pruned = fxsym.load(seeded_unet(), out)
    assert (pruned.enc1.out_channels, pruned.enc2.out_channels,
            pruned.dec.out_channels) == (4, 4, 4)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(pruned(x), _masked(model, plan, sm)(x), rtol=1e-5,
                                   atol=1e-6)
