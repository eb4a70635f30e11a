"""The typed plugin boundary (issue 32 §3): each hook is a Protocol that pluggy reads as its
specification and mypy as its signature; the plugins declare the hooks they implement (mypy
checks each implementation against its specification); answers have one shape each.

mypy itself is the check of the signatures (``mypy`` in the repository, strict); these tests
check what mypy cannot see: that every implementation is declared (an undeclared one would go
unchecked), that pluggy uses exactly the Protocols' specifications, and the typed answers'
behaviour.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import group_with
from torch import nn

import fxsym
from fxsym.plugins import hookspecs
from fxsym.plugins.contracts import Undescribed
from fxsym.prune.checkpoint import CheckpointReader, open_checkpoint


def _implemented(plugin: object) -> set[str]:
    return {name for name in dir(plugin) if name.startswith("fxsym_")
            and getattr(getattr(plugin, name), "fxsym_impl", None) is not None}


def test_every_hook_the_plugins_implement_is_declared() -> None:
    """The nn plugin (a module: its ``Hooks`` protocol) and the hf plugin (a class: its
    bases) declare exactly the hooks they implement, so mypy checks every implementation."""
    import fxsym_plugins_hf.plugin as hf
    import fxsym_plugins_nn.plugin as nn_plugin

    assert _implemented(nn_plugin) == hookspecs.declared_hooks(nn_plugin.Hooks)
    assert _implemented(hf.HuggingFacePlugin) == hookspecs.declared_hooks(hf.HuggingFacePlugin)
    assert len(_implemented(hf.HuggingFacePlugin)) == 22


def test_the_manager_specifies_each_protocol_hook_once() -> None:
    """Every hook of a plugin manager is one of :data:`hookspecs.HOOKS` (its argument names
    are the Protocol method's, ``self`` left out), and every Protocol is a hook."""
    pm = fxsym.PluginManager()
    specified = {name: getattr(pm.hook, name).spec for name in dir(pm.hook)
                 if name.startswith("fxsym_")}
    declared = {name for cls in hookspecs.HOOKS for name in hookspecs.declared_hooks(cls)}
    assert set(specified) == declared and len(declared) == len(hookspecs.HOOKS) == 26
    leaf = specified["fxsym_leaf_module"]
    assert leaf.namespace is hookspecs.LeafModuleHook
    assert leaf.argnames == ("module", "qualname") and leaf.opts["firstresult"]


class _Drifted:
    """An implementation whose argument name drifted from the specification."""

    @fxsym.hookimpl
    def fxsym_leaf_module(self, module: nn.Module, name: str) -> bool | None:
        return None


def test_a_drifted_argument_name_is_refused_at_registration() -> None:
    """pluggy checks the names (mypy the types): ``name`` is not an argument of
    ``fxsym_leaf_module``."""
    import pluggy

    pm = fxsym.PluginManager()
    with pytest.raises(pluggy.PluginValidationError, match="name"):
        pm.register(_Drifted(), name="drifted")


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 30)
        self.down = nn.Linear(30, 16)
        self.head = nn.Linear(16, 40)
        self.out = nn.Linear(40, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.head(x + self.down(torch.relu(self.up(x))))))


class _Describes:
    """Says the model's description cannot follow ``up``'s rows at all and follows
    ``head``'s rows only in steps of 8 entries; ``old`` answers with the deprecated shapes."""

    def __init__(self, old: bool) -> None:
        self.old = old

    @fxsym.hookimpl
    def fxsym_undescribed_groups(self, model: nn.Module, symmap: fxsym.SymMap
                                 ) -> Mapping[str, Any]:
        up = group_with(symmap, "up", "out_features").name
        head = group_with(symmap, "head", "out_features").name
        if self.old:
            return {up: "no field for it", head: (8, "heads of 8")}
        return {up: Undescribed("no field for it"), head: Undescribed("heads of 8", step=8)}


