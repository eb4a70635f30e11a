"""The plugin system: entry-point discovery, failures, environment switches, precedence."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers import assert_oracles
from torch import nn

import fxsym
from fxsym import Symbol, SymInfo, SymMap
from fxsym.registry import get_registry

THIRD_PARTY = textwrap.dedent('''
    import torch
    import fxsym
    from fxsym import SymInfo, Symbol
    from torch import nn

    class Scale(nn.Module):
        """Multiplies by a learned per-feature scale, then projects."""
        def __init__(self, n_in, n_out):
            super().__init__()
            self.scale = nn.Parameter(torch.rand(n_in) + 0.5)
            self.proj = nn.Parameter(torch.randn(n_out, n_in))
        def forward(self, x):
            return (x * self.scale) @ self.proj.t()

    def info(mod):
        return SymInfo(
            n_in=Symbol(cl_type=Symbol.CLType.INCOMING, elastic_dims={-1}),
            n_out=Symbol(is_searchable=True, cl_type=Symbol.CLType.OUTGOING, elastic_dims={-1}),
        )

    def resize(mod, name, index):
        from fxsym.resizing import keep_entries
        if name == "n_in":
            keep_entries(mod, "scale", 0, index)
            keep_entries(mod, "proj", 1, index)
        else:
            keep_entries(mod, "proj", 0, index)

    @fxsym.hookimpl
    def fxsym_register_sym_infos(register):
        register(Scale, info, resize=resize)
''')


def _install_third_party(install_plugin: Callable[..., Path]) -> Path:
    return install_plugin(
        "fxsym-thirdparty",
        {"fxsym_thirdparty/__init__.py": THIRD_PARTY},
        {"thirdparty": "fxsym_thirdparty"},
    )


def test_third_party_distribution_is_discovered_and_used(install_plugin) -> None:
    _install_third_party(install_plugin)
    pm = fxsym.load_plugins()
    assert pm.has_plugin("thirdparty")
    assert pm.source("thirdparty").distribution == "fxsym-thirdparty"
    assert pm.source("thirdparty").version == "1.0"
    from fxsym_thirdparty import Scale

    model = nn.Sequential(nn.Linear(4, 6), Scale(6, 5), nn.ReLU(), nn.Linear(5, 2))
    x = torch.randn(3, 4)
    sm = fxsym.analyze(model, example_inputs=(x,))
    groups = {g.name: g.members for g in sm.groups()}
    assert groups == {
        "0.out_features": (("0", "out_features"), ("1", "n_in")),
        "1.n_out": (("1", "n_out"), ("3", "in_features")),
    }
    fxsym.resize(model, sm, {"0.out_features": [5, 0, 2], "1.n_out": 2})
    assert model(x).shape == (3, 2) and model[1].proj.shape == (2, 3)


def test_broken_plugin_is_reported_by_name_and_skipped(install_plugin) -> None:
    with pytest.warns(fxsym.PluginWarning, match=r"'broken'.*fxsym-broken.*boom"):
        install_plugin("fxsym-broken", {"fxsym_broken/__init__.py": "raise RuntimeError('boom')\n"},
                       {"broken": "fxsym_broken"})
    pm = fxsym.load_plugins()
    assert [(f.name, f.distribution) for f in pm.failed if f.name == "broken"] == [
        ("broken", "fxsym-broken")]
    assert pm.has_plugin("nn") and not pm.has_plugin("broken")
    # the host still works, with the other plugins
    sm = fxsym.analyze(nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1)),
                       example_inputs=(torch.randn(1, 2),))
    assert [g.name for g in sm.groups()] == ["0.out_features"]


def test_plugin_whose_hook_raises_is_skipped(install_plugin) -> None:
    src = ("import fxsym\n@fxsym.hookimpl\ndef fxsym_register_op_rules(register):\n"
           "    raise ValueError('bad hook')\n")
    with pytest.warns(fxsym.PluginWarning, match="bad hook"):
        install_plugin("fxsym-broken-hook", {"fxsym_broken_hook.py": src},
                       {"brokenhook": "fxsym_broken_hook"})
        assert "brokenhook" not in get_registry().contributions.by_plugin()
    assert get_registry().op_rule(torch.add) is not None


def _run(code: str, site: Path | None, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("FXSYM_")}
    full.update(env)
    if site is not None:
        full["PYTHONPATH"] = os.pathsep.join([str(site), full.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full,
                          timeout=300)


LIST = "import fxsym; pm = fxsym.load_plugins(); print(sorted(n for n, _ in pm.list_name_plugin()))"


def test_environment_switches(install_plugin) -> None:
    site = _install_third_party(install_plugin)
    assert "'thirdparty'" in _run(LIST, site).stdout
    assert _run(LIST, site, FXSYM_DISABLE_PLUGIN_AUTOLOAD="1").stdout.strip() == "[]"
    assert _run(LIST, site, FXSYM_PLUGINS="nn").stdout.strip() == "['nn']"


def test_strict_mode_raises_on_a_broken_plugin(install_plugin) -> None:
    with pytest.warns(fxsym.PluginWarning):
        site = install_plugin("fxsym-broken",
                              {"fxsym_broken/__init__.py": "raise ImportError('x')\n"},
                              {"broken": "fxsym_broken"})
    res = _run(LIST, site, FXSYM_STRICT_PLUGINS="1")
    assert res.returncode != 0 and "PluginError" in res.stderr and "fxsym-broken" in res.stderr


def test_load_plugins_is_idempotent_and_allow_block() -> None:
    pm = fxsym.load_plugins()
    before = pm.generation
    assert fxsym.load_plugins() is pm and pm.generation == before
    fxsym.load_plugins(block=["nn"])
    assert not pm.has_plugin("nn")
    fxsym.load_plugins(allow=["nn"])
    assert pm.has_plugin("nn") and not pm.has_plugin("hf")
    fxsym.load_plugins()
    assert pm.has_plugin("nn")


class _Base(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class _SameForward(_Base):
    pass


class _OwnForward(_Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * 2


def _info(tag: str) -> Callable[[nn.Module], SymInfo]:
    def factory(mod: nn.Module) -> SymInfo:
        info = SymInfo(**{tag: Symbol(cl_type=Symbol.CLType.INCOMING, elastic_dims={-1})})
        return info

    return factory


class _PluginA:
    @fxsym.hookimpl
    def fxsym_register_sym_infos(self, register):  # type: ignore[no-untyped-def]
        register(_Base, _info("from_a"))
        register(nn.Linear, _info("a_linear"))


class _PluginB:
    @fxsym.hookimpl
    def fxsym_register_sym_infos(self, register):  # type: ignore[no-untyped-def]
        register(_Base, _info("from_b"))


def test_precedence_user_then_most_specific_then_conflict_warning() -> None:
    pm = fxsym.load_plugins()
    registry = get_registry()
    pm.register(_PluginA(), name="plugin-a")
    try:
        # a plugin's Linear registration (more recent) overrides the nn plugin's, with a warning
        with pytest.warns(fxsym.PluginWarning, match="two plugins.*fxsym-plugins-nn.*<local>"):
            entry = registry.sym_info_entry(nn.Linear)
        assert entry is not None and entry.source == "plugin-a"
        # subclass without its own forward inherits; with its own forward it does not
        assert registry.sym_info_entry(_SameForward).source == "plugin-a"  # type: ignore[union-attr]
        assert registry.sym_info_entry(_OwnForward) is None
        # a user registration beats every plugin
        SymMap.register(_Base)(_info("from_user"))
        try:
            assert set(_info_of(_SameForward())) == {"from_user"}
        finally:
            SymMap.unregister(_Base)
        assert set(_info_of(_Base())) == {"from_a"}
        pm.register(_PluginB(), name="plugin-b")
        with pytest.warns(fxsym.PluginWarning, match="_Base is described by two plugins"):
            assert set(_info_of(_Base())) == {"from_b"}
    finally:
        for name in ("plugin-a", "plugin-b"):
            if pm.has_plugin(name):
                pm.unregister(name=name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert registry.sym_info_entry(nn.Linear).source == "nn"  # type: ignore[union-attr]


def _info_of(mod: nn.Module) -> dict[str, Symbol]:
    entry = get_registry().sym_info_entry(type(mod))
    assert entry is not None
    return entry.factory(mod).symbols


def test_overriding_subclass_is_traced_into_not_misdescribed() -> None:
    class WSConv(nn.Conv2d):  # weight standardisation: not a plain conv any more
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            w = self.weight
            w = w - w.mean(dim=(1, 2, 3), keepdim=True)
            w = w / (w.std(dim=(1, 2, 3), keepdim=True) + 1e-5)
            return nn.functional.conv2d(x, w, self.bias, self.stride, self.padding)

    model = nn.Sequential(nn.Conv2d(3, 8, 1), WSConv(8, 8, 3, padding=1), nn.Conv2d(8, 4, 1))
    sm = fxsym.analyze(model, example_inputs=(torch.randn(1, 3, 6, 6),))
    assert get_registry().sym_info_entry(WSConv) is None
    gm = sm.graph_module
    assert "1" not in {n.target for n in gm.graph.nodes if n.op == "call_module"}
    [note] = sm.trace_report.of_kind("traced-into")
    assert note.where == "1" and "overrides forward of Conv2d" in note.message
    # traced into: the functional conv ties conv 0's channels to WSConv's weight columns
    # (standardising over them is permutation-invariant), and its weight's rows produce the
    # output channels (issue 11: functional forms are first-class); the size attributes
    # Conv2d's own rule would set are members, so a resize keeps them true; both oracles hold
    assert [(g.name, g.members) for g in sm.groups()] == [
        ("0.out_channels", (("0", "out_channels"), ("1", "weight:1"), ("1", "attr:in_channels"))),
        ("1.weight:0", (("1", "weight:0"), ("1", "bias:0"), ("2", "in_channels"),
                        ("1", "attr:out_channels")))]
    assert_oracles(model, (torch.randn(1, 3, 6, 6),))
    fxsym.resize(model, sm, {"0.out_channels": 5, "1.weight:0": 6})
    ws = model[1]
    assert (ws.in_channels, ws.out_channels) == (5, 6) == tuple(ws.weight.shape[1::-1])


def test_cli_plugins_lists_contributions() -> None:
    res = subprocess.run([sys.executable, "-m", "fxsym.prune.cli", "plugins"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0
    assert "nn  (fxsym-plugins-nn 0.1.0)" in res.stdout
    assert "sym_infos: torch.nn.modules.linear.Linear" in res.stdout
