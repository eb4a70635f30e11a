"""A plugin scores a group by how a calibration run uses it (``fxsym_usage_recorder``, issue 32
§1): the activation importance attaches the plugin's recorder beside its own hooks and takes
its scores for the groups it scores, as it takes the hf plugin's expert routing scores.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from helpers import group_with
from torch import nn

import fxsym
from fxsym.prune.importance import ActivationRecorder, activation, run_batch


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 6)
        self.down = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class EveryOtherUnit:
    """A recorder counting the calls of ``up`` and scoring its odd units by them."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.inside = False
        self.calls = 0
        self.up: nn.Module | None = None

    def attach(self, where: Callable[[str], bool]) -> list[torch.utils.hooks.RemovableHandle]:
        assert self.up is not None
        return [self.up.register_forward_hook(self._count)] if where("up") else []

    def _count(self, module: nn.Module, args: object, output: object) -> None:
        self.calls += 1

    def scores(self) -> dict[str, torch.Tensor]:
        return {self.group: torch.tensor([0.0, 1, 0, 1, 0, 1], dtype=torch.float64)
                * self.calls}

    def records(self) -> dict[str, dict[str, list[float]]]:
        return {"up_calls": {self.group: [float(self.calls)]}}


class CountsUp:
    @fxsym.hookimpl
    def fxsym_usage_recorder(self, model: nn.Module, symmap: fxsym.SymMap
                             ) -> EveryOtherUnit | None:
        if not isinstance(model, MLP):
            return None
        recorder = EveryOtherUnit(group_with(symmap, "up", "out_features").name)
        recorder.up = model.up
        return recorder


def test_a_plugin_usage_recorder_scores_its_group() -> None:
    """The plugin's scores replace the activations' for its group (the odd units kept by a
    plan of 3), its records are the activation recorder's, and the pruned model equals the
    unpruned one with the even units' rows zeroed (float64)."""
    torch.manual_seed(0)
    model = MLP().double().eval()
    batches = [torch.randn(5, 8, dtype=torch.float64) for _ in range(3)]
    pm = fxsym.PluginManager()
    fxsym.load_plugins(manager=pm, allow=["nn"])
    pm.register(CountsUp(), name="counts-up")
    with fxsym.use_plugins(pm):
        sm = fxsym.analyze(model, example_inputs=(batches[0],))
        name = group_with(sm, "up", "out_features").name
        recorder = ActivationRecorder(model, sm)
        handles = recorder.attach()
        with torch.no_grad():
            for b in batches:
                run_batch(model, b)
        for h in handles:
            h.remove()
        assert recorder.scores()[name].tolist() == [0.0, 3, 0, 3, 0, 3]
        assert recorder.records() == {"up_calls": {name: [3.0]}}
        plan = fxsym.plan(model, sm, sizes={name: 3}, importance=activation(batches))
    assert next(g.keep for g in plan.groups if g.name == name) == (1, 3, 5)
    masked = copy.deepcopy(model)
    with torch.no_grad():
        masked.up.weight[[0, 2, 4]] = 0
        masked.up.bias[[0, 2, 4]] = 0
    pruned, psm = copy.deepcopy((model, sm))
    plan.apply(pruned, psm)
    with torch.no_grad():
        torch.testing.assert_close(pruned(batches[0]), masked(batches[0]), rtol=1e-12,
                                   atol=1e-12)
