"""Hooks called through pluggy (order, wrappers, blame) and plugin state per manager."""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator
from typing import Any

import pluggy
import pytest
import torch
from torch import nn

import fxsym
from fxsym.plugins import default_plugin_manager, use_plugins
from fxsym.registry import get_registry


class Gate(nn.Module):
    """Not a torch.nn family: traced into unless a plugin says otherwise."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def gated() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 6), Gate(6), nn.ReLU(), nn.Linear(6, 2))


X = (torch.randn(3, 4),)


def call_modules(model: nn.Module, pm: fxsym.PluginManager | None = None) -> set[str]:
    with use_plugins(pm or default_plugin_manager()):
        gm = fxsym.trace(model, example_inputs=X)
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_module"}


class LeafAnswer:
    """Answers ``fxsym_leaf_module`` with ``answer`` for ``Gate``."""

    def __init__(self, answer: bool, **opts: Any) -> None:
        self.answer = answer

        @fxsym.hookimpl(**opts)
        def fxsym_leaf_module(module: nn.Module, qualname: str) -> bool | None:
            return self.answer if isinstance(module, Gate) else None

        self.fxsym_leaf_module = fxsym_leaf_module


@pytest.fixture
def pm() -> Iterator[fxsym.PluginManager]:
    """The default manager, left with nn and hf only."""
    manager = fxsym.load_plugins()
    before = set(manager.plugin_names())
    yield manager
    for name in set(manager.plugin_names()) - before:
        manager.unregister(name=name)
    manager.failed = [f for f in manager.failed if f.name in before]


def test_a_decision_hook_is_one_pluggy_call_tryfirst_first(pm: fxsym.PluginManager) -> None:
    assert "1" not in call_modules(gated())  # traced into: the multiplication is in the graph
    pm.register(LeafAnswer(True, tryfirst=True), name="leaf-first")
    pm.register(LeafAnswer(False), name="not-leaf")  # registered later: asked first otherwise
    assert "1" in call_modules(gated())
    pm.unregister(name="leaf-first")
    assert "1" not in call_modules(gated())
    pm.register(LeafAnswer(True), name="leaf-latest")  # latest registered is asked first
    assert "1" in call_modules(gated())


def test_a_third_party_wrapper_changes_the_answer(pm: fxsym.PluginManager) -> None:
    seen: list[Any] = []

    class Veto:
        """Overrides every plugin: nothing named ``1`` is a leaf."""

        @fxsym.hookimpl(wrapper=True)
        def fxsym_leaf_module(self, module: nn.Module, qualname: str) -> Generator[
                None, bool | None, bool | None]:
            answer = yield
            seen.append(answer)
            return False if qualname == "1" else answer

    pm.register(LeafAnswer(True), name="leaf")
    assert "1" in call_modules(gated())
    pm.register(Veto(), name="veto")
    assert "1" not in call_modules(gated())
    assert True in seen  # the wrapper saw the other plugin's answer and replaced it


def test_a_raising_wrapper_is_blamed_and_the_others_answer(pm: fxsym.PluginManager) -> None:
    class BrokenWrapper:
        @fxsym.hookimpl(wrapper=True)
        def fxsym_leaf_module(self, module: nn.Module, qualname: str) -> Generator[
                None, bool | None, bool | None]:
            answer = yield
            if isinstance(module, Gate):
                raise RuntimeError("wrapper boom")
            return answer

    pm.register(LeafAnswer(True), name="leaf")
    pm.register(BrokenWrapper(), name="broken-wrapper")
    with pytest.warns(fxsym.PluginWarning, match="'broken-wrapper'.*fxsym_leaf_module.*boom"):
        assert "1" in call_modules(gated())
    assert pm.has_plugin("leaf") and not pm.has_plugin("broken-wrapper")


def test_a_plain_implementation_under_a_wrapper_is_blamed_not_the_wrapper(
    pm: fxsym.PluginManager,
) -> None:
    class Passing:
        @fxsym.hookimpl(wrapper=True)
        def fxsym_leaf_module(self, module: nn.Module, qualname: str) -> Generator[
                None, bool | None, bool | None]:
            return (yield)  # the inner error passes through this frame

    class Raising:
        @fxsym.hookimpl
        def fxsym_leaf_module(self, module: nn.Module, qualname: str) -> bool | None:
            raise KeyError("plain boom")

    pm.register(Passing(), name="passing")
    pm.register(Raising(), name="raising")
    with pytest.warns(fxsym.PluginWarning, match="'raising'.*plain boom"):
        call_modules(gated())
    assert pm.has_plugin("passing") and not pm.has_plugin("raising")


def test_an_unknown_hook_is_refused_with_its_new_name(pm: fxsym.PluginManager) -> None:
    class Old:
        @fxsym.hookimpl
        def fxsym_register_leaf_policies(self, register: Any) -> None:
            pass

    with pytest.raises(pluggy.PluginValidationError, match="now fxsym_leaf_module"):
        pm.register(Old(), name="old")
    assert not pm.has_plugin("old")


def test_two_managers_with_different_plugins_answer_independently(
    pm: fxsym.PluginManager,
) -> None:
    mine = fxsym.PluginManager()
    fxsym.load_plugins(manager=mine, allow=["nn"])
    mine.register(LeafAnswer(True), name="leaf")
    assert mine.plugin_names() == ["nn", "leaf"]
    assert "1" in call_modules(gated(), mine)
    assert "1" not in call_modules(gated(), pm)  # the default manager has no such plugin
    with use_plugins(mine):
        assert get_registry().plugin_manager is mine
        assert "leaf" in [name for name in get_registry().plugin_manager.plugin_names()]
    assert get_registry().plugin_manager is pm
    assert not mine.has_plugin("hf") and pm.has_plugin("hf")


def test_a_manager_made_by_the_user_is_not_autoloaded() -> None:
    empty = fxsym.PluginManager()
    with use_plugins(empty):
        sm = fxsym.analyze(gated(), example_inputs=X)  # no family known: nothing searchable
    assert empty.plugin_names() == [] and sm.groups() == []
    assert fxsym.analyze(gated(), example_inputs=X).groups()  # the default one still knows


def test_each_thread_uses_its_own_manager(pm: fxsym.PluginManager) -> None:
    mine = fxsym.PluginManager()
    fxsym.load_plugins(manager=mine, allow=["nn"])
    mine.register(LeafAnswer(True), name="leaf")
    results: dict[str, set[str]] = {}
    errors: list[BaseException] = []

    def run(key: str, manager: fxsym.PluginManager) -> None:
        try:
            for _ in range(3):
                results[key] = call_modules(gated(), manager)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=("mine", mine)),
               threading.Thread(target=run, args=("default", pm))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert "1" in results["mine"] and "1" not in results["default"]


def test_the_hf_plugin_keeps_its_state_per_manager(pm: fxsym.PluginManager) -> None:
    from transformers import AutoConfig, AutoModel

    cfg = AutoConfig.for_model("llama", hidden_size=32, intermediate_size=64,
                               num_hidden_layers=1, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=64)
    model = AutoModel.from_config(cfg).eval()
    mine = fxsym.PluginManager()
    fxsym.load_plugins(manager=mine, allow=["nn", "hf"])
    assert mine.get_plugin("hf") is not pm.get_plugin("hf")  # one instance per manager

    def described(manager: fxsym.PluginManager) -> list[str]:
        with use_plugins(manager):
            by_plugin = get_registry().contributions.by_plugin()
        return by_plugin.get("hf", {}).get("sym_infos", [])

    attention = "transformers.models.llama.modeling_llama.LlamaAttention"
    assert attention not in described(mine)
    with use_plugins(mine):
        sm = fxsym.analyze(model)
    assert attention in described(mine)
    assert any(g.name.endswith("heads") for g in sm.groups())
    fresh = fxsym.PluginManager()
    fxsym.load_plugins(manager=fresh, allow=["nn", "hf"])
    assert attention not in described(fresh)  # what mine discovered is not shared


def test_resize_uses_the_registry_of_the_manager_the_symmap_was_analyzed_with() -> None:
    from fxsym.resizing import keep_entries

    def gate_resize(mod: nn.Module, name: str, index: torch.Tensor) -> None:
        keep_entries(mod, "scale", 0, index)

    class GatePlugin:
        @fxsym.hookimpl
        def fxsym_register_sym_infos(self, register: Any) -> None:
            register(Gate, lambda mod: fxsym.SymInfo(
                is_shape_preserving=True,
                features=fxsym.Symbol(cl_type=fxsym.Symbol.CLType.INCOMING,
                                      elastic_dims={-1})), resize=gate_resize)

    mine = fxsym.PluginManager()
    fxsym.load_plugins(manager=mine, allow=["nn"])
    mine.register(GatePlugin(), name="gate")
    model = gated()
    with use_plugins(mine):
        sm = fxsym.analyze(model, example_inputs=X)
    assert ("1", "features") in sm.groups()[0].members  # a leaf: its own rule resizes it
    fxsym.resize(model, sm, {"0.out_features": 4})  # outside use_plugins: still mine's rules
    assert model[1].scale.shape == (4,) and model(*X).shape == (3, 2)


def test_the_pass_catalog_and_op_table_are_per_manager() -> None:
    from fxsym.passes.catalog import catalog
    from fxsym.passes.table import op_table

    with_nn = fxsym.PluginManager()
    fxsym.load_plugins(manager=with_nn, allow=["nn"])
    other = fxsym.PluginManager()
    while other.generation < with_nn.generation:  # the same generation number, other plugins
        other.contributions_changed()
    assert other.generation == with_nn.generation
    with use_plugins(with_nn):
        nn_patterns = [src for _, src in catalog().patterns]
        nn_table = op_table()
    with use_plugins(other):
        assert [src for _, src in catalog().patterns] == []
        assert op_table() is not nn_table
    assert "nn" in nn_patterns
