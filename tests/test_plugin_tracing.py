"""Hook-call tracing (``FXSYM_DEBUG=1``, ``fxsym plugins --trace``) and blocking plugins with
pluggy's own ``set_blocked``/``is_blocked``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from test_plugins import _run
from torch import nn

import fxsym
from fxsym.plugins.calls import call_hook
from fxsym.prune.cli import main as cli_main

ANALYZE_DEMO = (
    "import fxsym; from fxsym.prune.demo import demo_model; "
    "fxsym.analyze(demo_model()[0]); print('done')"
)


@pytest.fixture
def pm() -> Iterator[fxsym.PluginManager]:
    """The process-wide manager, left as found: nothing blocked, nn and hf loaded."""
    manager = fxsym.load_plugins()
    yield manager
    manager.failed = [f for f in manager.failed if f.name not in ("nn", "hf", "raises")]
    fxsym.load_plugins(block=[])
    assert manager.has_plugin("nn") and manager.has_plugin("hf")
    assert not manager.is_blocked("nn") and not manager.is_blocked("hf")


def test_fxsym_debug_traces_each_hook_call_and_the_plugin_answering() -> None:
    res = _run(ANALYZE_DEMO, None, FXSYM_DEBUG="1")
    assert res.returncode == 0 and "done" in res.stdout, res.stderr
    lines = res.stderr.splitlines()
    assert "fxsym_register_sym_infos -> nn [hook]" in [ln.strip() for ln in lines]
    assert any("finish fxsym_register_sym_infos <- nn -->" in ln for ln in lines)
    # the firstresult hook: one pluggy call, hf asked first (nn's is trylast) and answering
    # None, then nn, whose answer is taken
    assert any("fxsym_example_inputs -> hf, nn [hook]" in ln for ln in lines)
    assert any("finish fxsym_example_inputs <- nn --> tuple (hf --> NoneType, nn --> tuple)"
               in ln for ln in lines)
    assert "model: DemoNet" in res.stderr
    quiet = _run(ANALYZE_DEMO, None)
    assert quiet.returncode == 0 and "[hook]" not in quiet.stderr


def test_fxsym_debug_follows_the_environment(
    pm: fxsym.PluginManager, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("FXSYM_DEBUG", "1")
    fxsym.load_plugins()
    try:
        call_hook("fxsym_example_inputs", pm, model=nn.Identity())
    finally:
        monkeypatch.delenv("FXSYM_DEBUG")
        fxsym.load_plugins()  # tracing off again
    err = capsys.readouterr().err
    assert ("finish fxsym_example_inputs <- none --> NoneType "
            "(hf --> NoneType, nn --> NoneType)") in err
    call_hook("fxsym_example_inputs", pm, model=nn.Identity())
    assert "[hook]" not in capsys.readouterr().err


def test_monitoring_sees_isolated_calls_and_raising_plugins(
    pm: fxsym.PluginManager, capsys: pytest.CaptureFixture[str],
) -> None:
    class Raises:
        @fxsym.hookimpl(tryfirst=True)
        def fxsym_example_inputs(self, model: Any) -> Any:
            raise ValueError("inputs boom")

    lines: list[str] = []
    pm.register(Raises(), name="raises")
    undo = pm.trace_hooks(lines.append)
    try:
        with pytest.warns(fxsym.PluginWarning, match="inputs boom"):
            assert call_hook("fxsym_example_inputs", pm, model=nn.Identity()) is None
    finally:
        undo()
        pm.failed = [f for f in pm.failed if f.name != "raises"]  # unblocks it
    text = "".join(lines)
    assert "finish fxsym_example_inputs <- raises raised ValueError: inputs boom" in text
    assert "blocked raises [pluginmanage]" in text  # disabled: blocked through pluggy
    # called again without it: pluggy's order, hf first (nn's is trylast)
    assert text.index("<- raises") < text.index("(hf --> NoneType, nn --> NoneType)")
    assert not pm.is_blocked("raises") and not pm.has_plugin("raises")


def test_cli_plugins_trace_shows_hook_calls_and_answering_plugin(
    pm: fxsym.PluginManager, capsys: pytest.CaptureFixture[str],
) -> None:
    capsys.readouterr()
    assert cli_main(["plugins", "--trace"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("nn  (fxsym-plugins-nn")
    assert "hook calls while analyzing the built-in demo model" in out
    assert "fxsym_register_sym_infos -> nn [hook]" in out
    assert "fxsym_register_sym_infos -> hf [hook]" in out
    assert ("finish fxsym_example_inputs <- nn --> tuple (hf --> NoneType, nn --> tuple) [hook]"
            in out)
    assert "fxsym_trace_context -> hf [hook]" in out
    assert cli_main(["plugins"]) == 0
    assert "[hook]" not in capsys.readouterr().out


def test_block_uses_pluggys_set_blocked_and_a_later_load_unblocks(
    pm: fxsym.PluginManager, capsys: pytest.CaptureFixture[str],
) -> None:
    assert fxsym.load_plugins(block=["hf"]) is pm
    assert pm.is_blocked("hf") and not pm.has_plugin("hf") and pm.has_plugin("nn")
    assert pm.register(object(), name="hf") is None  # pluggy ignores a blocked name
    assert "hf" not in pm.plugin_names()
    capsys.readouterr()
    assert cli_main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "hf  (" not in out and "nn  (fxsym-plugins-nn" in out
    fxsym.load_plugins()  # a plain load (as every trace makes) keeps the block
    fxsym.load_plugins(block=["hf"])
    assert pm.is_blocked("hf") and not pm.has_plugin("hf")
    fxsym.load_plugins(rescan=True)  # clears it
    assert not pm.is_blocked("hf") and pm.has_plugin("hf")
    assert pm.source("hf").distribution == "fxsym-plugins-hf"
    fxsym.load_plugins(block=["hf"])
    fxsym.load_plugins(block=[])  # so does a new choice
    assert not pm.is_blocked("hf") and pm.has_plugin("hf")


def test_a_disabled_plugin_stays_blocked_until_its_failure_is_forgotten(
    pm: fxsym.PluginManager,
) -> None:
    class Raises:
        @fxsym.hookimpl
        def fxsym_example_inputs(self, model: Any) -> Any:
            raise ValueError("boom")

    pm.register(Raises(), name="raises")
    try:
        with pytest.warns(fxsym.PluginWarning, match="'raises'"):
            call_hook("fxsym_example_inputs", pm, model=nn.Identity())
        assert pm.is_blocked("raises") and pm.register(Raises(), name="raises") is None
        fxsym.load_plugins()
        assert pm.is_blocked("raises")  # off for the rest of the process
    finally:
        pm.failed = [f for f in pm.failed if f.name != "raises"]
    assert not pm.is_blocked("raises")
    assert pm.register(Raises(), name="raises") == "raises"
    pm.unregister(name="raises")


def test_registration_order_tryfirst_wins_and_a_wrapper_wraps_each_plugin(
    pm: fxsym.PluginManager,
) -> None:
    from fxsym.registry import get_registry

    def plugin(tag: str, **opts: Any) -> object:
        class Plugin:
            @fxsym.hookimpl(**opts)
            def fxsym_register_op_rules(self, register: Any) -> None:
                register("fxsym_test_op", tag)

        return Plugin()

    class Wrapper:
        called = 0

        @fxsym.hookimpl(wrapper=True)
        def fxsym_register_op_rules(self, register: Any) -> Any:
            Wrapper.called += 1
            return (yield)

    names = {"first": {"tryfirst": True}, "plain-old": {}, "plain-new": {},
             "last": {"trylast": True}}
    try:
        pm.register(Wrapper(), name="wrapper")
        for name, opts in names.items():
            pm.register(plugin(name, **opts), name=name)
        assert get_registry().op_rule("fxsym_test_op") == "first"
        plain = len(pm.hook.fxsym_register_op_rules.get_hookimpls()) - 1
        assert Wrapper.called == plain  # once around each plugin's call
        pm.unregister(name="first")
        assert get_registry().op_rule("fxsym_test_op") == "plain-new"
    finally:
        for name in [*names, "wrapper"]:
            if pm.has_plugin(name):
                pm.unregister(name=name)


def test_two_writers_each_get_every_line_once(pm: fxsym.PluginManager) -> None:
    a: list[str] = []
    b: list[str] = []
    undo_a = pm.trace_hooks(a.append)
    undo_b = pm.trace_hooks(b.append)
    try:
        call_hook("fxsym_example_inputs", pm, model=nn.Identity())
    finally:
        undo_b()
    call_hook("fxsym_example_inputs", pm, model=nn.Identity())
    undo_a()
    call_hook("fxsym_example_inputs", pm, model=nn.Identity())
    assert sum("finish fxsym_example_inputs <-" in ln for ln in b) == 1
    assert sum("finish fxsym_example_inputs <-" in ln for ln in a) == 2
    undo_a()  # undoing twice is harmless
