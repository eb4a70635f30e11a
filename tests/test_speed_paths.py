"""The fast paths of tracing give what the slow ones gave: the module tree snapshot, the
leaf lookup, the check for tensors to move to the meta device."""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import fxsym
from fxsym.modstate import ModuleTreeState
from fxsym.tracer.meta import _GRAD, _META, _REAL, _tensor_kinds, to_meta


class _Shelf(nn.Module):
    """A module whose forward rewrites what it holds in every way the snapshot restores."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.cache: dict[str, Any] = {"a": 1, "b": 2}
        self.seen: list[Any] = [1, [2, 3]]
        self.tags: set[str] = {"x"}
        self.empty: dict[str, Any] = {}
        self.cycle: list[Any] = []
        self.cycle.append(self.cycle)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache.pop("a")
        self.cache["a"] = 1  # same items, new order
        self.seen[1].append(4)
        self.tags.add("y")
        self.empty["new"] = x
        self.cycle.append(0)
        self.lin._forward_hooks[99] = print
        self.width = 3
        return self.lin(x)


def test_snapshot_restores_every_container_and_attribute() -> None:
    model = _Shelf()
    cache, order = model.cache, list(model.cache)
    before = ModuleTreeState(model)
    model(torch.randn(2, 4))
    before.restore()
    assert model.cache is cache and list(model.cache) == order
    assert model.seen == [1, [2, 3]] and model.tags == {"x"} and model.empty == {}
    assert model.cycle == [model.cycle] and not model.lin._forward_hooks
    assert "width" not in vars(model)
    before.restore()  # idempotent
    assert list(model.cache) == order


def test_snapshot_leaves_a_module_that_is_a_container_alone() -> None:
    class Box(nn.Module, dict):  # type: ignore[misc]
        __hash__ = nn.Module.__hash__

    model = nn.Module()
    model.box = Box()
    state = ModuleTreeState(model)
    dict.__setitem__(model.box, "k", 1)
    state.restore()
    assert dict(model.box) == {"k": 1}


def test_tensor_kinds_sees_what_pytree_sees() -> None:
    pair = namedtuple("pair", "a b")
    meta, real = torch.empty(2, device="meta"), torch.ones(2)
    grad = torch.ones(2, requires_grad=True).to("meta")
    assert _tensor_kinds((meta, [1, {"k": meta}], None)) == _META
    assert _tensor_kinds(((meta,), OrderedDict(k=pair(1, real)))) == _META | _REAL
    assert _tensor_kinds({"g": grad}) == _META | _GRAD
    assert _tensor_kinds(torch.Size([2, 3])) == 0
    moved = to_meta(OrderedDict(k=pair(1, real)))
    assert moved["k"].b.is_meta


def test_leaves_are_looked_up_without_get_submodule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each leaf's value used to look its module up with ``get_submodule``, whose attribute
    reads go through torch.fx's patched ``__getattr__`` while tracing (~0.1 ms a leaf)."""
    calls: list[str] = []
    original = nn.Module.get_submodule

    def spy(self: nn.Module, target: str) -> nn.Module:
        calls.append(target)
        return original(self, target)

    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3))
    monkeypatch.setattr(nn.Module, "get_submodule", spy)
    gm = fxsym.trace(model, example_inputs=(torch.randn(1, 3, 8, 8),))
    assert calls == []
    assert [tuple(n.meta["val"].shape) for n in gm.graph.nodes if n.op == "call_module"] == [
        (1, 8, 6, 6), (1, 8, 6, 6), (1, 4, 4, 4)]


class _Blocks(nn.Module):
    """Four Linear layers of one configuration and one of another."""

    def __init__(self) -> None:
        super().__init__()
        self.same = nn.ModuleList(nn.Linear(6, 6) for _ in range(4))
        self.other = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.same:
            x = torch.relu(layer(x))
        return self.other(x.transpose(0, 1).contiguous().transpose(0, 1))


