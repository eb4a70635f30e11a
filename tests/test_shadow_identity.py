"""The program the trace sees is the program the model runs (issue 30, section 4).

The tracer runs a shadow of the module tree (``fxsym/tracer/shadow.py``). A forward that
asks *which* module it is — ``self in REGISTRY`` (a WeakSet), ``id(self) in TABLE``, a dict
keyed by modules, ``self == other`` — gets the answer the user's module gets: while the trace
runs, a shadow hashes, compares equal and has the ``id`` of the module it stands for
(:mod:`fxsym.tracer.identity`). What cannot be answered so (``self is OTHER`` with ``OTHER``
the user's module reached through a global or a closure) is refused, as is any call that
reaches the user's module itself (a lambda or ``functools.partial`` the tree cannot redirect):
tracing it would run, and write into, the user's model (:mod:`fxsym.tracer.escapes`).

Each test: a tiny module, traced and compared with eager (float64), or a clear TraceError;
and the model bit for bit as it was (state_dict, ``__dict__``, hooks).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import pytest
import torch
from torch import nn

import fxsym
from fxsym.oracles import check_permutation, check_values

X = torch.randn(2, 6, dtype=torch.float64)


class Pair(nn.Module):
    """Two linears; ``special(y)`` decides whether the hidden channels are rolled between
    them (a branch the analysis must see: rolled, the hidden group is not sortable)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(8, 3)

    def special(self) -> bool:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        if self.special():
            y = y.roll(1, -1)
        return self.b(y)


def _snapshot(model: nn.Module) -> list[Any]:
    """What must not change: every module's ``__dict__`` entries (containers by content,
    the rest by identity), its state_dict's values and its hooks."""
    out: list[Any] = []
    for name, mod in model.named_modules():
        state = {}
        for key, value in vars(mod).items():
            if isinstance(value, (list, dict)) and not isinstance(value, nn.Module):
                state[key] = (id(value), repr(value))
            else:
                state[key] = id(value)
        out.append((name, state))
    out.append({k: v.clone() for k, v in model.state_dict().items()})
    return out


def _same(before: list[Any], after: list[Any]) -> bool:
    if before[:-1] != after[:-1]:
        return False
    return all(torch.equal(before[-1][k], after[-1][k]) for k in before[-1])


def _traced_equals_eager(model: nn.Module) -> fxsym.SymMap:
    """The traced program computes what the model computes, the model is untouched, and
    the groups pass the permutation and value oracles."""
    eager = model(X)
    before = _snapshot(model)
    gm = fxsym.trace(model, example_inputs=(X,))
    sm = fxsym.analyze(model, example_inputs=(X,))
    assert _same(before, _snapshot(model))
    assert torch.allclose(gm(X), eager, atol=1e-12)
    return sm


# -- identity ----------------------------------------------------------------------------

REGISTRY: weakref.WeakSet[nn.Module] = weakref.WeakSet()
TABLE: set[int] = set()
BY_MODULE: dict[nn.Module, bool] = {}


class InWeakSet(Pair):
    def special(self) -> bool:
        return self in REGISTRY


class IdInTable(Pair):
    def special(self) -> bool:
        return id(self.a) in TABLE


class KeyedByModule(Pair):
    def special(self) -> bool:
        return BY_MODULE.get(self.a, False)


class EqualsChild(Pair):
    """``==`` between modules the tree holds, one of them reached through a list."""

    def __init__(self) -> None:
        super().__init__()
        self.chosen = [self.a]

    def special(self) -> bool:
        return bool(self.chosen[0] == self.a) and self.a in REGISTRY


@pytest.mark.parametrize("cls", [InWeakSet, IdInTable, KeyedByModule])
def test_a_branch_on_which_module_it_is_takes_the_eager_branch(cls: type[Pair]) -> None:
    """``self in WeakSet``, ``id(child) in table``, ``dict[child]``: the trace takes the
    branch the model takes (on main the shadow was in none of them: the roll was not
    traced, the hidden group stayed sortable and permuting it changed the output)."""
    model = cls().double().eval()
    REGISTRY.add(model)
    TABLE.add(id(model.a))
    BY_MODULE[model.a] = True
    try:
        sm = _traced_equals_eager(model)
        assert check_permutation(model, sm, (X,), seeds=(0,)).status != "failed"
    finally:
        REGISTRY.discard(model)
        TABLE.discard(id(model.a))
        BY_MODULE.pop(model.a, None)


