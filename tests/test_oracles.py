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
from helpers import ReadThrough
from torch import nn

import fxsym
from fxsym import Symbol, SymInfo, SymMap
from fxsym.oracles import (
    check_permutation,
    check_shrink,
    check_values,
    moving_permutation,
    perturbed,
    run_model,
)
from fxsym.oracles.perturb import NOISE, NOISE_FLOOR
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


# -- the value oracle: dropping units equals zeroing them where they are read -----------------

def _wrong_symmap(traced: Any, run: Any) -> tuple[nn.Module, fxsym.SymMap, tuple[Any, ...]]:
    """A SymMap that is wrong the way a rule's mistake makes it: analyzed while the model
    computes ``traced``, then the model computes ``run``, which reads the same values at the
    analyzed size but not after a resize."""
    torch.manual_seed(0)
    model = ReadThrough(traced)
    x = (torch.randn(2, 3, 4, 4),)
    model(*x)
    sm = fxsym.analyze(model, example_inputs=x)
    before = run_model(model, x)[0]
    model.op = run
    assert torch.equal(run_model(model, x)[0], before)  # the same model at this size
    return model, sm, x


def test_value_oracle_sees_a_window_that_a_shrink_moves() -> None:
    # the groups of narrow(h, 1, 3, 2) (the tail free) given to narrow(h, 1, -5, 2): what the
    # nn plugin built before issue 19 normalised a negative start as a front offset
    model, sm, x = _wrong_symmap(lambda h: torch.narrow(h, 1, 3, 2),
                                 lambda h: torch.narrow(h, 1, -5, 2))
    assert [(g.name, g.size) for g in sm.groups()] == [("c1.out_channels#2", 3)]
    assert check_permutation(model, sm, x).ok  # the other oracles cannot see it
    assert check_shrink(model, sm, x).ok
    result = check_values(model, sm, x)
    assert result.status == "failed" and result.failed == ["c1.out_channels#2"], str(result)
    right = fxsym.analyze(model, example_inputs=x)
    assert check_values(model, right, x).ok


@pytest.mark.parametrize(("traced", "run"), [
    (lambda h: h * 2, lambda h: h * 2 if h.shape[1] % 2 == 0 else h),
    (lambda h: h * 2, lambda h: h * 2 if h.shape[1] == 8 else h),
    (lambda h: h + 8, lambda h: h + h.shape[1]),
], ids=["parity", "equality", "size as a number"])
def test_value_oracle_sees_a_size_that_python_read(traced: Any, run: Any) -> None:
    # issue 19 section 1: the group of a model that doubles h, given to one that doubles it
    # only at the size it was traced at (or adds its size): one dropped unit changes what runs
    model, sm, x = _wrong_symmap(traced, run)
    assert [g.name for g in sm.groups()] == ["c1.out_channels"]
    result = check_values(model, sm, x, seeds=(0,))  # seed 0 drops one unit: 7 channels
    assert result.status == "failed" and result.failed == ["c1.out_channels"], str(result)
    assert any("differs" in d for d in result.details)


def test_value_oracle_runs_in_float64_and_compares_tightly() -> None:
    # a wrong group whose effect is 1e-7 of the output: float32 rounding would hide it
    model, sm, x = _wrong_symmap(lambda h: h, lambda h: h + 1e-7 * (h.shape[1] - 8))
    result = check_values(model, sm, x)
    assert result.status == "failed" and not result.notes, str(result)


def test_a_group_meeting_a_normalisation_is_not_checked_by_value() -> None:
    class Normed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 8)
            self.norm = nn.LayerNorm(8)
            self.b = nn.Linear(8, 6)
            self.c = nn.Linear(6, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(torch.relu(self.b(self.norm(self.a(x)))))

    model = Normed()
    x = (torch.randn(5, 4),)
    sm = fxsym.analyze(model, example_inputs=x)
    assert sorted(g.name for g in sm.groups()) == ["a.out_features", "b.out_features"]
    result = check_values(model, sm, x)
    assert result.ok and result.checked == 1, str(result)
    assert list(result.unchecked) == ["a.out_features"]
    assert "LayerNorm" in result.unchecked["a.out_features"]
    alone = fxsym.analyze(nn.Sequential(nn.Linear(4, 8), nn.Softmax(-1), nn.Linear(8, 2)),
                          example_inputs=x)
    unchecked = check_values(alone.model, alone, x)
    assert unchecked.status == "not checked" and "Softmax" in str(unchecked)


def test_oracles_fall_back_to_float32_with_a_note() -> None:
    class Float32Inside(nn.Module):
        """Casts to float32 in the middle, as Llama's RMSNorm does."""

        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.a(x))
            return self.b(h.float().to(h.dtype))

    class Float32Only(Float32Inside):
        """Multiplies by a plain float32 tensor (not a buffer, so ``.to`` leaves it): a matmul
        of float64 by float32 fails."""

        def __init__(self) -> None:
            super().__init__()
            self.mix = torch.eye(3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) @ self.mix

    x = (torch.randn(5, 4),)
    for cls, note in ((Float32Inside, "float32 tolerance"), (Float32Only, "does not run")):
        model = cls()
        sm = fxsym.analyze(model, example_inputs=x)
        for result in (check_permutation(model, sm, x), check_values(model, sm, x)):
            assert result.ok, str(result)
            assert len(result.notes) == 1 and note in result.notes[0], result.notes


