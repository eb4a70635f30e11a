"""Group steps (``fxsym_group_steps``): a plugin says a group's sizes run only in multiples of
some entries (a kernel's alignment); the analysis puts the step on the group, every plan rounds
to it, explicit sizes off it are refused by ``sizes_for`` and rounded by ``plan(sizes=)`` with a
note in ``plan.extra["steps"]``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from helpers import group_with
from torch import nn

import fxsym


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 30)
        self.down = nn.Linear(30, 16)
        self.head = nn.Linear(16, 40)
        self.out = nn.Linear(40, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.head(x + self.down(torch.relu(self.up(x))))))


class _Aligned:
    """A plugin whose kernel takes ``up``'s rows in multiples of 4 entries."""

    @fxsym.hookimpl
    def fxsym_group_steps(self, model: Any, symmap: Any) -> dict[str, tuple[int, str]]:
        return {g.name: (4, "the test kernel reads rows of 4") for g in symmap.groups()
                if ("up", "out_features") in g.members}


@contextmanager
def _aligned() -> Iterator[None]:
    pm = fxsym.PluginManager()
    fxsym.load_plugins(manager=pm, allow=["nn"])
    pm.register(_Aligned(), name="aligned")
    with fxsym.use_plugins(pm):
        yield


def _analyzed() -> tuple[MLP, fxsym.SymMap]:
    torch.manual_seed(0)
    m = MLP().eval()
    return m, fxsym.analyze(m, example_inputs=(torch.randn(2, 16),))


@pytest.mark.parametrize("kwargs", [dict(ratio=0.3), dict(ratio=0.5, scope="uniform"),
                                    dict(ratio=0.7), dict(target_params=900)])
def test_every_plan_keeps_a_multiple_of_the_step(kwargs: dict[str, Any]) -> None:
    with _aligned():
        m, sm = _analyzed()
        width = group_with(sm, "up", "out_features")
        assert (width.step, width.step_reason) == (4, "the test kernel reads rows of 4")
        assert group_with(sm, "head", "out_features").step == 1
        plan = fxsym.plan(m, sm, **kwargs)
    kept = {g.name: g.kept for g in plan.groups}
    assert kept[width.name] % 4 == 0 and kept[width.name] < 30
    assert plan.extra["steps"][width.name] == {"step": 4, "unit": 1,
                                               "why": "the test kernel reads rows of 4"}
    if "target_params" in kwargs:
        assert plan.params_after <= kwargs["target_params"]


def test_explicit_sizes_off_the_step_are_rounded_up() -> None:
    with _aligned():
        m, sm = _analyzed()
        width = group_with(sm, "up", "out_features")
        plan = fxsym.plan(m, sm, sizes={width.name: 13})
        assert {g.name: g.kept for g in plan.groups}[width.name] == 16
        whole = fxsym.plan(m, sm, sizes={width.name: 29})
        assert {g.name: g.kept for g in whole.groups}[width.name] == 30  # the whole group


def test_without_the_plugin_there_is_no_step() -> None:
    m, sm = _analyzed()
    assert all(g.step == 1 for g in sm.groups())
    plan = fxsym.plan(m, sm, sizes={group_with(sm, "up", "out_features").name: 13})
    assert 13 in {g.kept for g in plan.groups} and "steps" not in plan.extra


def test_the_summary_says_which_sizes_were_rounded() -> None:
    with _aligned():
        m, sm = _analyzed()
        plan = fxsym.plan(m, sm, ratio=0.5)
    assert ("kept at a multiple of 4 entries (the test kernel reads rows of 4): up.out_features"
            in plan.summary())


def test_a_resize_off_the_step_warns() -> None:
    """``fxsym.resize`` keeps what it is told, but says when the model's kernels will refuse
    it."""
    import warnings

    with _aligned():
        m, sm = _analyzed()
        width = group_with(sm, "up", "out_features").name
        with pytest.warns(fxsym.ResizeWarning, match="not a multiple of 4: the test kernel"):
            fxsym.resize(m, sm, {width: 13})
        m, sm = _analyzed()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fxsym.resize(m, sm, {width: 16})


def test_fxsym_analyze_shows_the_step_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    from fxsym.prune.cli import main

    with _aligned():
        assert main(["analyze", "test_group_steps:MLP", "--input-shape", "2,16"]) == 0
        text = capsys.readouterr().out
        assert main(["analyze", "test_group_steps:MLP", "--input-shape", "2,16", "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
    assert "step" in text.splitlines()[2]
    assert "up.out_features keeps multiples of 4 units: the test kernel reads rows of 4" in text
    steps = {g["name"]: (g["step"], g["step_reason"]) for g in shown["groups"]}
    assert steps["up.out_features"] == (4, "the test kernel reads rows of 4")
    assert steps["head.out_features"] == (1, "")