@pytest.mark.parametrize("cls", [InWeakSet, IdInTable, KeyedByModule])
def test_a_module_not_registered_takes_the_other_branch(cls: type[Pair]) -> None:
    """The same classes, not registered: the hidden group is sortable and the trace has no
    roll (identity is kept, not answered "yes" for every module)."""
    model = cls().double().eval()
    gm = fxsym.trace(model, example_inputs=(X,))
    assert "roll" not in gm.code
    assert torch.allclose(gm(X), model(X), atol=1e-12)
    sm = fxsym.analyze(model, example_inputs=(X,))
    assert any(g.is_sortable and g.size == 8 for g in sm.groups())


def test_modules_compared_with_equals_compare_as_the_users() -> None:
    """``self.chosen[0] == self.a`` (both the tree's: shadows on either side) and a WeakSet
    lookup together: the trace rolls as the model does."""
    model = EqualsChild().double().eval()
    REGISTRY.add(model.a)
    try:
        gm = fxsym.trace(model, example_inputs=(X,))
        assert "roll" in gm.code
        assert torch.allclose(gm(X), model(X), atol=1e-12)
    finally:
        REGISTRY.discard(model.a)


OTHER: list[nn.Module] = []


class IsGlobal(Pair):
    def special(self) -> bool:
        return self.a is OTHER[0]


def test_is_against_the_users_module_through_a_global_is_refused() -> None:
    """``self.a is OTHER[0]`` with ``OTHER[0]`` the user's module: no shadow can be the
    user's object, so the trace cannot take the model's branch; it is refused, naming the
    module, instead of giving the unrolled graph (on main: a sortable group, permuting it
    changed the output)."""
    model = IsGlobal().double().eval()
    OTHER[:] = [model.a]
    try:
        with pytest.raises(fxsym.TraceError, match="the user's module"):
            fxsym.analyze(model, example_inputs=(X,))
    finally:
        OTHER.clear()


class IsAttribute(Pair):
    """``is`` between modules the tree holds (an attribute and a list entry)."""

    def __init__(self) -> None:
        super().__init__()
        self.others = [self.a]

    def special(self) -> bool:
        return self.others[0] is self.a


class HeldInASet(Pair):
    """A set and a dict of the module's own keyed by its child: looked up and iterated."""

    def __init__(self) -> None:
        super().__init__()
        self.rolled = {self.a}
        self.scales = {self.a: 2.0}

    def special(self) -> bool:
        return self.a in self.rolled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        for mod, scale in self.scales.items():
            y = y + scale * self.b(mod(x))
        return y


def test_a_set_and_a_dict_keyed_by_a_child_find_it() -> None:
    """``self.a in self.rolled`` finds the child and iterating ``self.scales`` calls it (its
    traced copy, not the user's): the trace equals the model."""
    model = HeldInASet().double().eval()
    gm = fxsym.trace(model, example_inputs=(X,))
    assert "roll" in gm.code
    torch.testing.assert_close(gm(X), model(X))


def test_is_between_modules_the_tree_holds_is_the_models_answer() -> None:
    """Both sides are shadows of the same module: the trace rolls as the model does."""
    model = IsAttribute().double().eval()
    gm = fxsym.trace(model, example_inputs=(X,))
    assert "roll" in gm.code
    torch.testing.assert_close(gm(X), model(X))


# -- closures -------------------------------------------------------------------------------


class Logged(nn.Module):
    """A linear that logs its calls into its own list."""

    def __init__(self, i: int, o: int) -> None:
        super().__init__()
        self.lin = nn.Linear(i, o)
        self.log: list[str] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append("called")
        return self.lin(x)


class ThroughLambda(nn.Module):
    """A child called through a lambda closing over it, kept in a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Logged(6, 8)
        self.b = nn.Linear(8, 3)
        child = self.a
        self.fns = {"a": lambda t: child(t)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.fns["a"](x)))


class ThroughPartial(nn.Module):
    """A child's forward kept as ``functools.partial(child.forward)`` in an attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Logged(6, 8)
        self.b = nn.Linear(8, 3)
        self.call_a = functools.partial(self.a.forward)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.call_a(x)))