def test_value_oracle_probes_modules_by_value_and_in_place_modules_pass() -> None:
    # a batch norm and in-place activations between two convs keep each channel to itself:
    # every group is checked by value (the probe copies what an in-place module rewrites)
    model = nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU(inplace=True),
                          nn.Conv2d(6, 6, 3, groups=6), nn.Hardswish(inplace=True),
                          nn.Conv2d(6, 4, 1), nn.ReLU(inplace=True), nn.Flatten(),
                          nn.LazyLinear(3))
    x = (torch.randn(2, 3, 7, 7),)
    model(*x)
    sm = fxsym.analyze(model, example_inputs=x)
    result = check_values(model, sm, x)
    assert result.ok and not result.unchecked and result.checked == len(sm.groups()) == 2, \
        str(result)


# -- memory: one copy at a time, float32 when float64 copies do not fit -----------------------

class _Watched(nn.Linear):
    """A linear that counts, at each of its runs, the other copies of itself whose weights
    still hold their data."""

    seen: list[nn.Linear] = []
    others_alive: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self not in _Watched.seen:
            _Watched.seen.append(self)
        _Watched.others_alive.append(
            sum(1 for m in _Watched.seen if m is not self and m.weight.numel() > 0))
        return super().forward(x)


def test_oracles_hold_one_copy_of_the_weights_at_a_time() -> None:
    # the oracles' copies sit in reference cycles (the SymMap copy, its graph): dropping one
    # freed its weights only when the cyclic collector ran, so ViT-H's float64 copies piled up
    # (8.7x the model's bytes on vit_b_16); each copy's tensors are released when it is done
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), _Watched(8, 3))
    x = (torch.randn(5, 4),)
    sm = fxsym.analyze(model, example_inputs=x)
    for check in (check_permutation, check_shrink, check_values):
        _Watched.seen[:] = [model[2]]
        _Watched.others_alive.clear()
        assert check(model, sm, x).ok
        assert len(_Watched.seen) >= (2 if check is check_shrink else 3)
        # at every run the only other weights holding data are the caller's
        assert _Watched.others_alive and set(_Watched.others_alive) == {1}, check.__name__
    assert model[2].weight.shape == (3, 8)


@pytest.mark.parametrize("native", [torch.float32, torch.bfloat16])
def test_a_copy_is_built_in_the_oracles_dtype_with_the_same_noise(native: torch.dtype) -> None:
    # built directly in float64 (no copy in the model's dtype first), yet equal to a copy
    # perturbed in the model's dtype and cast: the noise is rounded to the model's dtype
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)).to(native)
    direct = perturbed(model, 3, dtype=torch.float64)
    cast = perturbed(model, 3).to(torch.float64)
    for (name, a), (_, b) in zip([*direct.named_parameters(), *direct.named_buffers()],
                                 [*cast.named_parameters(), *cast.named_buffers()]):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert isinstance(direct[0].weight, nn.Parameter) and direct[0].weight.requires_grad


@pytest.mark.parametrize("values", [
    [0.5, -1.0, 2.0, 3.5], [2.0, 2.0, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0], [1.5],
    [0.5, float("inf"), 2.0, -1.0], [float("nan"), 1.0, 3.0, 4.0]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_noise_is_scaled_to_each_tensor_and_spares_non_finite_entries(
        values: list[float], dtype: torch.dtype) -> None:
    # the documented noise, computed here: NOISE times the finite entries' standard deviation
    # (else their mean absolute value, else NOISE_FLOOR), drawn in float32 from the seed's
    # generator; infinities and NaNs left as they are (the fast path for all-finite tensors
    # and the masked one must both give it)
    class One(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = nn.Parameter(torch.tensor(values, dtype=dtype))

    model = One()
    got = perturbed(model, 5).p.detach()
    source = model.p.detach().float()
    finite = torch.isfinite(source)
    kept = source[finite]
    scale = float(kept.std()) if kept.numel() > 1 else 0.0
    if not scale > 0:
        scale = float(kept.abs().mean()) or NOISE_FLOOR / NOISE
    noise = torch.randn(source.shape, generator=torch.Generator().manual_seed(5))
    want = torch.where(finite, source + NOISE * scale * noise, source).to(dtype)
    assert torch.equal(got.nan_to_num(), want.nan_to_num()), (got, want)
    assert torch.equal(got.isnan(), want.isnan())
    assert not torch.equal(got[finite].float(), source[finite])


def test_oracles_fall_back_to_float32_when_float64_copies_do_not_fit() -> None:
    # a memory budget below one float64 copy: compared in float32, said in the result; the
    # float32 comparison still fails a wrong group (the moved window of the narrow case)
    model, sm, x = _wrong_symmap(lambda h: torch.narrow(h, 1, 3, 2),
                                 lambda h: torch.narrow(h, 1, -5, 2))
    result = check_values(model, sm, x, memory_budget=1000)
    assert result.status == "failed" and result.failed == ["c1.out_channels#2"], str(result)
    assert result.dtype == torch.float32
    assert len(result.notes) == 1 and result.notes[0].startswith(
        "float32: float64 copies need ") and "0.0 GB available" in result.notes[0]
    right = fxsym.analyze(model, example_inputs=x)
    for check in (check_permutation, check_values):
        ok = check(model, right, x, memory_budget=1000)
        assert ok.ok and ok.dtype == torch.float32 and "float32" in str(ok), str(ok)
        assert check(model, right, x).dtype == torch.float64
    forced = check_values(model, right, x, dtype=torch.float32)
    assert forced.ok and forced.notes == ["float32: asked by the caller"]


def test_float32_hides_what_float64_sees() -> None:
    # why float64 is the default: a wrong group whose effect is 1e-7 of the output
    model, sm, x = _wrong_symmap(lambda h: h, lambda h: h + 1e-7 * (h.shape[1] - 8))
    assert check_values(model, sm, x).status == "failed"
    assert check_values(model, sm, x, dtype=torch.float32).ok
