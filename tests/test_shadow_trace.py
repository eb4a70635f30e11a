"""Tracing writes nothing into the user's modules, not even for the duration of a trace
(issue 19, item 5): the tracer runs a shadow of the module tree, so a thread serving the model
meanwhile sees it exactly as it is."""

from __future__ import annotations

import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import fxsym
from fxsym.plugins import PluginManager, default_plugin_manager, use_plugins


class Config:
    """A config object whose int field sizes a reshape (read through a shadow by the tracer)."""

    def __init__(self, heads: int) -> None:
        self.heads = heads


class Attention(nn.Module):
    """Int attributes, a tuple of ints, a config field and a cache, all read by forward."""

    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.num_heads = heads
        self.head_dim = dim // heads
        self.shape = (dim,)
        self.config = Config(heads)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.bias = nn.Parameter(torch.randn(heads, 1, 1))
        self.cache: dict[str, torch.Tensor] = {}
        self.calls: list[int] = []

    def biases(self) -> torch.Tensor:
        key = "b"
        if key not in self.cache:
            self.cache[key] = self.bias * 2
        return self.cache[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.config.heads, self.head_dim).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        attn = (q @ k.transpose(-2, -1) + self.biases()).softmax(-1)
        out = (attn @ v).transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim)
        return self.norm(self.proj(out))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.attn = Attention()
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(torch.relu(self.inp(x))))


X = torch.randn(2, 5, 8)


def _identity_state(model: nn.Module) -> list[Any]:
    """Every module's ``__dict__``, containers by content, all else by identity."""

    def frozen(value: Any) -> Any:
        if isinstance(value, dict) and not isinstance(value, nn.Module):
            return (id(value), [(k, frozen(v)) for k, v in value.items()])
        if isinstance(value, list):
            return (id(value), [frozen(v) for v in value])
        if isinstance(value, tuple):
            return tuple(frozen(v) for v in value)
        if isinstance(value, Config):
            return (id(value), frozen(vars(value)))
        return id(value)

    return [(name, frozen(vars(mod))) for name, mod in model.named_modules()]


class _Pausing(nn.Module):
    """Wraps a model; while it is traced, lets another thread look and waits for it."""

    def __init__(self, inner: nn.Module, go: threading.Event, done: threading.Event) -> None:
        super().__init__()
        self.inner = inner
        self.go, self.done = go, done

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        self.go.set()
        assert self.done.wait(30), "the other thread did not finish"
        return y


class _DeclaresObservers:
    """Declares the hooks in ``observers`` harmless (they change no value): they stay hidden
    while traced and pin nothing."""

    def __init__(self) -> None:
        self.observers: list[Any] = []

    @fxsym.hookimpl
    def fxsym_hook_computes(self, module: Any, hook: Any) -> bool | None:
        return False if hook in self.observers else None


@pytest.fixture
def observers() -> Iterator[list[Any]]:
    """Hooks appended to this list are declared harmless observers for the test."""
    pm = PluginManager()
    fxsym.load_plugins(manager=pm)
    plugin = _DeclaresObservers()
    pm.register(plugin, name="observers")
    with use_plugins(pm):
        yield plugin.observers


def test_another_thread_sees_the_model_as_it_is_during_a_trace(observers: list[Any]) -> None:
    go, done = threading.Event(), threading.Event()
    model = _Pausing(Net().eval(), go, done)
    observers.append(lambda m, a, o: m.calls.append(1))
    model.inner.attn.register_forward_hook(observers[-1])
    before = _identity_state(model)
    seen: dict[str, Any] = {}

    def bystander() -> None:
        assert go.wait(30)
        try:
            seen["state"] = _identity_state(model)
            with torch.no_grad():
                seen["out"] = model.inner(X)
        except Exception as exc:  # reported by the assertions below
            seen["error"] = exc
        finally:
            done.set()

    thread = threading.Thread(target=bystander)
    thread.start()
    sm = fxsym.analyze(model, example_inputs=(X,))
    thread.join()
    assert "error" not in seen, seen.get("error")
    assert seen["state"] == before
    assert isinstance(seen["out"], torch.Tensor) and type(seen["out"]) is torch.Tensor
    assert model.inner.attn.calls == [1], "the user's hook ran for the bystander's call"
    assert sm.groups()