def test_torch_nn_leaves_of_one_key_run_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leaves of torch.nn with equal attributes, tensor metadata and input metadata give
    values of equal metadata: the first is run on the meta device, the others reuse it
    (fresh tensors, not shared). Before, every leaf ran."""
    runs: list[tuple[int, ...]] = []
    original = nn.Linear.forward

    def spy(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        runs.append(tuple(x.shape))
        return original(self, x)

    monkeypatch.setattr(nn.Linear, "forward", spy)
    fxsym.load_plugins()
    x = torch.randn(5, 6)
    gm = fxsym.trace(_Blocks(), example_inputs=(x,))
    assert runs.count((5, 6)) == 2  # one of the four ``same``, and ``other``
    values = [n.meta["val"] for n in gm.graph.nodes if n.op == "call_module"]
    assert [tuple(v.shape) for v in values] == [(5, 6)] * 4 + [(5, 3)]
    assert len({id(v) for v in values}) == len(values)
    assert values[-1].stride() == (3, 1) and values[-1].dtype == torch.float32


class _Counter(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the aten ops run while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class _Sums(nn.Module):
    """``torch.hypot`` of equal metadata four times (a pointwise op the tracer runs: it has
    no rule in :mod:`fxsym.tracer.values`)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = torch.hypot(x, y)
        b = torch.hypot(x, y)
        c = x.hypot(y)
        d = torch.hypot(x.transpose(0, 1), y.transpose(0, 1))  # other strides: computed
        return torch.hypot(a * b * c, d.transpose(0, 1))


def test_torch_ops_of_one_key_run_once() -> None:
    """A torch function or method on meta tensors of equal metadata and equal other
    arguments is computed once per trace; the others get fresh tensors alike. Before,
    ``aten.hypot`` ran for each of the four."""
    fxsym.load_plugins()
    counter = _Counter()
    with counter:
        gm = fxsym.trace(_Sums(), example_inputs=(torch.randn(3, 4), torch.randn(3, 4)))
    vals = [n.meta["val"] for n in gm.graph.nodes if "hypot" in n.name]
    assert counter.ops.count("aten.hypot.default") == 3  # x, y; the transposed; the last
    assert len(vals) == 5 and len({id(v) for v in vals}) == 5
    assert [v.stride() for v in vals[:3]] == [(4, 1)] * 3
    assert vals[3].stride() == (1, 4) and vals[3].shape == (4, 3)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.inner(x)) + x


class _Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.block = _Block()
        self.tail = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tail(self.block(self.lin(self.lin(x))))


class _CountingLeafVote:
    """Records every leaf question; keeps ``block`` whole and traces into ``tail``."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    @fxsym.hookimpl
    def fxsym_leaf_module(self, module: nn.Module, qualname: str) -> bool | None:
        self.asked.append(qualname)
        return {"block": True, "tail": False}.get(qualname)


def test_leaf_question_asked_once_per_module_call() -> None:
    pm = fxsym.load_plugins()
    plugin = _CountingLeafVote()
    pm.register(plugin, name="counting-leaf-vote")
    try:
        sm = fxsym.analyze(_Shared(), example_inputs=(torch.randn(2, 6),))
    finally:
        pm.unregister(name="counting-leaf-vote")
    # lin is called twice, so asked twice; torch.fx asking again inside one call is not
    assert sorted(plugin.asked) == ["block", "lin", "lin", "tail"]
    modules = [n.target for n in sm.graph_module.graph.nodes if n.op == "call_module"]
    assert modules == ["lin", "lin", "block"]  # tail traced into: a linear function
    ops = [n.target for n in sm.graph_module.graph.nodes if n.op == "call_function"]
    assert torch.nn.functional.linear in ops


class _ClassAttribute(nn.Linear):
    parametrizations = nn.ModuleDict({"weight": nn.Identity()})


class _OwnGetattr(nn.Linear):
    def __getattr__(self, name: str) -> Any:
        if name == "parametrizations":
            return nn.ModuleDict({"weight": nn.Identity()})
        return super().__getattr__(name)


def _parametrized_cases() -> list[nn.Module]:
    from torch.nn.utils import parametrizations, parametrize

    weighted = parametrizations.weight_norm(nn.Linear(3, 4))
    plain = nn.Linear(3, 4)
    parametrize.register_parametrization(plain, "bias", nn.Identity())
    in_dict = nn.Linear(3, 4)
    object.__setattr__(in_dict, "parametrizations", nn.ModuleDict({"w": nn.Identity()}))
    empty = nn.Linear(3, 4)
    empty.parametrizations = nn.ModuleDict()  # registered as a submodule, and empty
    import copy

    import torchvision

    zoo = [*torchvision.models.mobilenet_v3_small().modules(),
           *torchvision.models.swin_t().modules()]
    return [weighted, copy.deepcopy(weighted), plain, in_dict, empty, _ClassAttribute(3, 4),
            _OwnGetattr(3, 4), nn.Conv2d(2, 2, 1), *zoo]


def test_parametrized_check_answers_what_torch_answers() -> None:
    from torch.nn.utils import parametrize

    from fxsym.tracer.tracer import _is_parametrized

    cases = _parametrized_cases()
    answers = [parametrize.is_parametrized(m) for m in cases]
    assert answers[:7] == [True, True, True, True, False, True, True]
    assert [_is_parametrized(m) for m in cases] == answers


def test_parametrized_module_is_still_traced_into() -> None:
    from torch.nn.utils import parametrizations

    model = nn.Sequential(parametrizations.weight_norm(nn.Linear(3, 4)), nn.ReLU())
    sm = fxsym.analyze(model, example_inputs=(torch.randn(2, 3),))
    assert any(e.kind == "traced-into" and e.where == "0" for e in sm.trace_report)


class _Writer(nn.Module):
    """A forward that rebinds an attribute to a traced value and appends one to a list."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.seen: list[Any] = []
        self.width = 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        self.seen.append(y)
        self.last = y.sum()
        return y


