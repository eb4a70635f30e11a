"""The pipeline: ordering constraints, plugin passes, verification, rollback, no mutation."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from passes_helpers import count, ops, randomize_bn
from torch import fx, nn

import fxsym
from fxsym.errors import PassError
from fxsym.passes import (
    Pass,
    PassWarning,
    default_pipeline,
    format_passes,
    graph_pass,
    optimize,
    order_passes,
)
from fxsym.plugins import get_plugin_manager, hookimpl


@pytest.fixture
def local_plugin() -> Iterator[Callable[[list[Any]], str]]:
    """Register an in-process plugin contributing ``items`` through the patterns hook."""
    names: list[str] = []

    def register(items: list[Any]) -> str:
        class Plugin:
            @hookimpl
            def fxsym_register_patterns(self, register: Callable[[Any], None]) -> None:
                for item in items:
                    register(item)

        name = f"test_local_passes_{len(names)}"
        get_plugin_manager().register(Plugin(), name=name)
        names.append(name)
        return name

    yield register
    pm = get_plugin_manager()
    for name in names:
        pm.unregister(name=name)


def _recorder(log: list[str], name: str, **constraints: Any) -> Pass:
    def fn(gm: fx.GraphModule) -> int:
        log.append(name)
        return 0

    return Pass(name, fn, **constraints)


class Tiny(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + 1


# -- ordering ------------------------------------------------------------------------------------
def test_before_after_constraints_are_honoured(local_plugin: Callable[[list[Any]], str]) -> None:
    log: list[str] = []
    # registered in an order that contradicts the constraints
    local_plugin(
        [
            _recorder(log, "late", after=("middle", "patterns")),
            _recorder(log, "middle", after=("early",), before=("dce",)),
            _recorder(log, "early", before=("remove_inplace",)),
            _recorder(log, "opt_in", default=False),
        ]
    )
    names = [p.name for p in default_pipeline()]
    assert names.index("early") < names.index("remove_inplace")
    assert names.index("early") < names.index("middle") < names.index("late")
    assert names.index("patterns") < names.index("late") < names.index("dce")
    assert names[-1] == "dce" and "opt_in" not in names
    gm = optimize(Tiny())
    assert log == ["early", "middle", "late"]
    assert gm.meta["fxsym_passes"].order() == names

    log.clear()
    optimize(Tiny(), passes=["late", "opt_in", "early", "middle"])
    assert log == ["opt_in", "early", "middle", "late"]  # constraints first, then list order


def test_star_and_cycles() -> None:
    noop: Callable[[fx.GraphModule], int] = lambda gm: 0  # noqa: E731
    first = Pass("first", noop, before=("*",))
    last = Pass("last", noop, after=("*",))
    also_last = Pass("also_last", noop, after=("*",))
    plain = Pass("plain", noop)
    assert [p.name for p in order_passes([last, plain, also_last, first])] == [
        "first", "plain", "last", "also_last",
    ]
    a = Pass("a", noop, before=("b",))
    b = Pass("b", noop, before=("a",))
    with pytest.raises(PassError, match="cycle: a, b"):
        order_passes([a, b])
    with pytest.raises(PassError, match="no pass named 'nope'"):
        optimize(Tiny(), passes=["nope"])


def test_plugin_pass_is_listed_with_its_plugin(local_plugin: Callable[[list[Any]], str]) -> None:
    @graph_pass(after="patterns", before="dce")
    def relu_to_abs(gm: fx.GraphModule) -> int:
        n = 0
        for node in gm.graph.nodes:
            if node.target is torch.relu:
                node.target = torch.abs
                n += 1
        return n

    name = local_plugin([relu_to_abs])
    text = format_passes()
    line = next(line for line in text.splitlines() if " relu_to_abs " in line)
    assert name in line and "<local>" in line and "after patterns" in line
    gm = optimize(Tiny(), verify=False)
    assert count(gm, torch.abs) == 1 and count(gm, torch.relu) == 0
    assert gm.meta["fxsym_passes"]["relu_to_abs"].source.startswith(name)


# -- verification and rollback -------------------------------------------------------------------
@graph_pass(default=False)
def breaks_outputs(gm: fx.GraphModule) -> int:
    """Turn every relu into a tanh (wrong on purpose)."""
    n = 0
    for node in gm.graph.nodes:
        if node.target is torch.relu:
            node.target = torch.tanh
            n += 1
    return n


def test_pass_changing_outputs_is_rolled_back_with_a_warning() -> None:
    x = torch.randn(4, 3)
    passes = [breaks_outputs, "remove_noops", "dce"]
    with pytest.warns(PassWarning, match=r"pass 'breaks_outputs' .* rolled back"):
        gm = optimize(Tiny(), passes=passes, example_inputs=(x,))
    record = gm.meta["fxsym_passes"]["breaks_outputs"]
    assert record.status == "rolled back" and "differs" in record.message
    assert count(gm, torch.relu) == 1 and count(gm, torch.tanh) == 0
    torch.testing.assert_close(gm(x), Tiny()(x))


def test_pass_changing_outputs_raises_when_asked() -> None:
    with pytest.raises(PassError, match="breaks_outputs"):
        optimize(Tiny(), passes=[breaks_outputs], example_inputs=(torch.randn(3),),
                 on_mismatch="raise")
    # without example inputs nothing can verify it: refused, unless verify=False
    with pytest.warns(PassWarning, match="refused: 'breaks_outputs'"):
        assert count(optimize(Tiny(), passes=[breaks_outputs]), torch.tanh) == 0
    assert count(optimize(Tiny(), passes=[breaks_outputs], verify=False), torch.tanh) == 1


def test_rollback_restores_modules_too() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    @graph_pass(default=False)
    def zero_weights(gm: fx.GraphModule) -> int:
        fc = copy.copy(gm.get_submodule("fc"))
        fc._parameters = {"weight": nn.Parameter(torch.zeros(3, 3)), "bias": None}
        gm.fc = fc
        return 1

    model = Net()
    with pytest.warns(PassWarning, match="zero_weights"):
        gm = optimize(model, passes=[zero_weights], example_inputs=(torch.randn(2, 3),))
    x = torch.randn(5, 3)
    torch.testing.assert_close(gm(x), model(x))


def test_raising_pass_leaves_the_input_unchanged() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 1)
            self.bn = nn.BatchNorm2d(2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(self.conv(x))

    @graph_pass(default=False, after="patterns")
    def explodes(gm: fx.GraphModule) -> int:
        placeholder, conv = list(gm.graph.nodes)[:2]  # damage first: graph and modules
        conv.replace_all_uses_with(placeholder)
        gm.graph.erase_node(conv)
        gm.conv = nn.Identity()
        raise RuntimeError("boom")

    gm_in = fxsym.trace(randomize_bn(Net()).eval())
    code, nodes = gm_in.code, [n.format_node() for n in gm_in.graph.nodes]
    modules = dict(gm_in.named_modules())
    with pytest.raises(PassError, match=r"pass 'explodes' .* failed: RuntimeError: boom"):
        optimize(gm_in, passes=["patterns", explodes], example_inputs=(torch.randn(1, 2, 3, 3),))
    assert gm_in.code == code
    assert [n.format_node() for n in gm_in.graph.nodes] == nodes
    assert dict(gm_in.named_modules()) == modules
    assert isinstance(gm_in.get_submodule("bn"), nn.BatchNorm2d)


def test_optimize_never_mutates_a_graph_module_passed_in() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(2, 3, 3)
            self.bn = nn.BatchNorm2d(3)
            self.act = nn.ReLU(inplace=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.act(self.bn(self.conv(x)))

    model = randomize_bn(Net()).eval()
    gm_in = fxsym.trace(model)
    before = {k: v.clone() for k, v in gm_in.state_dict().items()}
    gm = optimize(gm_in, example_inputs=(torch.randn(1, 2, 5, 5),))
    assert ops(gm) == ["Conv2d", "ReLU"]
    assert ops(gm_in) == ["Conv2d", "BatchNorm2d", "ReLU"]
    assert gm_in.get_submodule("act").inplace
    after = gm_in.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_graph_is_recompiled_once_after_the_last_pass() -> None:
    seen: list[str] = []

    @graph_pass(default=False)
    def relu_to_sigmoid(gm: fx.GraphModule) -> int:
        for node in gm.graph.nodes:
            if node.target is torch.relu:
                node.target = torch.sigmoid
        return 1

    @graph_pass(default=False, after="relu_to_sigmoid")
    def look(gm: fx.GraphModule) -> int:
        seen.append(gm.code)
        return 0

    x = torch.randn(3)
    gm = optimize(Tiny(), passes=[look, relu_to_sigmoid], example_inputs=(x,), verify=False)
    assert "relu" in seen[0] and "sigmoid" not in seen[0]  # not recompiled between passes
    assert "sigmoid" in gm.code  # recompiled at the end
    torch.testing.assert_close(gm(x), torch.sigmoid(x) + 1)


def test_pass_must_report_a_count() -> None:
    bad = Pass("bad", lambda gm: None, default=False)  # type: ignore[arg-type,return-value]
    with pytest.raises(PassError, match="returned None"):
        optimize(Tiny(), passes=[bad])


def test_optimize_accepts_pattern_objects_and_kwargs_inputs() -> None:
    from fxsym.passes import SubgraphPattern

    class Net(nn.Module):
        def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            return torch.exp(torch.log(x)) * scale

    pattern = SubgraphPattern(
        "exp_log", lambda x: torch.exp(torch.log(x)), rewrite=lambda m, ctx: m["x"]
    )
    inputs = {"x": torch.rand(3) + 0.1, "scale": torch.randn(3)}
    gm = optimize(Net(), passes=[pattern], example_inputs=inputs)
    assert ops(gm) == ["mul"]
    assert gm.meta["fxsym_passes"].order() == ["exp_log"]
    torch.testing.assert_close(gm(**inputs), inputs["x"] * inputs["scale"])


def test_bad_example_inputs_raise_a_typed_error() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    with pytest.raises(PassError, match="fails on the example inputs"):
        optimize(fx.symbolic_trace(Net()), example_inputs=(torch.randn(2, 5),))
    with pytest.raises(fxsym.FxsymError):
        optimize(Net(), example_inputs=(torch.randn(2, 5),))


def test_pattern_with_its_own_stage_gets_its_own_pass(
    local_plugin: Callable[[list[Any]], str],
) -> None:
    from fxsym.passes import SubgraphPattern

    late = SubgraphPattern(
        "abs_abs", lambda x: torch.abs(torch.abs(x)), lambda x: torch.abs(x), stage="cleanup"
    )
    local_plugin([late])
    names = [p.name for p in default_pipeline()]
    assert names.index("remove_noops") < names.index("cleanup") < names.index("dce")

    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.abs(torch.abs(x)) - 1

    x = torch.randn(4)
    gm = optimize(Net(), example_inputs=(x,))
    assert ops(gm) == ["abs", "sub"]
    assert gm.meta["fxsym_passes"]["cleanup"].changes == 1
    torch.testing.assert_close(gm(x), x.abs() - 1)


def test_verification_of_a_graph_writing_into_its_input() -> None:
    class Net(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            torch.relu(x)  # dead: dce removes it
            x.mul_(2)  # writes into the input
            return x + 1

    x = torch.randn(3)
    original = x.clone()
    with pytest.warns(PassWarning, match="graph input 'x'"):
        gm = optimize(Net(), example_inputs=(x,))
    assert torch.equal(x, original)  # the caller's example tensor is untouched
    record = gm.meta["fxsym_passes"]["dce"]
    assert record.status == "ok" and record.changes == 1  # not rolled back
    y = torch.randn(3)
    torch.testing.assert_close(gm(y.clone()), y * 2 + 1)