@pytest.fixture
def model_and_map() -> Iterator[tuple[MLP, fxsym.SymMap]]:
    torch.manual_seed(0)
    model = MLP().eval()
    pm = fxsym.PluginManager()
    fxsym.load_plugins(manager=pm, allow=["nn"])
    with fxsym.use_plugins(pm):
        yield model, fxsym.analyze(model, example_inputs=(torch.randn(2, 16),))


def _plan(model: MLP, sm: fxsym.SymMap, old: bool) -> fxsym.Plan:
    pm = sm.registry.plugin_manager
    pm.register(_Describes(old), name="describes")
    try:
        return fxsym.plan(model, sm, ratio=0.5, describable=True)
    finally:
        pm.unregister(name="describes")


def test_undescribed_groups_answer_one_shape(model_and_map: tuple[MLP, fxsym.SymMap]) -> None:
    """``Undescribed(reason)`` keeps the group whole, ``Undescribed(reason, step=8)`` rounds
    its kept size to multiples of 8 entries; both recorded in the plan."""
    model, sm = model_and_map
    plan = _plan(model, sm, old=False)
    up = group_with(sm, "up", "out_features").name
    head = group_with(sm, "head", "out_features").name
    assert plan.extra["undescribed"] == {up: "no field for it"}
    choices = plan.choices()
    assert up not in choices or len(choices[up]) == 30
    step = plan.extra["steps"][head]
    assert step["step"] * step["unit"] == 8 and step["why"] == "heads of 8"
    kept = len(choices[head])
    assert kept % 8 == 0 and 0 < kept < 40


def test_the_deprecated_shapes_give_the_same_plan_with_a_warning(
        model_and_map: tuple[MLP, fxsym.SymMap]) -> None:
    """A reason string and an ``(entries, reason)`` tuple still work, with a
    DeprecationWarning, and give exactly the plan of the typed answer."""
    model, sm = model_and_map
    typed = _plan(model, sm, old=False)
    with pytest.warns(DeprecationWarning, match="Undescribed"):
        old = _plan(model, sm, old=True)
    assert old.to_json() == typed.to_json()


def test_undescribed_refuses_a_step_that_is_no_count() -> None:
    for bad in (0, -4, True, 2.0):
        with pytest.raises(ValueError, match="step"):
            Undescribed("r", step=bad)  # type: ignore[arg-type]


class _Partial:
    """A reader without ``stored``/``ignored`` (nor ``how_to_load``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def build(self) -> nn.Module:
        return nn.Linear(2, 2)

    def tensor_files(self) -> dict[str, str]:
        return {}

    def replaced_files(self) -> set[str]:
        return set()

    def calibration(self, texts: Any, *, tokens: int, seq_len: int) -> list[Any]:
        return []


class _Reader(_Partial, CheckpointReader):
    """A reader declaring the protocol: ``stored`` and ``ignored`` are the protocol's."""

    def how_to_load(self, output: Path) -> str:
        return "fxsym.load"


class _Reads:
    def __init__(self, cls: type) -> None:
        self.cls = cls

    @fxsym.hookimpl(tryfirst=True)
    def fxsym_checkpoint_reader(self, directory: Path) -> Any:
        return self.cls(directory)


def _open(tmp_path: Path, cls: type) -> CheckpointReader:
    pm = fxsym.PluginManager()
    pm.register(_Reads(cls), name="reads")
    with fxsym.use_plugins(pm), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return open_checkpoint(tmp_path)


def test_a_reader_is_the_protocol_or_refused(tmp_path: Path) -> None:
    """A reader subclassing :class:`CheckpointReader` has its defaults (stored under the
    model's names, nothing ignored); one lacking members is refused, naming them, instead of
    being asked ``hasattr`` at each use."""
    reader = _open(tmp_path, _Reader)
    model = reader.build()
    assert reader.stored(model) is None and reader.ignored(model, ["x"]) == set()
    with pytest.raises(fxsym.PluginError, match="how_to_load, ignored, stored"):
        _open(tmp_path, _Partial)