def test_written_state_found_once_per_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the forward wrote is looked for once per trace (it was twice: once for the
    derived state, once for the written nodes), and the look that passes over shadows
    holding what they were filled with still finds a container filled and an attribute set."""
    from fxsym.tracer.shadow import ShadowTree

    calls: list[int] = []
    original = ShadowTree.written

    def spy(self: ShadowTree) -> Any:
        calls.append(1)
        return original(self)

    monkeypatch.setattr(ShadowTree, "written", spy)
    model = _Writer()
    gm = fxsym.trace(model, example_inputs=(torch.randn(2, 4),))
    assert len(calls) == 1
    assert set(gm.derived_writes[""]) == {"seen", "last"}
    assert gm.derived_state[""] == {"seen": "derived", "last": "derived"}
    assert model.seen == [] and "last" not in vars(model)


def test_code_names_parsed_once_per_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name that is not an identifier (``0`` of every Sequential) is parsed once, not once
    per node of every trace; a name that does not read back is still refused every time."""
    import ast

    parsed: list[str] = []
    original = ast.literal_eval

    def spy(text: str) -> Any:
        parsed.append(text)
        return original(text)

    monkeypatch.setattr(ast, "literal_eval", spy)
    model = nn.Sequential()
    model.add_module("speed-path-name", nn.Linear(3, 3))
    model.add_module("speed-path-other", nn.Linear(3, 3))
    for _ in range(3):
        fxsym.trace(model, example_inputs=(torch.randn(2, 3),))
    assert parsed.count('"speed-path-name"') == 1
    bad = nn.Sequential()
    bad.add_module('say"hi', nn.Linear(3, 3))
    for _ in range(2):
        with pytest.raises(fxsym.TraceError, match="quote"):
            fxsym.trace(bad, example_inputs=(torch.randn(2, 3),))


def test_depth_positions_scanned_only_when_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan of every block's attributes for ints counting the blocks runs for a stack
    that reads such an attribute or becomes a depth group, not for one refused before."""
    from fxsym.analysis import residual_blocks

    scanned: list[nn.Module] = []
    original = residual_blocks._positions

    def spy(container: nn.Module) -> Any:
        scanned.append(container)
        return original(container)

    monkeypatch.setattr(residual_blocks, "_positions", spy)
    plain = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    sm = fxsym.analyze(plain, example_inputs=(torch.randn(2, 4),))
    assert scanned == [] and not sm.analysis.depth_groups
    assert any(e.kind == "depth" for e in sm.trace_report.entries)


def test_shadow_tree_freed_when_the_trace_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shadows are freed as the trace returns, not left for the cyclic collector (which
    then walked thousands of hook tables): torch.fx's tracer stays in a cycle of its own
    after its trace, and it no longer holds the tree."""
    import gc
    import weakref

    from fxsym.tracer import shadow

    trees: list[weakref.ref[Any]] = []
    original = shadow.ShadowTree.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        trees.append(weakref.ref(self))
        trees.append(weakref.ref(self.root))

    monkeypatch.setattr(shadow.ShadowTree, "__init__", spy)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3))
    enabled = gc.isenabled()
    gc.disable()
    try:
        sm = fxsym.analyze(model, example_inputs=(torch.randn(1, 3, 8, 8),))
        assert trees and all(ref() is None for ref in trees)
    finally:
        if enabled:
            gc.enable()
    assert [n.target for n in sm.graph.nodes if n.op == "call_module"] == ["0", "1", "2"]
    assert sm.graph_module.get_submodule("0") is model[0]


_OFFSET = torch.arange(4.0)  # a tensor the forward reads from a global: a tensor constant


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(4))
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.weight


