"""The seed API of Symbol, SymInfo and SymMap."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fxsym
from fxsym import Symbol, SymInfo, SymMap

IN, OUT = Symbol.CLType.INCOMING, Symbol.CLType.OUTGOING


def test_symbol_states_and_cross_layer_flags() -> None:
    s = Symbol(cl_type=OUT, elastic_dims={1, -3})
    assert s.is_free and s.is_dangling and s.is_cross_layer and s.is_outgoing
    assert not (s.is_searchable or s.is_dynamic or s.is_constant or s.is_incoming)
    assert s.elastic_dims == {1, -3}
    t = Symbol(is_searchable=True)
    assert t.is_searchable and not t.is_free and not t.is_cross_layer and not t.is_dangling
    with pytest.raises(ValueError):
        Symbol(cl_type=IN)  # cross-layer without elastic dims
    with pytest.raises(ValueError):
        Symbol(elastic_dims={1})  # elastic dims without cross-layer type


def test_link_to_makes_dynamic_and_rejects_cycles() -> None:
    root, child, grandchild = Symbol(is_searchable=True), Symbol(), Symbol()
    child.link_to(root)
    grandchild.link_to(child)
    assert child.is_dynamic and child.parent is root and root.dependencies == [child]
    assert not child.is_free
    with pytest.raises(ValueError):
        root.link_to(grandchild)
    with pytest.raises(ValueError):
        child.link_to(root)  # already dynamic


def test_disable_makes_whole_dependency_tree_constant() -> None:
    root, a, b = Symbol(is_searchable=True), Symbol(), Symbol()
    a.link_to(root)
    b.link_to(a)
    b.disable()
    for s in (root, a, b):
        assert s.is_constant and not s.is_searchable and not s.is_dynamic and not s.is_free
        assert not s.is_sortable
    assert root.dependencies == [] and a.parent is None


def test_sortable_covers_the_tree() -> None:
    root, child = Symbol(is_searchable=True), Symbol(is_sortable=False)
    child.link_to(root)
    assert not root.is_sortable
    child.is_sortable = True
    assert root.is_sortable


class _Thing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


def _thing_info(mod: nn.Module) -> SymInfo:
    return SymInfo(is_shape_preserving=True, n=Symbol(cl_type=IN, elastic_dims={-1}),
                   k=Symbol(is_searchable=True))


def test_register_decorator_and_unregister() -> None:
    decorated = SymMap.register(_Thing)(_thing_info)
    assert decorated is _thing_info
    try:
        model = nn.Sequential(nn.Linear(3, 4), _Thing())
        sm = SymMap(model)
        assert model[1] in sm and sm.is_shape_preserving(model[1])
        assert set(sm[model[1]]) == {"n", "k"}
    finally:
        SymMap.unregister(_Thing)
    assert model[1] not in SymMap(model)
    with pytest.raises(KeyError):
        SymMap.unregister(_Thing)


def test_named_symbols_filters_prune_and_accessors() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))
    sm = fxsym.analyze(model, example_inputs=(torch.randn(1, 3, 9, 9),))
    names = dict(sm.named_symbols())
    assert set(names) == {"0.in_channels", "0.out_channels", "1.num_features",
                          "3.in_channels", "3.out_channels"}
    assert [n for n, _ in sm.named_symbols(searchable=True)] == ["0.out_channels"]
    assert {n for n, _ in sm.named_symbols(dynamic=True)} == {"1.num_features", "3.in_channels"}
    # the input channels and the output channels touch the graph's input/output
    assert {n for n, _ in sm.named_symbols(constant=True)} == {"0.in_channels", "3.out_channels"}
    assert {n for n, _ in sm.named_symbols(constant=False)} == {
        "0.out_channels", "1.num_features", "3.in_channels"}
    assert [n for n, _ in sm.named_symbols(key=model[3])] == ["in_channels", "out_channels"]
    assert sm.get_symbol(model[1], "num_features").parent is sm.get_symbol(model[0], "out_channels")
    new = Symbol()
    sm.set_symbol(model[1], "extra", new)
    assert sm[model[1]]["extra"] is new
    assert [n for n, _ in sm.named_modules()] == ["0", "1", "2", "3"]
    assert dict(sm.named_sym_dicts())["1"]["extra"] is new
    assert sm.pop(model[2]) == {}
    model2 = nn.Sequential(nn.Linear(2, 2))
    sm2 = fxsym.analyze(model2, example_inputs=(torch.randn(1, 2),))
    assert len(sm2) == 1
    sm2.prune()  # both symbols constant: input and output of the model
    assert len(sm2) == 0 and not sm2


def test_add_sym_info_by_hand() -> None:
    model = nn.Sequential(nn.Linear(2, 2), _Thing())
    sm = SymMap(model)
    sm.add_sym_info(model[1], _thing_info(model[1]))
    assert "1" in dict(sm.named_sym_dicts())
    with pytest.raises(ValueError):
        sm.add_sym_info(nn.Linear(1, 1), SymInfo())


def test_register_takes_resize_and_importance_like_the_plugin_hook() -> None:
    class Gate(nn.Module):  # one learned weight per feature, owned by this application
        def __init__(self, n: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.arange(1.0, n + 1))
            self.n = n

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.weight

    def resize_gate(mod: nn.Module, name: str, index: torch.Tensor) -> None:
        mod.weight = nn.Parameter(mod.weight.detach()[index])
        mod.n = len(index)

    def info(mod: nn.Module) -> SymInfo:
        return SymInfo(is_shape_preserving=True, n=Symbol(cl_type=IN, elastic_dims={-1}))

    SymMap.register(Gate, resize=resize_gate, importance=lambda m, s: m.weight.abs())(info)
    try:
        model = nn.Sequential(nn.Linear(3, 6), Gate(6), nn.Linear(6, 2))
        sm = fxsym.analyze(model, example_inputs=(torch.randn(2, 3),))
        group = sm.group("0.out_features")
        assert ("1", "n") in group.members
        fxsym.resize(model, sm, {"0.out_features": [5, 1, 3]})
        assert model[1].n == 3 and model[1].weight.tolist() == [6.0, 2.0, 4.0]
        assert model(torch.randn(2, 3)).shape == (2, 2)
    finally:
        SymMap.unregister(Gate)
