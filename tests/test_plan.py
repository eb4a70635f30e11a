"""fxsym.plan: targets, counts, rounding, plain data (issue 12)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import fxsym
from fxsym import importance


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.a = nn.Sequential(nn.Conv2d(32, 48, 3, padding=1), nn.BatchNorm2d(48), nn.ReLU(),
                               nn.Conv2d(48, 32, 3, padding=1), nn.BatchNorm2d(32))
        self.b = nn.Sequential(nn.Conv2d(32, 64, 3, stride=2), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(64, 40), nn.ReLU(), nn.Linear(40, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = torch.relu(x + self.a(x))
        return self.head(self.b(x).mean((2, 3)))


X = torch.randn(2, 3, 16, 16)


def _net() -> tuple[Net, fxsym.SymMap]:
    torch.manual_seed(0)
    m = Net().eval()
    return m, fxsym.analyze(m, example_inputs=(X,))


def _macs(model: nn.Module) -> int:
    with FlopCounterMode(display=False) as counter:
        model(X)
    return int(counter.get_total_flops()) // 2


def _unit_cost(model: nn.Module, sm: fxsym.SymMap, name: str) -> int:
    lay = importance.layout(model, sm)
    return lay.param_count({}) - lay.param_count({name: sm.group(name).size - 1})


@pytest.mark.parametrize("round_to", [1, 8])
def test_global_plan_hits_target_params_within_one_rounding_unit(round_to: int) -> None:
    m, sm = _net()
    before = sum(p.numel() for p in m.parameters())
    target = before // 2
    plan = fxsym.plan(m, sm, target_params=target, importance="l2", round_to=round_to)
    assert plan.params_before == before
    assert plan.params_after <= target
    step = max(_unit_cost(m, sm, g.name) for g in sm.groups()) * round_to
    assert target - plan.params_after < step
    for g in plan.groups:
        assert g.kept == g.size or g.kept % round_to == 0
    plan.apply(m, sm)
    assert sum(p.numel() for p in m.parameters()) == plan.params_after
    assert m(X).shape == (2, 10)


def test_uniform_plan_hits_target_params_within_one_step_of_every_group() -> None:
    m, sm = _net()
    target = plan_target = sum(p.numel() for p in m.parameters()) * 6 // 10
    plan = fxsym.plan(m, sm, target_params=plan_target, scope="uniform")
    assert plan.params_after <= target
    assert target - plan.params_after < sum(_unit_cost(m, sm, g.name) for g in sm.groups())
    ratios = [g.kept / g.size for g in plan.groups]
    assert max(ratios) - min(ratios) < 0.1


def test_macs_are_counted_from_the_traced_shapes_before_and_after() -> None:
    m, sm = _net()
    plan = fxsym.plan(m, sm, target_macs=_macs(m) // 3, importance="l1")
    assert plan.macs_before == _macs(m)
    assert plan.macs_after <= plan.macs_before // 3
    plan.apply(m, sm)
    assert _macs(m) == plan.macs_after


def test_ratio_exclude_and_min_keep() -> None:
    m, sm = _net()
    plan = fxsym.plan(m, sm, ratio=0.9, scope="uniform", exclude=["head.*"], min_keep=4)
    kept = {g.name: g.kept for g in plan.groups}
    assert kept["head.0.out_features"] == 40
    assert kept["stem.0.out_channels"] == 4  # ceil(32 * 0.1) = 4
    assert kept["a.0.out_channels"] == 5
    assert kept["b.0.out_channels"] == 7
    assert all(g.keep is None or list(g.keep) == sorted(g.keep) for g in plan.groups)


def test_kept_units_are_the_most_important() -> None:
    m, sm = _net()
    scores = {g.name: torch.arange(g.size, dtype=torch.float64).flip(0) for g in sm.groups()}
    plan = fxsym.plan(m, sm, ratio=0.5, scope="uniform", importance=scores)
    for g in plan.groups:
        assert g.keep == tuple(range(g.kept))


def test_plan_is_plain_data_replayable_on_a_fresh_model() -> None:
    m, sm = _net()
    fresh = copy.deepcopy(m)
    plan = fxsym.plan(m, sm, ratio=0.5, importance=importance.taylor(
        lambda model, x: model(x).square().mean(), [X]))
    text = plan.to_json()
    again = fxsym.Plan.from_json(text)
    assert again == plan and again.to_json() == text
    plan.apply(m, sm)
    again.apply(fresh, fxsym.analyze(fresh, example_inputs=(X,)))
    assert torch.equal(m(X), fresh(X))


def test_bad_requests_are_plan_errors() -> None:
    m, sm = _net()
    with pytest.raises(fxsym.PlanError, match="exactly one"):
        fxsym.plan(m, sm, ratio=0.5, target_params=10)
    with pytest.raises(fxsym.PlanError, match="cannot reach 10 parameters"):
        fxsym.plan(m, sm, target_params=10)
    with pytest.raises(fxsym.PlanError, match="unknown importance"):
        fxsym.plan(m, sm, ratio=0.5, importance="l3")
    with pytest.raises(fxsym.PlanError, match="not a valid fxsym plan"):
        fxsym.Plan.from_json('{"format": 1}')


# -- issue 20 §1: plans are never silently extreme ------------------------------------------
class _Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.c2(torch.relu(self.c1(x))).mean((2, 3)))


def _two() -> tuple[_Two, fxsym.SymMap]:
    torch.manual_seed(0)
    m = _Two().eval()
    return m, fxsym.analyze(m, example_inputs=(torch.randn(1, 3, 8, 8),))


@pytest.mark.parametrize("kwargs, argument", [
    ({"target_params": float("nan")}, "target_params"),
    ({"target_params": float("nan"), "scope": "uniform"}, "target_params"),
    ({"target_macs": float("nan")}, "target_macs"),
    ({"target_macs": float("inf"), "scope": "uniform"}, "target_macs"),
    ({"target_params": True}, "target_params"),
    ({"target_params": "1000"}, "target_params"),
    ({"ratio": float("nan")}, "ratio"),
    ({"ratio": "0.5"}, "ratio"),
    ({"ratio": 0.5, "min_keep": float("nan")}, "min_keep"),
    ({"ratio": 0.5, "min_keep": 2.0}, "min_keep"),
    ({"ratio": 0.5, "round_to": 1.5}, "round_to"),
    ({"ratio": 0.5, "round_to": "8"}, "round_to"),
    ({"ratio": 0.5, "exclude": [3]}, "exclude"),
    ({"ratio": 0.5, "importance": 3}, "importance"),
    ({"ratio": 0.5, "scope": ["global"]}, "scope"),
])
def test_non_finite_or_mistyped_arguments_are_plan_errors_naming_them(
        kwargs: dict[str, object], argument: str) -> None:
    m, sm = _two()
    with pytest.raises(fxsym.PlanError, match=argument):
        fxsym.plan(m, sm, **kwargs)  # type: ignore[arg-type]


def test_one_string_exclude_is_one_pattern_and_unmatched_patterns_are_errors() -> None:
    m, sm = _two()
    plan = fxsym.plan(m, sm, ratio=0.5, scope="uniform", exclude="c1.out_channels")
    kept = {g.name: g.kept for g in plan.groups}
    assert kept == {"c1.out_channels": 16, "c2.out_channels": 4}
    with pytest.raises(fxsym.PlanError, match=r"c1\.out_chanels.*matches no group"):
        fxsym.plan(m, sm, ratio=0.5, exclude=["c1.out_chanels"])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("where", ["one", "all"])
@pytest.mark.parametrize("criterion", ["l1", "l2"])
def test_a_non_finite_weight_is_a_plan_error_naming_group_and_parameter(
        bad: float, where: str, criterion: str) -> None:
    m, sm = _two()
    with torch.no_grad():
        if where == "one":
            m.c1.weight[5, 0, 0, 0] = bad
        else:
            m.c1.weight.fill_(bad)
    with pytest.raises(fxsym.PlanError, match=r"c1\.out_channels.*c1\.weight") as info:
        fxsym.plan(m, sm, ratio=0.5, importance=criterion)
    if where == "one":
        assert "unit 5" in str(info.value)
    # left whole on request: the plan no longer needs those scores
    plan = fxsym.plan(m, sm, ratio=0.5, importance=criterion, exclude="c1.*")
    assert {g.name: g.kept for g in plan.groups}["c1.out_channels"] == 16


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_given_scores_are_plan_errors(bad: float) -> None:
    m, sm = _two()
    scores = {"c1.out_channels": torch.ones(16), "c2.out_channels": torch.ones(8)}
    scores["c1.out_channels"][3] = bad
    with pytest.raises(fxsym.PlanError, match=r"c1\.out_channels.*unit 3"):
        fxsym.plan(m, sm, ratio=0.5, importance=scores)


def test_given_scores_for_unknown_groups_or_of_the_wrong_type_are_plan_errors() -> None:
    m, sm = _two()
    with pytest.raises(fxsym.PlanError, match=r"c1\.out_chanels.*not a group"):
        fxsym.plan(m, sm, ratio=0.5, importance={"c1.out_chanels": torch.ones(16)})
    with pytest.raises(fxsym.PlanError, match=r"c1\.out_channels.*str"):
        fxsym.plan(m, sm, ratio=0.5, importance={"c1.out_channels": "high"})


def test_a_non_finite_score_from_a_criterion_names_the_criterion() -> None:
    m, sm = _two()

    def broken(model: nn.Module, symmap: fxsym.SymMap) -> dict[str, torch.Tensor]:
        return {"c2.out_channels": torch.full((8,), float("nan"))}

    with pytest.raises(fxsym.PlanError, match=r"broken.*c2\.out_channels"):
        fxsym.plan(m, sm, ratio=0.5, importance=broken)


# -- issue 20 §6: a pruning run that explains itself ----------------------------------------
def test_a_plan_prints_as_a_summary_of_counts_and_groups() -> None:
    m, sm = _two()
    plan = fxsym.plan(m, sm, ratio=0.5, scope="uniform")
    text = str(plan)
    assert text == plan.summary()
    assert not text.startswith("Plan(")
    lines = text.splitlines()
    assert "uniform l2" in lines[0] and "_Two" in lines[0]
    params = next(line for line in lines if line.startswith("parameters")).split()
    assert params[1:3] == [f"{plan.params_before:,}", f"{plan.params_after:,}"]
    macs = next(line for line in lines if line.startswith("MACs")).split()
    assert macs[1:3] == [f"{plan.macs_before:,}", f"{plan.macs_after:,}"]
    rows = {line.split()[0]: line.split()[1:] for line in lines if line.startswith("c")}
    assert rows["c1.out_channels"][:2] == ["16", "8"] and rows["c2.out_channels"][:2] == ["8", "4"]


class _Warner:
    """A plugin whose after-resize hook warns on every resize, as the hf plugin does when a
    config cannot describe the resized model."""

    def __init__(self) -> None:
        self.calls = 0

    @fxsym.hookimpl
    def fxsym_after_resize(self, model: object, symmap: object, kept: object,
                           sizes: object) -> None:
        self.calls += 1
        warnings.warn("the config does not describe the resized model", fxsym.ResizeWarning,
                      stacklevel=2)


def test_planning_issues_no_warning_of_its_trial_resizes() -> None:
    pm = fxsym.PluginManager()
    fxsym.load_plugins(manager=pm, allow=["nn"])
    warner = _Warner()
    pm.register(warner, name="warner")
    with fxsym.use_plugins(pm):
        m, sm = _two()
        with warnings.catch_warnings(record=True) as issued:
            warnings.simplefilter("always")
            plan = fxsym.plan(m, sm, ratio=0.5)
        assert warner.calls == 0  # the layout runs rules on copies of modules, no resize
        assert [str(w.message) for w in issued] == []
        with warnings.catch_warnings(record=True) as issued:
            warnings.simplefilter("always")
            plan.apply(m, sm)
        assert [str(w.message) for w in issued] == [
            "the config does not describe the resized model"]
