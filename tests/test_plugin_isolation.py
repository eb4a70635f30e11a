"""Every hook is isolated: a plugin failing anywhere is disabled, reported once, and the
analysis goes on without it; strict mode raises ``PluginError`` itself."""

from __future__ import annotations

import contextlib
import textwrap
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from test_plugins import LIST, _run
from torch import nn

import fxsym
from fxsym.prune.cli import main as cli_main
from fxsym.registry import get_registry


class Block(nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.bn = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


def tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Block(3, 8), Block(8, 6), nn.Conv2d(6, 4, 1))


X = (torch.randn(1, 3, 8, 8),)


def groups(sm: fxsym.SymMap) -> list[tuple[str, Any]]:
    return [(g.name, g.members) for g in sm.groups()]


BASELINE = [
    ("0.conv.out_channels", (("0.conv", "out_channels"), ("0.bn", "num_features"),
                             ("1.conv", "in_channels"))),
    ("1.conv.out_channels", (("1.conv", "out_channels"), ("1.bn", "num_features"),
                             ("2", "in_channels"))),
]

TEST_PLUGINS = ("bad-enter", "bad-exit", "bad-inputs", "bad-leaf", "good-ctx",
                "brokenctx", "brokenreg", "brokenexit")


@pytest.fixture
def pm(monkeypatch: pytest.MonkeyPatch) -> Iterator[fxsym.PluginManager]:
    """The real process-wide manager, left as it was found: test plugins unregistered, their
    failures forgotten, nn and hf loaded."""
    monkeypatch.delenv("FXSYM_STRICT_PLUGINS", raising=False)
    manager = fxsym.load_plugins()
    assert manager.has_plugin("nn")
    yield manager
    for name in TEST_PLUGINS:
        if manager.has_plugin(name):
            manager.unregister(name=name)
    manager.failed = [f for f in manager.failed if f.name not in TEST_PLUGINS]
    fxsym.load_plugins()
    assert manager.has_plugin("nn") and manager.has_plugin("hf")


class _Raises:
    """A context manager failing on enter or on exit, counting what ran."""

    def __init__(self, on: str, events: list[str]) -> None:
        self.on, self.events = on, events

    def __enter__(self) -> None:
        self.events.append("enter")
        if self.on == "enter":
            raise RuntimeError("enter boom")

    def __exit__(self, *exc: object) -> None:
        self.events.append("exit")
        if self.on == "exit":
            raise RuntimeError("exit boom")


def _ctx_plugin(on: str, events: list[str]) -> object:
    class Plugin:
        @fxsym.hookimpl
        def fxsym_trace_context(self, model: Any, example_inputs: Any) -> Any:
            return _Raises(on, events)

    return Plugin()


def _good_ctx(events: list[str]) -> object:
    class Plugin:
        @fxsym.hookimpl
        def fxsym_trace_context(self, model: Any) -> Any:  # declares a subset of the args
            @contextlib.contextmanager
            def ctx() -> Iterator[None]:
                events.append("good enter")
                try:
                    yield
                finally:
                    events.append("good exit")

            return ctx()

    return Plugin()


class _BadInputs:
    @fxsym.hookimpl
    def fxsym_example_inputs(self, model: Any) -> Any:
        raise ValueError("inputs boom")


class _BadLeaf:
    """A leaf decision raising on nested modules: inside a parent's ``call_module``."""

    @fxsym.hookimpl
    def fxsym_leaf_module(self, module: nn.Module, qualname: str) -> bool | None:
        if "." in qualname:
            raise KeyError("leaf boom")
        return None


def _plugin_for(kind: str, events: list[str]) -> tuple[str, object]:
    if kind in ("enter", "exit"):
        return f"bad-{kind}", _ctx_plugin(kind, events)
    return f"bad-{kind}", {"inputs": _BadInputs, "leaf": _BadLeaf}[kind]()


def _analyze(kind: str) -> fxsym.SymMap:
    # without example inputs the nn plugin's defaults are asked for: the example-inputs hook
    return fxsym.analyze(tiny(), example_inputs=None if kind == "inputs" else X)


KINDS = ["enter", "exit", "inputs", "leaf"]
WHAT = {"enter": "enter boom", "exit": "exit boom", "inputs": "inputs boom", "leaf": "leaf boom"}
DURING = {"enter": "fxsym_trace_context", "exit": "fxsym_trace_context (exit)",
          "inputs": "fxsym_example_inputs", "leaf": "fxsym_leaf_module"}


@pytest.mark.parametrize("kind", KINDS)
def test_failing_hook_disables_its_plugin_and_analysis_goes_on(
    pm: fxsym.PluginManager, kind: str
) -> None:
    assert groups(_analyze(kind)) == BASELINE
    events: list[str] = []
    name, plugin = _plugin_for(kind, events)
    pm.register(_good_ctx(events), name="good-ctx")
    pm.register(plugin, name=name)
    with pytest.warns(fxsym.PluginWarning) as caught:
        sm = _analyze(kind)
    reports = [str(w.message) for w in caught if issubclass(w.category, fxsym.PluginWarning)]
    assert len(reports) == 1, reports
    assert f"{name!r} (distribution '<local>') failed in {DURING[kind]}" in reports[0]
    assert WHAT[kind] in reports[0]
    assert groups(sm) == BASELINE
    assert not sm.trace_report.of_kind("leaf-fallback")
    # the other plugin's context was entered and exited once
    assert [e for e in events if e.startswith("good")] == ["good enter", "good exit"]
    assert not pm.has_plugin(name) and pm.has_plugin("good-ctx") and pm.has_plugin("nn")
    assert [(f.name, f.during) for f in pm.failed if f.name == name] == [(name, DURING[kind])]
    with warnings.catch_warnings():  # reported once: off for the rest of the process
        warnings.simplefilter("error")
        assert groups(_analyze(kind)) == BASELINE
    assert [e for e in events if not e.startswith("good")] == (
        ["enter", "exit"] if kind == "exit" else ["enter"] if kind == "enter" else [])


