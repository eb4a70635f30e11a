"""The public SymMap/Symbol API the analysis, the resize engine and the oracles work through."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fxsym
from fxsym.plugins import get_plugin_manager
from fxsym.registry import Registry, SymInfoEntry, get_registry
from fxsym.symbols import GroupAnalysis, Symbol
from fxsym.tracer.report import TraceReport


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()


X = (torch.randn(2, 4),)


def test_a_fresh_symmap_has_no_analysis() -> None:
    sm = fxsym.SymMap(_model())
    assert sm.analysis is None and sm.groups() == []
    assert not sm.trace_report.entries and sm.graph_module is None and sm.output_contract is None
    assert not sm.is_stale
    assert sm.registry is get_registry()


def test_analyze_attaches_its_result() -> None:
    model = _model()
    sm = fxsym.analyze(model, example_inputs=X)
    analysis = sm.analysis
    assert isinstance(analysis, GroupAnalysis)
    assert list(analysis.groups) == sm.groups() and [g.name for g in sm.groups()] == [
        "0.out_features"]
    [group] = sm.groups()
    assert analysis.table.find(group.id) == group.id and analysis.table.reason(group.id) is None
    assert analysis.producers[group.id] == (("0", "out_features"),)
    assert {("0", "out_features"), ("2", "in_features")} <= set(analysis.symbol_dims)
    assert not analysis.param_members
    assert isinstance(sm.trace_report, TraceReport)
    assert isinstance(sm.graph_module, torch.fx.GraphModule)


def test_names_and_sym_infos() -> None:
    model = _model()
    sm = fxsym.analyze(model, example_inputs=X)
    assert sm.name_of(model[2]) == "2"
    assert set(sm.sym_info(model[2]).symbols) == set(sm[model[2]])
    outside = nn.Linear(2, 2)  # not a module of the model
    with pytest.raises(KeyError):
        sm.name_of(outside)
    with pytest.raises(KeyError):
        sm.sym_info(outside)


def test_resize_marks_the_symmap_stale() -> None:
    model = _model()
    sm = fxsym.analyze(model, example_inputs=X)
    fxsym.resize(model, sm, {"0.out_features": 5})
    assert sm.is_stale
    with pytest.raises(fxsym.ResizeError, match="analyze again"):
        fxsym.resize(model, sm, {"0.out_features": 4})
    other = fxsym.analyze(model, example_inputs=X)
    other.mark_stale()
    assert other.is_stale


def test_resize_looks_up_rules_in_the_symmaps_registry() -> None:
    model = _model()
    sm = fxsym.analyze(model, example_inputs=X)
    looked_up: list[type] = []

    class Recording(Registry):
        def sym_info_entry(self, cls: type) -> SymInfoEntry | None:
            looked_up.append(cls)
            return get_registry().sym_info_entry(cls)

    sm.registry = Recording(get_plugin_manager())
    fxsym.resize(model, sm, {"0.out_features": 5})
    assert nn.Linear in looked_up
    assert model[0].out_features == 5 and model[2].in_features == 5


def test_a_deep_copy_shares_the_registry() -> None:
    sm = fxsym.analyze(_model(), example_inputs=X)
    clone = copy.deepcopy(sm)
    assert clone.registry is sm.registry
    assert clone.model is not sm.model and [g.name for g in clone.groups()] == [
        g.name for g in sm.groups()]


def test_make_searchable() -> None:
    free = Symbol()
    free.make_searchable()
    assert free.is_searchable
    constant = Symbol()
    constant.disable()
    with pytest.raises(ValueError, match="made searchable"):
        constant.make_searchable()
    follower = Symbol()
    follower.link_to(free)
    with pytest.raises(ValueError, match="made searchable"):
        follower.make_searchable()


def test_is_sortable_itself_ignores_linked_symbols() -> None:
    head, follower = Symbol(), Symbol(is_sortable=False)
    follower.link_to(head)
    assert not head.is_sortable and head.is_sortable_itself
    assert not follower.is_sortable_itself
