"""The analysis' shortcuts give what the long ways gave: submodules by path with each prefix
looked up once (:class:`fxsym.analysis.submodules.Submodules` against ``get_submodule``), and
the cycle check of ``Symbol.link_to`` skipped for a symbol linked to nothing."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
import torch
import torchvision
from torch import nn

import fxsym
from fxsym import Symbol
from fxsym.analysis.submodules import Submodules


class _Shared(nn.Module):
    """One block under two paths, a plain attribute, an attribute holding a non-module."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.alias = self.block
        self.deep = nn.ModuleDict({"a": nn.Sequential(self.block, nn.Linear(4, 2))})
        self.size = 4
        self.table: dict[str, Any] = {"x": nn.Linear(2, 2)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.deep["a"](self.alias(x))


def _paths(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_modules(remove_duplicate=False)]


@pytest.mark.parametrize("build", [
    _Shared,
    lambda: copy.deepcopy(_Shared()),
    lambda: torchvision.models.mobilenet_v3_small(),
])
def test_submodules_find_what_get_submodule_finds(build: Any) -> None:
    model = build()
    lookup = Submodules(model)
    for path in _paths(model) + list(reversed(_paths(model))):  # each twice, other order
        assert lookup(path) is model.get_submodule(path)


@pytest.mark.parametrize("path", ["nothing", "block.9", "size", "table", "table.x", "block..0",
                                  "alias.0.weight"])
def test_submodules_refuse_what_get_submodule_refuses(path: str) -> None:
    model = _Shared()
    with pytest.raises(AttributeError):
        model.get_submodule(path)
    lookup = Submodules(model)
    lookup("block.0")  # a prefix known already changes nothing
    with pytest.raises(AttributeError):
        lookup(path)


def test_submodules_in_another_thread() -> None:
    model = torchvision.models.mobilenet_v3_small()
    found: list[bool] = []

    def run() -> None:
        lookup = Submodules(model)
        found.append(all(lookup(p) is model.get_submodule(p) for p in _paths(model)))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert found == [True]


def test_analysis_of_a_model_with_aliased_blocks_is_repeatable() -> None:
    model = _Shared().eval()
    x = torch.randn(3, 4)
    first = fxsym.analyze(model, example_inputs=(x,))
    again = fxsym.analyze(model, example_inputs=(x,))
    clone = fxsym.analyze(copy.deepcopy(model), example_inputs=(x,))
    shape = [(g.name, g.size, g.members) for g in first.groups()]
    assert shape == [(g.name, g.size, g.members) for g in again.groups()]
    assert shape == [(g.name, g.size, g.members) for g in clone.groups()]
    assert [str(e) for e in first.trace_report] == [str(e) for e in clone.trace_report]


def test_link_to_a_lone_symbol_and_cycles_through_followers() -> None:
    head = Symbol(is_searchable=True)
    lone = [Symbol() for _ in range(5)]
    for sym in lone:
        sym.link_to(head)
    assert head.dependencies == lone and all(s.parent is head for s in lone)
    other = Symbol(is_searchable=True)  # searchable, with a follower: the full check runs
    follower = Symbol()
    follower.link_to(other)
    with pytest.raises(ValueError, match="cycle"):
        other.link_to(follower)
    other.link_to(head)
    assert other.parent is head and follower.parent is other


class _OwnParameters(nn.Linear):
    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        yield from super().named_parameters(*args, **kwargs)
        yield "extra", self.weight


def test_tensors_of_a_leaf_listed_as_torch_lists_them() -> None:
    from fxsym.analysis.shared import _named_tensors

    bn = nn.BatchNorm2d(3)
    no_bias = nn.Conv2d(2, 3, 1, bias=False)
    cases = [bn, no_bias, nn.Linear(2, 2), _OwnParameters(2, 2), nn.Sequential(bn, no_bias),
             *torchvision.models.mobilenet_v3_small().modules()]
    for mod in cases:
        expected = [*mod.named_parameters(remove_duplicate=False),
                    *mod.named_buffers(remove_duplicate=False)]
        found = list(_named_tensors(mod))
        assert [n for n, _ in found] == [n for n, _ in expected]
        assert all(a is b for (_, a), (_, b) in zip(found, expected, strict=True))
