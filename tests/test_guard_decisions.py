"""Guards and derived state return their decisions; the analyzer applies them (issue 32 §3).

:func:`fxsym.analysis.guards.decide` reads the layouts and the group table and returns a
:class:`~fxsym.analysis.guards.Pin`, :class:`~fxsym.analysis.guards.Unify`,
:class:`~fxsym.analysis.guards.TieSizes`, :class:`~fxsym.analysis.guards.EachPair` or
``None``; it writes nothing. Neither ``guards`` nor ``derived`` imports the analyzer (the
``analyzer`` <-> ``guards`` cycle is gone). :func:`fxsym.analysis.shared.tie_shared_tensors`
ties groups through the op-rule context, as a rule does, and returns the symbol dims and
members it found (:class:`~fxsym.analysis.shared.SharedMembers`) for the analyzer to record.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import fxsym
from fxsym.analysis import analyzer as analyzer_module
from fxsym.analysis import guards
from fxsym.analysis.groups import GroupTable
from fxsym.oracles import check_permutation, check_shrink

X = torch.randn(2, 3, 6, 6)


class Guarded(nn.Module):
    """Three guards: equal shapes of two groups (decided entry by entry: their sizes tied),
    a size compared with an attribute (tied: the attribute follows the group), a size's
    parity (pins ``c``'s group)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(3, 8, 1)
        self.c = nn.Conv2d(3, 6, 1)
        self.d = nn.Conv2d(3, 5, 1)
        self.ch = 5
        self.out = nn.Conv2d(27, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, z, w, v = self.a(x), self.b(x), self.c(x), self.d(x)
        if y.shape == z.shape:
            y = y * 2
        if w.shape[1] % 2 == 0:
            w = -w
        if v.shape[1] == self.ch:
            v = v + 1
        return self.out(torch.cat([y, z, w, v], 1))


def _state(table: GroupTable) -> dict[str, Any]:
    """The table's groups as data (each group's root, not the path-compressed parents)."""
    fields = ("units", "reasons", "producers", "children", "blocks", "routed", "least")
    state = {f: copy.deepcopy(getattr(table, f)) for f in fields}
    state["roots"] = [table.find(g) for g in range(len(table.parent))]
    state["same"] = [table.same_size(g) for g in range(len(table.parent))]
    return state


def test_decide_writes_nothing_and_the_analyzer_applies_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every decision leaves the table and layouts as they were; the analyzer applying them
    gives the analysis of before: ``a``/``b`` same-size, ``c`` pinned with a guard line,
    ``d`` searchable with ``ch`` a member; traced == eager, both oracles pass."""
    decided: list[guards.Decision] = []

    def spy(guard: Any, env: Any, table: GroupTable) -> guards.Decision:
        before, layouts = _state(table), dict(env)
        decision = guards.decide(guard, env, table)
        assert _state(table) == before and dict(env) == layouts
        decided.append(decision)
        return decision

    monkeypatch.setattr(analyzer_module, "decide", spy)
    torch.manual_seed(0)
    model = Guarded().eval()
    sm = fxsym.analyze(model, example_inputs=(X,))
    with torch.no_grad():
        torch.testing.assert_close(sm.graph_module(X), model(X))
    kinds = {type(d).__name__ for d in decided}
    assert {"EachPair", "Pin", "Unify"} <= kinds, kinds
    members = {m: g for g in sm.groups() for m in g.members}
    ga, gb = members[("a", "out_channels")], members[("b", "out_channels")]
    assert ga is not gb and gb.name in ga.same_size
    assert ("c", "out_channels") not in members
    assert any("c" in e.where or "%" in e.message for e in sm.trace_report.of_kind("guard"))
    assert ("", "attr:ch") in members[("d", "out_channels")].members
    assert check_permutation(model, sm, (X,)).ok
    assert check_shrink(model, sm, (X,)).ok


def test_guards_and_derived_do_not_import_the_analyzer() -> None:
    """Not even for annotations: they read what they are given (layouts, the table)."""
    root = Path(guards.__file__).parent
    for name in ("guards.py", "derived.py"):
        tree = ast.parse((root / name).read_text(encoding="utf-8"))
        imported = {node.module for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.module}
        assert not any(m.endswith("analyzer") for m in imported), (name, imported)


class HeldAndRead(nn.Module):
    """``shared`` is never called but holds ``enc``'s weight (its symbols join the groups of
    the dims they size); ``qkv``'s weight is read, never called (its size attributes follow
    the tensor as attribute members)."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Embedding(10, 8)
        self.enc = nn.Embedding(10, 8)
        self.enc.weight = self.shared.weight
        self.qkv = nn.Linear(8, 12, bias=False)
        self.head = nn.Linear(12, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.enc(ids)
        return self.head(torch.relu(torch.nn.functional.linear(h, self.qkv.weight)))


def test_shared_tensors_return_what_they_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`~fxsym.analysis.shared.tie_shared_tensors` leaves the analyzer's symbol dims and
    members as they were and returns the ones it found (``shared``'s embedding dim, ``qkv``'s
    size attributes), which the analyzer records: they are members of the groups, and a
    resize keeps ``shared`` and ``qkv`` consistent with their tensors."""
    from fxsym.analysis import shared

    found: list[shared.SharedMembers] = []

    def spy(an: Any) -> shared.SharedMembers:
        before = (dict(an.symbol_dims), set(an.param_members))
        members = shared.tie_shared_tensors(an)
        assert (dict(an.symbol_dims), set(an.param_members)) == before
        found.append(members)
        return members

    monkeypatch.setattr(analyzer_module, "tie_shared_tensors", spy)
    torch.manual_seed(0)
    model = HeldAndRead().double().eval()
    ids = torch.randint(0, 10, (2, 5))
    sm = fxsym.analyze(model, example_inputs=(ids,))
    with torch.no_grad():
        torch.testing.assert_close(sm.graph_module(ids), model(ids))
    members = found[-1]
    assert ("shared", "embedding_dim") in members.symbol_dims
    assert {("qkv", "attr:in_features"), ("qkv", "attr:out_features")} <= members.param_members
    every = {m for g in sm.groups() for m in g.members}
    assert set(members.symbol_dims) <= every
    assert check_permutation(model, sm, (ids,)).ok
    fxsym.resize(model, sm, {g.name: g.size // 2 for g in sm.groups()})
    assert model.shared.embedding_dim == model.shared.weight.shape[1] == 4
    assert model.qkv.out_features == model.qkv.weight.shape[0] == 6
    assert model(ids).shape == (2, 5, 3)
