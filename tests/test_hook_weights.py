"""Weights computed by forward pre-hooks are derived tensors (issue 30, section 2).

``torch.nn.utils.weight_norm``, ``spectral_norm`` and ``prune`` (the hook versions) replace a
module's ``weight`` by sources and recompute it before every forward. The module's family
describes ``weight``; a resize must resize the sources, or the hook rebuilds the old weight at
the next forward (permuting changed the output, halving crashed, ``weight_g``/``weight_v``
kept their old shapes). The nn plugin declares the hooks (``fxsym_derived_tensors``):
weight_norm and prune resize their sources so that the resized model is the hand-sliced
one; spectral_norm, whose power-iteration estimate no slicing is proven to keep, pins the
module's groups with a report line naming the hook.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_oracles, group_with, has_group_with
from torch import nn
from torch.nn.utils import prune

import fxsym
from fxsym.errors import ResizeError


def weight_norm(module: nn.Module, dim: int | None = 0) -> nn.Module:
    """``torch.nn.utils.weight_norm`` (the deprecated hook version), quietly."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return nn.utils.weight_norm(module, dim=dim)  # type: ignore[arg-type]


def unnormed(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose weight-normed modules hold their weight as a parameter."""
    computed = {id(v): v.detach() for m in model.modules() for v in vars(m).values()
                if isinstance(v, torch.Tensor) and v.grad_fn is not None}  # no deepcopy
    ref = copy.deepcopy(model, computed)
    for mod in ref.modules():
        if any(type(h).__name__ == "WeightNorm" for h in mod._forward_pre_hooks.values()):
            nn.utils.remove_weight_norm(mod)
    return ref


def sliced(param: torch.Tensor, *keeps: tuple[int, torch.Tensor]) -> nn.Parameter:
    for dim, index in keeps:
        param = param.detach().index_select(dim, index)
    return nn.Parameter(param.clone())


class Vocoder(nn.Module):
    """HiFi-GAN's shape: weight-normed convs, a transposed upsampling conv, a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = weight_norm(nn.Conv1d(4, 12, 7, padding=3))
        self.up = weight_norm(nn.ConvTranspose1d(12, 6, 4, stride=2, padding=1))
        self.res = weight_norm(nn.Conv1d(6, 6, 3, padding=1))
        self.post = weight_norm(nn.Conv1d(6, 1, 7, padding=3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(F.leaky_relu(self.pre(x), 0.1))
        h = h + self.res(F.leaky_relu(h, 0.1))
        return torch.tanh(self.post(F.leaky_relu(h, 0.1)))


def test_weight_norm_convs_resize_g_and_v_to_the_hand_sliced_model() -> None:
    """The channels of weight-normed convs (dim 0: the norm per output channel of a conv,
    per input channel of a transposed conv) are groups that both oracles pass, and a resize
    keeps ``weight_g``/``weight_v`` so that the model is the hand-sliced one (float64)."""
    torch.manual_seed(0)
    model = Vocoder().double().eval()
    x = (torch.randn(2, 4, 16, dtype=torch.float64),)
    sm = assert_oracles(model, x, min_groups=2)
    wide = group_with(sm, "pre", "out_channels")
    narrow = group_with(sm, "up", "out_channels")
    assert ("up", "in_channels") in wide.members
    assert {("res", "in_channels"), ("res", "out_channels"), ("post", "in_channels")} <= set(
        narrow.members)
    keep12, keep6 = torch.tensor([7, 0, 3, 11, 5]), torch.tensor([4, 1, 2])
    ref = unnormed(model)
    ref.pre.weight = sliced(ref.pre.weight, (0, keep12))
    ref.pre.bias = sliced(ref.pre.bias, (0, keep12))
    ref.up.weight = sliced(ref.up.weight, (0, keep12), (1, keep6))
    ref.up.bias = sliced(ref.up.bias, (0, keep6))
    ref.res.weight = sliced(ref.res.weight, (0, keep6), (1, keep6))
    ref.res.bias = sliced(ref.res.bias, (0, keep6))
    ref.post.weight = sliced(ref.post.weight, (1, keep6))
    fxsym.resize(model, sm, {wide.name: keep12, narrow.name: keep6})
    assert model.up.weight_v.shape == (5, 3, 4) and model.up.weight_g.shape == (5, 1, 1)
    assert model.res.weight_g.shape == (3, 1, 1) and model.post.weight_v.shape == (1, 3, 7)
    with torch.no_grad():
        torch.testing.assert_close(model(*x), ref(*x), rtol=1e-12, atol=1e-12)
    assert fxsym.analyze(model, example_inputs=x).groups()  # still weight-normed, analyzable


@pytest.mark.parametrize("dims", [(None, 1), (1, None), (0, 0)])
def test_weight_norm_along_any_dim_keeps_the_entries_kept(dims: tuple[int | None, ...]
                                                          ) -> None:
    """The norm over the whole weight (``dim=None``) or along the dim kept: ``g`` is scaled
    by the norm of what ``v`` keeps, so every entry kept is what it was."""
    torch.manual_seed(1)
    model = nn.Sequential(weight_norm(nn.Linear(5, 8), dims[0]), nn.ReLU(),
                          weight_norm(nn.Linear(8, 3), dims[1])).double().eval()
    x = (torch.randn(4, 5, dtype=torch.float64),)
    sm = assert_oracles(model, x)
    keep = torch.tensor([6, 2, 3, 0])
    ref = unnormed(model)
    ref[0].weight = sliced(ref[0].weight, (0, keep))
    ref[0].bias = sliced(ref[0].bias, (0, keep))
    ref[2].weight = sliced(ref[2].weight, (1, keep))
    fxsym.resize(model, sm, {group_with(sm, "0", "out_features").name: keep})
    assert model[0].weight_v.shape == (4, 5) and model[2].weight_v.shape == (3, 4)
    with torch.no_grad():
        torch.testing.assert_close(model(*x), ref(*x), rtol=1e-12, atol=1e-12)


def test_a_weight_norm_slice_keeping_only_zeros_is_refused() -> None:
    """weight_norm cannot write a slice whose kept entries of ``v`` are all zero (0/0): the
    resize refuses, naming it, and leaves the model as it was."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), weight_norm(nn.Linear(4, 2))).eval()
    with torch.no_grad():
        model[2].weight_v[0, :2] = 0
        model(torch.randn(1, 3))
    sm = fxsym.analyze(model, example_inputs=(torch.randn(2, 3),))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ResizeError, match="weight_norm cannot write"):
        fxsym.resize(model, sm, {group_with(sm, "0", "out_features").name: [0, 1]})
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_pruned_weight_resizes_its_original_and_mask() -> None:
    """torch.nn.utils.prune's ``weight = weight_orig * weight_mask``: both keep the entries."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)).double().eval()
    prune.random_unstructured(model[0], "weight", amount=0.3)
    prune.l1_unstructured(model[2], "weight", amount=0.3)
    x = (torch.randn(4, 5, dtype=torch.float64),)
    sm = assert_oracles(model, x)
    keep = torch.tensor([1, 7, 4])
    expected0 = model[0].weight.detach()[keep]
    expected2 = model[2].weight.detach()[:, keep]
    ref = nn.Sequential(nn.Linear(5, 3), nn.ReLU(), nn.Linear(3, 3)).double().eval()
    ref[0].weight, ref[0].bias = nn.Parameter(expected0), sliced(model[0].bias, (0, keep))
    ref[2].weight, ref[2].bias = nn.Parameter(expected2), nn.Parameter(model[2].bias.detach())
    fxsym.resize(model, sm, {group_with(sm, "0", "out_features").name: keep})
    assert model[0].weight_mask.shape == (3, 5) and model[2].weight_orig.shape == (3, 3)
    with torch.no_grad():
        torch.testing.assert_close(model(*x), ref(*x), rtol=0, atol=0)


def test_spectral_norm_pins_the_groups_it_touches_naming_the_hook() -> None:
    """spectral_norm divides the weight by an estimate of its spectral norm: no resize of
    ``weight_orig``/``weight_u``/``weight_v`` is proven to keep the entries kept, so the groups
    of the module's inputs and outputs are pinned; the others stay exact."""
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 5), nn.ReLU(),
                          nn.utils.spectral_norm(nn.Linear(5, 6)), nn.ReLU(),
                          nn.Linear(6, 4)).eval()
    x = (torch.randn(2, 3),)
    sm = assert_oracles(model, x)
    assert has_group_with(sm, "0", "out_features")
    assert not has_group_with(sm, "2", "out_features")
    assert not has_group_with(sm, "4", "out_features")
    lines = [e for e in sm.trace_report.of_kind("derived-weight")]
    assert [e.where for e in lines] == ["4"]
    assert "SpectralNorm" in lines[0].message and "spectral norm" in lines[0].message


def test_a_weight_normed_model_saved_pruned_loads_into_a_fresh_one(tmp_path: Path) -> None:
    """``fxsym.save`` writes ``weight_g``/``weight_v`` as resized; ``fxsym.load`` replays the
    plan on a fresh weight-normed model (its sources resized the same way) and loads them:
    the outputs are the pruned model's, bit for bit."""
    torch.manual_seed(5)
    model = Vocoder().eval()
    x = (torch.randn(2, 4, 16),)
    sm = fxsym.analyze(model, example_inputs=x)
    plan = fxsym.plan(model, sm, ratio=0.5)
    plan.apply(model, sm)
    fxsym.save(model, tmp_path / "pruned", plan)
    torch.manual_seed(6)
    fresh = fxsym.load(Vocoder().eval(), tmp_path / "pruned")
    assert fresh.up.weight_v.shape == model.up.weight_v.shape != (12, 6, 4)
    with torch.no_grad():
        torch.testing.assert_close(fresh(*x), model(*x), rtol=0, atol=0)