class _Holder(nn.Module):
    """Leaves at several depths, a parameter read inside a module traced into, a
    non-persistent buffer and a tensor constant: everything a GraphModule holds."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.inner = _Inner()
        self.register_buffer("scale", torch.ones(4), persistent=False)
        self.register_buffer("shift", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block(x) * self.scale + self.shift + self.inner.weight
        return self.inner(x) + _OFFSET


def test_graph_module_built_without_torch_fx_attribute_copies(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The traced GraphModule holds what torch.fx's own build from the traced tree holds (the
    same names in the same order, buffers as persistent as they were, the user's modules and
    parameters), built without ``_copy_attr``'s walk through both trees (~10 us a target)."""
    import copy

    from torch.fx import graph_module

    copies: list[str] = []
    original = graph_module._copy_attr

    def spy(from_module: nn.Module, to_module: nn.Module, target: str) -> None:
        copies.append(target)
        original(from_module, to_module, target)

    monkeypatch.setattr(graph_module, "_copy_attr", spy)
    model = _Holder().eval()
    x = torch.randn(2, 4)
    analyzed = fxsym.analyze(model, example_inputs=(x,)).graph_module
    assert analyzed is not None
    for gm in (fxsym.trace(model, example_inputs=(x,)), analyzed):
        assert copies == []
        assert not gm.training
        twin = copy.deepcopy(model)  # torch's build, from a tree holding the constant too
        twin._tensor_constant0 = gm._tensor_constant0
        expected = torch.fx.GraphModule(twin, copy.deepcopy(gm.graph))
        copies.clear()
        assert [(n, type(m)) for n, m in gm.named_modules() if n] == [
            (n, type(m)) for n, m in expected.named_modules() if n]
        assert list(gm.state_dict()) == list(expected.state_dict())
        assert "scale" not in gm.state_dict() and "_tensor_constant0" in gm.state_dict()
        for name, mod in gm.named_modules():
            if name and type(mod) is not nn.Module:
                assert mod is model.get_submodule(name)
        assert gm.get_parameter("inner.weight") is model.inner.weight
        assert torch.equal(gm(x), model(x))


class _OwnForward(nn.Linear):
    """A Linear whose forward is its own: its family's SymInfo does not apply."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


def test_leaf_rule_of_a_class_looked_up_once_per_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the plugins' vote, what decides by class (the SymInfo registration, a registered
    base whose forward is overridden, torch.fx's rule) is looked up once per class in a trace,
    not once per module; each module still gets its own report line."""
    from fxsym.registry import Registry

    asked: list[type] = []
    original = Registry.shadowed_base

    def spy(self: Registry, cls: type) -> Any:
        asked.append(cls)
        return original(self, cls)

    monkeypatch.setattr(Registry, "shadowed_base", spy)
    fxsym.load_plugins()
    model = nn.Sequential(nn.Linear(4, 4), _OwnForward(4, 4), _OwnForward(4, 4), nn.Linear(4, 2))
    gm = fxsym.trace(model, example_inputs=(torch.randn(2, 4),))
    assert asked.count(_OwnForward) == 1
    lines = [e.where for e in gm.trace_report.entries if e.kind == "traced-into"]
    assert lines == ["1", "2"]
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["0", "3"]
    assert torch.equal(gm(torch.ones(2, 4)), model(torch.ones(2, 4)))


def test_split_groups_read_from_a_table_kept_until_the_next_split_or_union() -> None:
    """``GroupTable.resolve`` reads a split group's units as its blocks (blocks of blocks
    included) from a table it fills on first use (ShuffleNet resolves tens of thousands of
    dims of a few split groups: recursing every time was a third of its analysis); a split
    or a union, which change what the blocks are, empty it."""
    from fxsym.analysis.groups import GroupTable
    from fxsym.analysis.layout import Seg

    table = GroupTable()
    g, other = table.new(8), table.new(2)
    dim = (Seg(g, 8, 3),)
    assert table.resolve(dim) == dim
    a, b = table.split(g, [6, 2])
    assert table.resolve(dim) == (Seg(a, 6, 3), Seg(b, 2, 3))
    assert table._blocks
    a0, a1 = table.split(a, [2, 4])
    assert not table._blocks
    assert table.resolve(dim) == (Seg(a0, 2, 3), Seg(a1, 4, 3), Seg(b, 2, 3))
    assert table.resolve((Seg(g, 4, 6),)) == (Seg(a0, 1, 6), Seg(a1, 2, 6), Seg(b, 1, 6))
    table.union(other, b)
    assert not table._blocks
    assert table.resolve(dim)[-1] == Seg(b, 2, 3) and table.find(b) == table.find(other)
