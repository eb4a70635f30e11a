"""User hooks are part of the program (issue 30, section 3).

A forward pre-hook that flips a consumer's input, or a forward hook that rolls a producer's
output, does not run while the model is traced (running the user's hooks could write into
the user's objects), so the trace does not see what it changes. The groups of the hooked
module's inputs, outputs and sizes are pinned, with a ``hidden-hook`` report line naming the
hook, unless a plugin declares the hook harmless (``fxsym_hook_computes`` answers ``False``:
pins nothing) or part of the computation (``True``: it runs in the trace, so its effect is in
the graph and the analysis decides on it like on any op).
"""

from __future__ import annotations

from typing import Any

import torch
from helpers import assert_oracles, has_group_with
from torch import nn

import fxsym
from fxsym.oracles import check_permutation
from fxsym.plugins import PluginManager, use_plugins


def flip_input(mod: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (args[0].flip(-1),)


def roll_output(mod: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
    return out.roll(1, -1)


def double_output(mod: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
    return out * 2


def count_calls(mod: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> None:
    COUNTED.append(type(mod).__name__)


COUNTED: list[str] = []


def mlp() -> nn.Sequential:
    """Four linears: groups ``0.out_features`` (8), ``2.out_features`` (6) and
    ``4.out_features`` (5)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 6), nn.ReLU(),
                         nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4)).eval()


X = (torch.randn(2, 3),)


class Declares:
    """A plugin declaring ``computing`` hooks part of the computation, ``observers`` not."""

    def __init__(self, computing: tuple[Any, ...] = (), observers: tuple[Any, ...] = ()) -> None:
        self.computing, self.observers = computing, observers

    @fxsym.hookimpl
    def fxsym_hook_computes(self, module: Any, hook: Any) -> bool | None:
        if hook in self.computing:
            return True
        return False if hook in self.observers else None


def _manager(plugin: Declares) -> PluginManager:
    pm = PluginManager()
    fxsym.load_plugins(manager=pm, allow=["nn"])
    pm.register(plugin, name="declares")
    return pm


def _hidden(sm: fxsym.SymMap) -> list[tuple[str, str]]:
    return [(e.where, e.message) for e in sm.trace_report.of_kind("hidden-hook")]


def test_a_pre_hook_flipping_a_consumers_input_pins_its_group() -> None:
    """Permuting ``4.out_features`` while the last linear reads its input flipped changed
    the output (the group was sortable); the groups of the hooked module's input and output
    are pinned now, naming the hook, and the others stay."""
    model = mlp()
    model[6].register_forward_pre_hook(flip_input)
    sm = assert_oracles(model, X)
    assert has_group_with(sm, "0", "out_features") and has_group_with(sm, "2", "out_features")
    assert not has_group_with(sm, "4", "out_features")
    (where, message), = _hidden(sm)
    assert where == "6" and f"forward pre-hook {__name__}.flip_input" in message


def test_a_forward_hook_rolling_a_producers_output_pins_its_group() -> None:
    """A hook may change what its module reads as well as what it returns (in place): the
    groups of both are pinned, ``4.out_features`` stays."""
    model = mlp()
    model[2].register_forward_hook(roll_output)
    sm = assert_oracles(model, X)
    assert has_group_with(sm, "4", "out_features")
    assert not has_group_with(sm, "0", "out_features")
    assert not has_group_with(sm, "2", "out_features")
    (where, message), = _hidden(sm)
    assert where == "2" and f"forward hook {__name__}.roll_output" in message


def test_a_hook_on_a_traced_into_module_pins_the_values_crossing_it() -> None:
    """A hook on a module the trace goes into (no SymInfo) pins the groups of the values
    going in and out of it."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 5), nn.Linear(5, 6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(x)))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), Block(), nn.ReLU(), nn.Linear(6, 4)).eval()
    model[1].register_forward_hook(roll_output)
    sm = assert_oracles(model, X)
    assert has_group_with(sm, "1.a", "out_features")  # inside, untouched by the hook
    assert not has_group_with(sm, "0", "out_features")
    assert not has_group_with(sm, "1.b", "out_features")
    assert [w for w, _ in _hidden(sm)] == ["1"]


def test_a_hook_declared_harmless_pins_nothing() -> None:
    """An observer declared with ``fxsym_hook_computes`` ``False`` does not run while
    traced and pins nothing: the groups are those of the model without it."""
    model = mlp()
    model[2].register_forward_hook(count_calls)
    COUNTED.clear()
    with use_plugins(_manager(Declares(observers=(count_calls,)))):
        sm = fxsym.analyze(model, example_inputs=X)
        assert COUNTED == []  # not run by the analysis
        assert _hidden(sm) == [] and len(sm.groups()) == 3
        assert_oracles(model, X, min_groups=3)


def test_a_hook_declared_computing_runs_in_the_trace() -> None:
    """Declared part of the computation, the hook runs on the traced values: the analysis
    sees a roll (an order-dependent op: pinned by its own rule) or a scale (kept exact)."""
    model = mlp()
    model[2].register_forward_hook(roll_output)
    with use_plugins(_manager(Declares(computing=(roll_output,)))):
        sm = assert_oracles(model, X)
        assert _hidden(sm) == []
        assert any("roll" in e.message for e in sm.trace_report.of_kind("boundary"))
    model = mlp()
    model[2].register_forward_hook(double_output)
    with use_plugins(_manager(Declares(computing=(double_output,)))):
        sm = fxsym.analyze(model, example_inputs=X)
        assert len(sm.groups()) == 3
        assert check_permutation(model, sm, X).ok


def test_a_global_hook_pins_every_module_call_unless_declared_harmless() -> None:
    """A process-wide hook (``register_module_forward_hook``) runs around every module, and a
    leaf's call is one node: one flipping a linear's output made its group wrong. Undeclared,
    it pins the groups of every module call; declared harmless, it pins nothing."""

    def flip_six(mod: nn.Module, args: tuple[Any, ...], out: Any) -> Any:
        return out.flip(-1) if isinstance(mod, nn.Linear) and mod.out_features == 6 else None

    model = mlp()
    handle = torch.nn.modules.module.register_module_forward_hook(flip_six)
    try:
        sm = assert_oracles(model, X, min_groups=0, expect_unchecked=True)
        assert sm.groups() == []
        (where, message), = _hidden(sm)
        assert where == "Sequential" and "global forward hook" in message
        assert "flip_six" in message
        with use_plugins(_manager(Declares(observers=(flip_six,)))):
            assert len(fxsym.analyze(model, example_inputs=X).groups()) == 3
    finally:
        handle.remove()


def test_a_declared_hook_on_a_module_that_falls_back_to_a_leaf_pins() -> None:
    """A leaf holding a hook declared part of the computation is traced into so that the
    hook runs in the graph; if that trace fails (the hook branches on a tensor's value), the
    module falls back to a leaf, its SymInfo describes it, and the hook runs in no graph:
    the groups of its inputs and outputs are pinned."""

    def roll_if_positive(mod: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> Any:
        if type(out) is not torch.Tensor:  # a graph value: the trace into the leaf fails
            raise TypeError("plain tensors only")
        return out.roll(1, -1)

    model = mlp()
    model[2].register_forward_hook(roll_if_positive)
    with use_plugins(_manager(Declares(computing=(roll_if_positive,)))):
        sm = assert_oracles(model, X)
        assert [e.where for e in sm.trace_report.of_kind("leaf-fallback")] == ["2"]
        assert has_group_with(sm, "4", "out_features")
        assert not has_group_with(sm, "2", "out_features")
        assert not has_group_with(sm, "0", "out_features")
