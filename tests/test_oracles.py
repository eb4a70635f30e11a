"""The oracles themselves: each must be able to fail, and must not touch the caller's model.

A wrong analysis is produced on purpose with real registrations — a user SymInfo
(``SymMap.register``) that hides a module's channel parameters, or a plugin whose resize rule
forgets an attribute — and the oracle must catch it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import fxsym
from fxsym import Symbol, SymInfo, SymMap
from fxsym.oracles import (
    check_permutation,
    check_shrink,
    moving_permutation,
    perturbed,
    run_model,
)
from fxsym.resizing import keep_entries


class ScaleShift(nn.Module):
    """A per-channel affine map, initialised like a norm layer (weight 1, bias 0)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight[:, None, None] + self.bias[:, None, None]


@pytest.fixture
def scale_shift_hidden() -> Iterator[None]:
    """A wrong user SymInfo: ScaleShift claims to be elementwise, hiding its channel weights
    from every group it sits in."""
    SymMap.register(ScaleShift)(lambda mod: SymInfo(is_shape_preserving=True))
    try:
        yield
    finally:
        SymMap.unregister(ScaleShift)


def _conv_scale_conv(channels: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, channels, 1), ScaleShift(channels), nn.ReLU(),
                         nn.Conv2d(channels, 2, 1))


def test_permutation_oracle_catches_a_member_hidden_by_a_constant_init(
        scale_shift_hidden: None) -> None:
    torch.manual_seed(0)
    model = _conv_scale_conv(6).eval()
    x = (torch.randn(2, 3, 4, 4),)
    sm = fxsym.analyze(model, example_inputs=x)
    assert [g.name for g in sm.groups()] == ["0.out_channels"]
    # the missing member has weight 1 and bias 0: without perturbation the permuted model
    # really computes the same outputs
    clone = copy.deepcopy(model)
    fxsym.resize(clone, fxsym.analyze(clone, example_inputs=x), {"0.out_channels": [5, 0, 1, 2,
                                                                                    3, 4]})
    assert torch.allclose(run_model(clone, x)[0], run_model(model, x)[0], atol=1e-5)
    result = check_permutation(model, sm, x)
    assert result.status == "failed" and not result.ok
    assert result.failed == ["0.out_channels"]


def test_a_group_of_two_is_always_moved(scale_shift_hidden: None) -> None:
    gen = torch.Generator().manual_seed(0)
    assert all(moving_permutation(2, gen).tolist() == [1, 0] for _ in range(50))
    assert all(not bool((moving_permutation(n, gen) == torch.arange(n)).all())
               for n in (2, 3, 4) for _ in range(50))
    model = _conv_scale_conv(2).eval()
    x = (torch.randn(1, 3, 2, 2),)
    sm = fxsym.analyze(model, example_inputs=x)
    for seed in range(6):  # every seed catches it: no draw leaves the two channels in place
        assert check_permutation(model, sm, x, seeds=(seed,)).failed == ["0.out_channels"]


def test_a_model_without_sortable_group_is_not_checked() -> None:
    model = nn.Sequential(nn.Linear(4, 3))
    x = (torch.randn(2, 4),)
    sm = fxsym.analyze(model, example_inputs=x)
    assert sm.groups() == []
    for result in (check_permutation(model, sm, x), check_shrink(model, sm, x)):
        assert result.status == "not checked" and not result.ok


def test_a_correct_analysis_passes_over_three_seeds() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 4, 1), nn.Flatten(), nn.LazyLinear(5))
    x = (torch.randn(2, 3, 6, 6),)
    model(*x)
    sm = fxsym.analyze(model, example_inputs=x)
    perm = check_permutation(model, sm, x)
    assert perm.ok and perm.status == "ok" and perm.seeds == (0, 1, 2) and perm.checked == 2
    assert check_shrink(model, sm, x).ok