class ThroughKeyword(nn.Module):
    """A child passed to a function as a keyword of a partial."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Logged(6, 8)
        self.b = nn.Linear(8, 3)
        self.run = functools.partial(_apply, mod=self.a)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.run(x)))


def _apply(x: torch.Tensor, mod: nn.Module) -> torch.Tensor:
    return mod(x)


class ThroughWeakref(nn.Module):
    """A child called through a weak reference the module keeps."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Logged(6, 8)
        self.b = nn.Linear(8, 3)
        self.ref = weakref.ref(self.a)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        child = self.ref()
        assert child is not None
        return self.b(torch.relu(child(x)))


@pytest.mark.parametrize("cls", [ThroughLambda, ThroughPartial, ThroughKeyword, ThroughWeakref])
def test_a_child_called_through_a_closure_runs_in_the_trace_not_in_the_model(
        cls: type[nn.Module]) -> None:
    """The lambda, the partial of ``child.forward`` and the partial's keyword reach the
    traced copy of the child: its ``self.log.append`` lands in the copy; the model's log is
    empty after analyze (on main: ``['called', ...]``), the traced program equals the model,
    and the groups pass the value oracle (not for the lambda: a deep copy of the model, which
    the oracle runs, shares the lambda and the weak reference, which reach the model's child,
    not the copy's)."""
    model = cls().double().eval()
    sm = _traced_equals_eager(model)
    model.a.log.clear()  # the eager calls of the comparison above
    fxsym.analyze(model, example_inputs=(X,))
    assert model.a.log == []
    if cls not in (ThroughLambda, ThroughWeakref):
        assert check_values(model, sm, (X,)).status != "failed"


GLOBAL: list[nn.Module] = []


class ThroughGlobal(nn.Module):
    """A child called through a global list: nothing the tree holds can be redirected."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Logged(6, 8)
        self.b = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(GLOBAL[0](x))


class ForwardThroughGlobal(ThroughGlobal):
    """The child's ``forward`` called directly (no ``__call__``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(GLOBAL[0].forward(x))


@pytest.mark.parametrize("cls", [ThroughGlobal, ForwardThroughGlobal])
def test_a_call_reaching_the_users_module_is_refused(cls: type[ThroughGlobal]) -> None:
    """A call that reaches the user's module during the trace (through a global) is
    refused with a TraceError naming it, and the model is as it was: no log line, same
    state (on main the child ran: its log said 'called')."""
    model = cls().double().eval()
    GLOBAL[:] = [model.a]
    try:
        before = _snapshot(model)
        with pytest.raises(fxsym.TraceError, match=r"the user's module a\b"):
            fxsym.analyze(model, example_inputs=(X,))
        assert model.a.log == []
        assert _same(before, _snapshot(model))
    finally:
        GLOBAL.clear()


def test_nothing_installed_for_the_trace_stays_after_it() -> None:
    """``builtins.id`` and the ``__hash__``/``__eq__``/``__getattr__`` set on the traced
    classes for the trace are put back after a trace, and after a refused one."""
    import builtins

    real_id = builtins.id
    classes = (InWeakSet, Pair, nn.Linear, nn.Module, ThroughGlobal, Logged)
    before = [(cls, {k: vars(cls).get(k) for k in ("__hash__", "__eq__", "__getattr__")})
              for cls in classes]
    fxsym.analyze(InWeakSet().double().eval(), example_inputs=(X,))
    model = ThroughGlobal().double().eval()
    GLOBAL[:] = [model.a]
    try:
        with pytest.raises(fxsym.TraceError):
            fxsym.analyze(model, example_inputs=(X,))
    finally:
        GLOBAL.clear()
    assert builtins.id is real_id
    assert before == [(cls, {k: vars(cls).get(k) for k in ("__hash__", "__eq__", "__getattr__")})
                      for cls in classes]
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    assert first != second and hash(first) != hash(second) and len({first, second}) == 2
