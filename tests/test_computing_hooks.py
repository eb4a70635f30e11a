"""Forward hooks that are part of how a model computes run while it is traced (issue 19, §6).

A library may carry values from one module to another through forward hooks: transformers 5
collects every stage's hidden state with hooks its output-capturing decorator installs the
first time a forward asks for them, and a segmentation head reads them from the model output.
The trace hides the user's hooks, so once such hooks were installed (by an eager forward
before the analysis) the traced program was another one: the head saw no hidden states,
became a leaf reading nothing, and the stage groups left out the head's projections — a
permutation changed the output, a shrink crashed. A plugin says which hooks compute
(``fxsym_hook_computes``); those run in the trace. Hooks nobody declares stay hidden (the
user's observers) and the trace report names them.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import torch
from helpers import assert_oracles
from torch import nn

import fxsym
from fxsym.oracles import check_permutation, check_shrink
from fxsym.plugins import PluginManager, use_plugins

_COLLECTED: ContextVar[list[torch.Tensor] | None] = ContextVar("collected", default=None)


def capture(module: nn.Module, args: Any, output: torch.Tensor) -> None:
    """Append ``output`` to the collection the running forward asked for (if any)."""
    collected = _COLLECTED.get()
    if collected is not None:
        collected.append(output)


class Stage(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class Stages(nn.Module):
    """Two stages whose outputs reach the caller only through the hooks on them."""

    def __init__(self) -> None:
        super().__init__()
        self.s1 = Stage(3, 8, 1)
        self.s2 = Stage(8, 16, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        token = _COLLECTED.set([])
        try:
            self.s2(self.s1(x))
            collected = _COLLECTED.get()
            assert collected is not None
            return tuple(collected)
        finally:
            _COLLECTED.reset(token)


class Segmenter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stages = Stages()
        self.p1 = nn.Conv2d(8, 4, 1)
        self.p2 = nn.Conv2d(16, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h1, h2 = self.stages(x)
        up = nn.functional.interpolate(self.p2(h2), size=h1.shape[2:])
        return self.p1(h1) + up


class DeclaresCapture:
    @fxsym.hookimpl
    def fxsym_hook_computes(self, module: Any, hook: Any) -> bool | None:
        return True if hook is capture else None


def _hooked(on_leaves: bool = False) -> Segmenter:
    torch.manual_seed(0)
    model = Segmenter().eval()
    for stage in (model.stages.s1, model.stages.s2):
        (stage.conv if on_leaves else stage).register_forward_hook(capture)
    return model


def _manager(*plugins: object) -> PluginManager:
    pm = PluginManager()
    fxsym.load_plugins(manager=pm, allow=["nn"])
    for i, plugin in enumerate(plugins):
        pm.register(plugin, name=f"test-{i}")
    return pm


def test_a_declared_hook_carrying_stage_outputs_runs_in_the_trace() -> None:
    model = _hooked()
    x = (torch.randn(1, 3, 16, 16),)
    with use_plugins(_manager(DeclaresCapture())):
        sm = assert_oracles(model, x, min_groups=2)
    groups = {g.name: set(g.members) for g in sm.groups()}
    assert ("p1", "in_channels") in groups["stages.s1.conv.out_channels"]
    assert ("p2", "in_channels") in groups["stages.s2.conv.out_channels"]
    assert len(model.stages.s1._forward_hooks) == 1  # still registered, once


def test_a_leaf_with_declared_hooks_is_traced_into_so_they_see_graph_values() -> None:
    model = _hooked(on_leaves=True)
    x = (torch.randn(1, 3, 16, 16),)
    with use_plugins(_manager(DeclaresCapture())):
        sm = fxsym.analyze(model, example_inputs=x)
        assert check_permutation(model, sm, x).status != "failed"
        assert check_shrink(model, sm, x).status != "failed"
    assert {e.where for e in sm.trace_report.of_kind("traced-into")} == {"stages.s1.conv",
                                                                          "stages.s2.conv"}
    gm = sm.graph_module
    assert gm is not None and not [n for n in gm.graph.nodes if n.op == "get_attr"
                                   and n.target.startswith("_tensor_constant")]


def test_an_undeclared_hook_stays_hidden_and_is_reported() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3)).eval()
    calls: list[str] = []
    model[2].register_forward_hook(lambda *a: calls.append("hook"))
    with use_plugins(_manager()):
        sm = fxsym.analyze(model, example_inputs=(torch.randn(1, 3, 16, 16),))
    assert calls == []
    lines = [str(e) for e in sm.trace_report.of_kind("hidden-hook")]
    assert len(lines) == 1 and lines[0].startswith("[hidden-hook] 2:"), lines