@pytest.mark.parametrize("kind", KINDS)
def test_strict_mode_raises_plugin_error_itself(
    pm: fxsym.PluginManager, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    name, plugin = _plugin_for(kind, events)
    pm.register(_good_ctx(events), name="good-ctx")
    pm.register(plugin, name=name)
    monkeypatch.setenv("FXSYM_STRICT_PLUGINS", "1")
    with pytest.raises(fxsym.PluginError, match=WHAT[kind]) as info:
        _analyze(kind)
    assert not isinstance(info.value, fxsym.TraceError)
    assert not pm.has_plugin(name)
    assert events.count("good enter") == events.count("good exit")  # contexts restored


def test_failing_exit_does_not_mask_the_traces_own_error(
    pm: fxsym.PluginManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Raises(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ZeroDivisionError("the model's own error")

    events: list[str] = []
    pm.register(_ctx_plugin("exit", events), name="bad-exit")
    pm.register(_good_ctx(events), name="good-ctx")  # entered first: exited after bad-exit
    monkeypatch.setenv("FXSYM_STRICT_PLUGINS", "1")  # even strict: the trace's error wins
    with pytest.warns(fxsym.PluginWarning, match="exit boom"), \
            pytest.raises(fxsym.TraceError, match="the model's own error"):
        fxsym.trace(Raises(), example_inputs=(torch.randn(2),))
    assert events == ["good enter", "enter", "exit", "good exit"]
    assert not pm.has_plugin("bad-exit") and pm.has_plugin("good-ctx")


def test_failing_registration_hook_drops_all_of_the_plugin(pm: fxsym.PluginManager) -> None:
    class HalfBroken:
        @fxsym.hookimpl
        def fxsym_leaf_module(self, module: nn.Module, qualname: str) -> bool | None:
            return True  # everything a leaf: would break groups

        @fxsym.hookimpl
        def fxsym_register_op_rules(self, register: Callable[..., None]) -> None:
            raise ValueError("rules boom")

    pm.register(HalfBroken(), name="brokenreg")
    with pytest.warns(fxsym.PluginWarning, match="'brokenreg'.*fxsym_register_op_rules.*boom"):
        assert "brokenreg" not in get_registry().contributions.by_plugin()
    assert not pm.has_plugin("brokenreg")
    assert groups(fxsym.analyze(tiny(), example_inputs=X)) == BASELINE


CTX_PLUGIN = textwrap.dedent('''
    import fxsym

    class Broken:
        def __enter__(self):
            raise RuntimeError("ctx boom")
        def __exit__(self, *exc):
            return False

    @fxsym.hookimpl
    def fxsym_trace_context(model, example_inputs):
        return Broken()
''')


def test_installed_plugin_is_reported_by_distribution_and_listed_inactive_only(
    pm: fxsym.PluginManager, install_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    install_plugin("fxsym-broken-ctx", {"fxsym_broken_ctx.py": CTX_PLUGIN},
                   {"brokenctx": "fxsym_broken_ctx"})
    assert pm.has_plugin("brokenctx")
    with pytest.warns(fxsym.PluginWarning, match="'brokenctx'.*'fxsym-broken-ctx'.*ctx boom"):
        assert groups(fxsym.analyze(tiny(), example_inputs=X)) == BASELINE
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fxsym.load_plugins()  # a disabled entry point is not loaded again
        assert groups(fxsym.analyze(tiny(), example_inputs=X)) == BASELINE
    assert not pm.has_plugin("brokenctx")
    capsys.readouterr()
    assert cli_main(["plugins"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("brokenctx")]
    assert len(lines) == 1 and "fxsym-broken-ctx" in lines[0]
    assert "INACTIVE (failed in fxsym_trace_context): RuntimeError: ctx boom" in lines[0]


def test_sys_exit_at_import_does_not_end_the_host(pm: fxsym.PluginManager,
                                                  install_plugin: Any) -> None:
    with pytest.warns(fxsym.PluginWarning, match="'brokenexit'.*fxsym-broken-exit.*SystemExit"):
        site = install_plugin("fxsym-broken-exit",
                              {"fxsym_broken_exit/__init__.py": "import sys\nsys.exit(3)\n"},
                              {"brokenexit": "fxsym_broken_exit"})
    assert not pm.has_plugin("brokenexit")
    assert [f.name for f in pm.failed].count("brokenexit") == 1
    assert groups(fxsym.analyze(tiny(), example_inputs=X)) == BASELINE
    lenient = _run(LIST + "; print('still here')", site)
    assert lenient.returncode == 0 and "still here" in lenient.stdout
    strict = _run(LIST, site, FXSYM_STRICT_PLUGINS="1")
    assert strict.returncode != 0 and "PluginError" in strict.stderr
    assert "SystemExit" in strict.stderr


def test_unknown_names_in_fxsym_plugins_warn(
    pm: fxsym.PluginManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FXSYM_PLUGINS", "nn, hf, nosuch")
    with pytest.warns(fxsym.PluginWarning, match=r"'nosuch'.*known: .*'hf', 'nn'"):
        fxsym.load_plugins()
    assert pm.has_plugin("nn") and pm.has_plugin("hf")
    with warnings.catch_warnings():  # once per question, not at every trace
        warnings.simplefilter("error")
        fxsym.load_plugins()
    monkeypatch.setenv("FXSYM_PLUGINS", "nn,hf")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fxsym.load_plugins()