def test_a_serving_thread_is_never_disturbed_by_analyses(observers: list[Any]) -> None:
    torch.manual_seed(0)
    model = Net().eval()
    hooked: list[int] = []
    observers.append(lambda m, a, o: hooked.append(1))
    model.attn.register_forward_hook(observers[-1])
    with torch.no_grad():
        expected = model(X)
    stop = threading.Event()
    failures: list[str] = []
    calls = [0]

    def serve() -> None:
        while not stop.is_set():
            try:
                with torch.no_grad():
                    out = model(X)
                if type(out) is not torch.Tensor or not torch.equal(out, expected):
                    failures.append("different output")
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
            calls[0] += 1

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        first = [(g.name, g.size) for g in fxsym.analyze(model, example_inputs=(X,)).groups()]
        for _ in range(199):
            sm = fxsym.analyze(model, example_inputs=(X,))
            assert [(g.name, g.size) for g in sm.groups()] == first
        assert first
    finally:
        stop.set()
        thread.join()
    assert calls[0] > 0
    assert failures == [], f"{len(failures)} of {calls[0]} calls failed: {failures[:3]}"
    assert len(hooked) == calls[0] + 1, "the user's hook ran for every call of the thread"


@pytest.fixture
def leaf_plugin() -> Iterator[list[Any]]:
    """A plugin making one chosen module object a leaf (a decision by identity)."""
    chosen: list[Any] = []
    seen: list[Any] = []

    class ByIdentity:
        @fxsym.hookimpl
        def fxsym_leaf_module(self, module: nn.Module, qualname: str) -> bool | None:
            seen.append(module)
            return True if chosen and module is chosen[0] else None

    pm = default_plugin_manager()
    pm.register(ByIdentity(), name="by-identity")
    try:
        yield chosen
    finally:
        pm.unregister(name="by-identity")


def test_leaf_decisions_and_the_graph_module_see_the_user_modules(leaf_plugin: list[Any]
                                                                  ) -> None:
    model = Net().eval()
    leaf_plugin.append(model.attn)
    gm = fxsym.trace(model, example_inputs=(X,))
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_module"]
    assert "attn" in targets
    for target in targets:
        assert gm.get_submodule(target) is model.get_submodule(target)
    assert gm.get_submodule("attn").qkv.weight is model.attn.qkv.weight


def test_a_forward_bound_to_the_instance_runs_on_the_shadow() -> None:
    """A module whose ``forward`` is an instance attribute bound to it (accelerate's hooks
    do this) is traced as itself: still a call of that submodule, never writing into it."""
    model = Net().eval()
    inner = model.attn

    def forward(self: Attention, x: torch.Tensor) -> torch.Tensor:
        self.seen_by_forward = True
        return Attention.forward(self, x)

    inner.forward = types.MethodType(forward, inner)
    before = _identity_state(model)
    sm = fxsym.analyze(model, example_inputs=(X,))
    assert _identity_state(model) == before
    assert not hasattr(inner, "seen_by_forward")
    assert sm.groups()


class Holder:
    """A plain object holding a module: the shadow tree shares it, it is not a container."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module


class Reaching(nn.Module):
    """Writes a traced value into a module reached through a plain object and through a tuple
    held aside."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.holder = Holder(self.lin)
        self.aside = (self.lin,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        self.holder.module.last = y  # reaches the user's module: the guard takes it back
        self.aside[0].seen = y  # the tuple holds the shadow: never reaches the user's
        return y


def test_the_guard_takes_back_a_graph_value_that_reached_the_model() -> None:
    model = Reaching().eval()
    model.lin.kept = "set before"
    fxsym.analyze(model, example_inputs=(X,))
    assert not hasattr(model.lin, "last") and not hasattr(model.lin, "seen")
    assert model.lin.kept == "set before"