def test_perturbation_is_scaled_to_each_tensor_and_keeps_variances_positive() -> None:
    bn = nn.BatchNorm1d(16)
    bn.running_var.fill_(4.0)
    big = nn.Linear(16, 16)
    with torch.no_grad():
        big.weight.mul_(1000.0)
    model = nn.Sequential(big, bn)
    copy_ = perturbed(model, 0)
    assert copy_ is not model and not copy_.training and model.training
    for (name, before), after in zip(model.state_dict().items(), copy_.state_dict().values()):
        if name.endswith("num_batches_tracked"):
            assert torch.equal(before, after)
            continue
        assert not torch.equal(before, after), name  # constants (1, 0) are moved too
        scale = float(before.float().std()) or float(before.abs().mean()) or 0.2
        assert float((after - before).abs().max()) < scale, name
    assert bool((copy_[1].running_var > 0).all())


def test_the_callers_model_is_untouched() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Dropout(0.5), nn.ReLU(),
                          nn.Conv2d(8, 4, 1))
    model.train()
    x = (torch.randn(2, 3, 6, 6),)
    sm = fxsym.analyze(model, example_inputs=x)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    dicts = {n: dict(vars(m)) for n, m in model.named_modules()}
    flags = {n: m.training for n, m in model.named_modules()}
    assert check_permutation(model, sm, x).ok
    assert check_shrink(model, sm, x).ok
    assert {n: m.training for n, m in model.named_modules()} == flags
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert {n: dict(vars(m)) for n, m in model.named_modules()} == dicts


# -- the shrink oracle checks the members, not only that the model runs -----------------------

class PlainLinear(nn.Module):
    """A linear layer of our own, described and resized by a test plugin."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.randn(out_features, in_features) / in_features ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t()


def _plain_info(mod: nn.Module) -> SymInfo:
    return SymInfo(
        in_features=Symbol(cl_type=Symbol.CLType.INCOMING, elastic_dims={-1}),
        out_features=Symbol(is_searchable=True, cl_type=Symbol.CLType.OUTGOING,
                            elastic_dims={-1}),
    )


def _stale_resize(mod: Any, name: str, index: torch.Tensor) -> None:
    """Slices the weight but forgets the attribute that describes it."""
    keep_entries(mod, "weight", 1 if name == "in_features" else 0, index)


class _StalePlugin:
    @fxsym.hookimpl
    def fxsym_register_sym_infos(self, register):  # type: ignore[no-untyped-def]
        register(PlainLinear, _plain_info, resize=_stale_resize)


def test_shrink_oracle_catches_an_attribute_that_disagrees_with_its_weight() -> None:
    pm = fxsym.load_plugins()
    pm.register(_StalePlugin(), name="stale-plugin")
    try:
        model = nn.Sequential(PlainLinear(4, 8), nn.ReLU(), PlainLinear(8, 2))
        x = (torch.randn(3, 4),)
        sm = fxsym.analyze(model, example_inputs=x)
        assert [g.name for g in sm.groups()] == ["0.out_features"]
        result = check_shrink(model, sm, x)
    finally:
        pm.unregister(name="stale-plugin")
    assert result.status == "failed"  # the shrunk model runs: only the attributes are wrong
    assert result.error is None and result.failed == ["0.out_features"]
    assert any("0.out_features" in d and "weight.shape[0]=4" in d for d in result.details)
    assert any("2.in_features" in d and "weight.shape[1]=4" in d for d in result.details)


def _ignored_resize(mod: Any, name: str, index: torch.Tensor) -> None:
    """Accepts the plan and changes nothing."""


class _IgnoringPlugin:
    @fxsym.hookimpl
    def fxsym_register_sym_infos(self, register):  # type: ignore[no-untyped-def]
        register(PlainLinear, _plain_info, resize=_ignored_resize)


def test_shrink_oracle_checks_every_members_size() -> None:
    # members left at their full size still run and keep the output shape
    pm = fxsym.load_plugins()
    pm.register(_IgnoringPlugin(), name="ignoring-plugin")
    try:
        model = nn.Sequential(PlainLinear(4, 8), nn.ReLU(), PlainLinear(8, 2))
        x = (torch.randn(3, 4),)
        sm = fxsym.analyze(model, example_inputs=x)
        result = check_shrink(model, sm, x)
    finally:
        pm.unregister(name="ignoring-plugin")
    assert result.status == "failed" and result.failed == ["0.out_features"]
    assert sorted(result.details) == ["0.out_features: size [8], expected 4",
                                      "2.in_features: size [8], expected 4"]
