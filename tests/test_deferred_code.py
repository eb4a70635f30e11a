"""What ``fxsym.analyze`` no longer does at once gives what doing it at once gave: the Python
code of the traced GraphModule (generated on first use), and collections of the cyclic
garbage collector (paused while a model is traced and analyzed)."""

from __future__ import annotations

import copy
import gc
import threading
from typing import Any

import pytest
import torch
import torch.fx
from torch import nn

import fxsym
from fxsym.tracer import DeferredGraphModule, trace_deferred


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 5)
        self.scale = nn.Parameter(torch.rand(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x))) * self.scale.view(1, -1, 1, 1)
        return self.head(h.mean((2, 3)))


class _Counter(nn.Module):
    """A model whose forward changes what it holds (the guard puts it back)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 6)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x).relu()


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return _Block().eval()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_deferred_module_runs_and_reads_like_an_eager_one(seed: int) -> None:
    model = _model(seed)
    x = torch.randn(2, 3, 6, 6)
    eager = fxsym.trace(model, example_inputs=(x,))
    lazy = trace_deferred(model, example_inputs=(x,))
    assert type(eager).__mro__[1] is torch.fx.GraphModule
    assert isinstance(lazy, DeferredGraphModule) and lazy.code_pending
    assert dict(lazy.named_modules()).keys() == dict(eager.named_modules()).keys()
    assert all(lazy.get_submodule(n) is eager.get_submodule(n)
               for n, _ in eager.named_modules() if n)
    assert lazy.code_pending  # reading the module tree generates nothing
    assert torch.equal(lazy(x), model(x))  # the first call generates the code
    assert not lazy.code_pending
    assert lazy.code == eager.code and torch.equal(lazy(x), eager(x))


@pytest.mark.parametrize("use", ["code", "str", "recompile", "deepcopy", "reduce"])
def test_every_way_to_reach_the_code_generates_it(use: str) -> None:
    model = _model(3)
    x = torch.randn(1, 3, 5, 5)
    eager = fxsym.trace(model, example_inputs=(x,))
    lazy = trace_deferred(model, example_inputs=(x,))
    runs: Any = lazy
    if use == "code":
        assert lazy.code == eager.code
    elif use == "str":
        assert str(lazy) == str(eager)
    elif use == "recompile":
        assert lazy.recompile().src == eager.code
    elif use == "deepcopy":
        runs = copy.deepcopy(lazy)
        assert runs.code == eager.code
    else:  # pickling reads __dict__: the code must be in it
        _, (body, _imports) = lazy.__reduce__()
        assert body["_code"] == eager.code
    assert torch.equal(runs(x), model(x))


def test_symmap_hands_out_a_graph_module_with_its_code() -> None:
    model = _Counter()
    x = torch.randn(3, 4)
    for sm in (fxsym.analyze(model, example_inputs=(x,)),
               fxsym.analyze(copy.deepcopy(model), example_inputs=(x,))):
        gm = sm.graph_module
        assert gm is not None and not getattr(gm, "code_pending", False)
        assert gm.code == fxsym.trace(model, example_inputs=(x,)).code
        assert torch.equal(gm(x), model(x))
    assert model.calls == 2  # the two direct calls above; the traces left no trace


def test_symmap_graph_generates_no_code() -> None:
    """``SymMap.graph`` is read inside a resize (the hf plugin's config update): it writes
    nothing, where ``graph_module`` would generate and store the code."""
    model = _Counter()
    x = torch.randn(3, 4)
    sm = fxsym.analyze(model, example_inputs=(x,))
    lazy = sm._graph_module
    assert lazy is not None and getattr(lazy, "code_pending", False)
    assert sm.graph is lazy.graph and any(n.op == "placeholder" for n in sm.graph.nodes)
    assert lazy.code_pending


def test_graph_module_of_a_symmap_copy_runs() -> None:
    model = _model(4)
    x = torch.randn(1, 3, 4, 4)
    sm = fxsym.analyze(model, example_inputs=(x,))
    clone = copy.deepcopy(sm)
    assert clone.graph_module is not None
    assert torch.equal(clone.graph_module(x), model(x))


def _gc_probe(seen: list[bool]) -> nn.Module:
    """A model that records, in ``seen`` (outside the model: the guard undoes writes into
    it), whether the cyclic collector was enabled while its forward was traced."""

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(gc.isenabled())
            return self.lin(x)

    return Probe()


@pytest.mark.parametrize("how", ["analyze", "trace"])
def test_the_collector_is_paused_while_tracing_and_back_after(how: str) -> None:
    seen: list[bool] = []
    model = _gc_probe(seen)
    x = torch.randn(2, 4)
    assert gc.isenabled()
    if how == "analyze":
        fxsym.analyze(model, example_inputs=(x,))
    else:
        fxsym.trace(model, example_inputs=(x,))
    assert seen == [False] and gc.isenabled()


def test_the_collector_comes_back_after_a_failure_and_stays_off_if_it_was() -> None:
    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("no")

    with pytest.raises(fxsym.ModelError):
        fxsym.analyze(Broken(), example_inputs=(torch.randn(2),))
    assert gc.isenabled()
    gc.disable()
    try:
        fxsym.analyze(_gc_probe([]), example_inputs=(torch.randn(2, 4),))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_another_thread_gets_the_same_graph_module() -> None:
    model = _model(5)
    x = torch.randn(1, 3, 4, 4)
    found: list[str] = []
    thread = threading.Thread(
        target=lambda: found.append(fxsym.analyze(model, example_inputs=(x,)).graph_module.code))
    thread.start()
    thread.join()
    assert found == [fxsym.analyze(model, example_inputs=(x,)).graph_module.code]
    assert gc.isenabled()


def test_reading_the_graph_of_a_symmap_generates_no_code() -> None:
    model = _model(6)
    x = torch.randn(1, 3, 4, 4)
    sm = fxsym.analyze(model, example_inputs=(x,))
    held = vars(sm)["_graph_module"]  # what analyze kept, before anything read it
    assert isinstance(held, DeferredGraphModule) and held.code_pending
    assert sm.graph is held.graph and held.code_pending
    assert [n.op for n in sm.graph.nodes] == [n.op for n in fxsym.trace(
        model, example_inputs=(x,)).graph.nodes]
    assert sm.graph_module is held and not held.code_pending
    assert fxsym.SymMap(model).graph is None


def test_planning_generates_no_code() -> None:
    """``fxsym.plan`` reads the graph and the example inputs (MACs, the plan's input spec,
    block importance), never runs the GraphModule: its code stays ungenerated."""
    model = _model(7)
    x = torch.randn(1, 3, 4, 4)
    sm = fxsym.analyze(model, example_inputs=(x,))
    held = vars(sm)["_graph_module"]
    p = fxsym.plan(model, sm, ratio=0.5)
    assert held.code_pending
    assert p.macs_before > 0 and p.inputs == fxsym.prune.planning.input_spec((x,))
    assert sm.example_inputs is held.example_inputs
    assert fxsym.SymMap(model).example_inputs is None
