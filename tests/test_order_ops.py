"""Order-dependent ops (issue 9): an op whose result depends on the order, or the number, of
the entries along an elastic dim pins that dim, with a reason in the trace report; the dims
it does not work along keep their groups; value reductions leave groups searchable.

Every case runs one op inside :class:`Probe`, where ``h`` has two elastic dims of 8 entries:
dim 1 (group ``a.out_features``, "A") and dim 2 (group ``b.out_features``, "B"). Each case
returns a ``(N, 8)`` tensor whose last dim is B unless the op pinned it; where a result
keeps dim 1, ``_mixed`` feeds it through a Linear, so a wrongly kept group would be tied to
that Linear and the permutation oracle would catch the reordering.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_oracles
from torch import nn

import fxsym
from fxsym.oracles import check_permutation

A, B = ("a", "out_features"), ("b", "out_features")
MIX = ("mix", "weight:1")  # the Linear used functionally: a parameter member
SHAPES = ((2, 6), (3, 6))
SEEDS = range(5)


class Probe(nn.Module):
    def __init__(self, op: Callable[[Probe, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.op = op
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(6, 8)
        self.mix = nn.Linear(8, 8)
        self.c = nn.Linear(8, 3)
        self.d = nn.Linear(3, 6)  # d.out_features: always searchable, so the oracles check
        self.e = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)[:, :, None] * self.b(x)[:, None, :]  # (N, 8 of A, 8 of B)
        y = self.op(self, h).float()
        return self.e(torch.relu(self.d(self.c(y))))


def _mixed(m: Probe, y: torch.Tensor) -> torch.Tensor:
    """A result that keeps dims 1 and 2: dim 1 goes through ``m.mix``, then ends. (The
    functional form keeps the leading dims' groups, which the Linear module pins.)"""
    return F.linear(y.float().transpose(1, 2), m.mix.weight, m.mix.bias).mean(-1)


def _rows(m: Probe, y: torch.Tensor) -> torch.Tensor:
    """A result that keeps dim 1 (A) and ends dim 2: dim 1 goes through ``m.mix``."""
    return F.linear(y.float().transpose(1, 2), m.mix.weight, m.mix.bias).mean(1)


def _signs(h: torch.Tensor) -> torch.Tensor:
    """Positions along dim 1 that do not come from its order: 0 or 1 per column of B."""
    return (h.sum(1, keepdim=True) > 0).long()


def _values_only(m: Probe, h: torch.Tensor) -> torch.Tensor:
    values, _ = h.max(1)  # unpacked, indices unused
    return values


# (id, op, groups pinned, words of the reason) — the op works along dim 1 unless said
PINNED: list[tuple[str, Callable[[Probe, torch.Tensor], torch.Tensor], set, str]] = [
    ("argmax", lambda m, h: h.argmax(1), {A}, "argmax returns positions"),
    ("argmin-keepdim", lambda m, h: h.argmin(dim=1, keepdim=True).squeeze(1), {A},
     "argmin returns positions"),
    ("argmax-flat", lambda m, h: h.argmax() + h.sum(1), {A, B}, "flattened"),
    ("torch-argmax", lambda m, h: torch.argmax(h, 1), {A}, "argmax returns positions"),
    ("flatten-argmax", lambda m, h: h.sum(2, keepdim=True).expand(-1, -1, 3).flatten(1)
     .argmax(1)[:, None] + h.sum(1), {A}, "argmax returns positions"),
    ("max-indices", lambda m, h: h.max(1).indices, {A}, "max returns positions"),
    ("min-indices", lambda m, h: torch.min(h, dim=1)[1], {A}, "min returns positions"),
    ("median-indices", lambda m, h: h.median(1).indices, {A}, "median returns positions"),
    ("mode-indices", lambda m, h: torch.mode(h.round(), 1)[1], {A}, "mode returns positions"),
    ("kthvalue", lambda m, h: h.kthvalue(2, 1).values, {A}, "needs k entries"),
    ("sort", lambda m, h: _mixed(m, h.sort(1).values), {A}, "sort depends on the order"),
    ("argsort", lambda m, h: _mixed(m, h.argsort(1)), {A}, "argsort returns positions"),
    ("cumsum", lambda m, h: _mixed(m, h.cumsum(1)), {A}, "cumsum depends on the order"),
    ("torch-cumprod", lambda m, h: _mixed(m, torch.cumprod(h, dim=1)), {A}, "cumprod"),
    ("logcumsumexp", lambda m, h: _mixed(m, h.logcumsumexp(1)), {A}, "logcumsumexp"),
    ("cummax", lambda m, h: _mixed(m, h.cummax(1).values), {A}, "cummax"),
    ("flip", lambda m, h: _mixed(m, h.flip(1)), {A}, "flip depends on the order"),
    ("torch-flip", lambda m, h: _mixed(m, torch.flip(h, [1])), {A}, "flip"),
    ("roll", lambda m, h: _mixed(m, h.roll(1, 1)), {A}, "roll depends on the order"),
    ("roll-no-dims", lambda m, h: _mixed(m, h.roll(3)), {A, B}, "roll"),
    ("diff", lambda m, h: h.diff(dim=1).sum(1), {A}, "diff"),
    ("tril", lambda m, h: _mixed(m, h.tril()), {A, B}, "tril addresses an elastic dim"),
    ("triu", lambda m, h: _mixed(m, torch.triu(h, 1)), {A, B}, "triu"),
    ("index-select", lambda m, h: h.index_select(1, torch.tensor([0, 3])).sum(1), {A},
     "index_select addresses an elastic dim by position"),
    ("gather", lambda m, h: h.gather(1, _signs(h)).squeeze(1), {A},
     "gather addresses an elastic dim by position"),
    ("take-along-dim", lambda m, h: torch.take_along_dim(h, _signs(h), 1).sum(1), {A},
     "take_along_dim addresses"),
    ("take-along-argsort", lambda m, h: _mixed(m, torch.take_along_dim(h, h.argsort(1), 1)),
     {A}, "argsort returns positions"),
    ("scatter", lambda m, h: _mixed(m, (h * 0).scatter(1, _signs(h), 1.0)), {A},
     "scatter addresses"),
    ("scatter-add", lambda m, h: _mixed(m, h.scatter_add(1, _signs(h), h)), {A},
     "scatter_add addresses"),
    ("index-fill", lambda m, h: _mixed(m, h.index_fill(1, torch.tensor([1]), 0.0)), {A},
     "index_fill addresses"),
    ("narrow", lambda m, h: h.narrow(1, 2, 6).sum(1), {A}, "keeps a part"),
    ("select", lambda m, h: h.select(1, 2), {A}, "picks one entry"),
    ("diagonal-offset", lambda m, h: h.diagonal(1, 1, 2).sum(-1, keepdim=True) + h.sum(1),
     {A, B}, "off-centre diagonal"),
    ("arange-compare", lambda m, h: _mixed(
        m, h * (torch.arange(h.size(1), device=h.device) < 4).view(1, -1, 1)), {A}, "positions"),
]

# the same kinds of op along dim 2: B is pinned, A keeps its group
OTHER_DIM: list[tuple[str, Callable[[Probe, torch.Tensor], torch.Tensor]]] = [
    ("cumsum", lambda m, h: _rows(m, h.cumsum(-1))),
    ("sort", lambda m, h: _rows(m, h.sort(dim=2).values)),
    ("flip", lambda m, h: _rows(m, h.flip(2))),
    ("argmax", lambda m, h: _rows(m, h.argmax(-1, keepdim=True))),
    ("gather", lambda m, h: _rows(m, h.gather(2, h.argsort(2)))),
    ("index-select", lambda m, h: _rows(m, h.index_select(2, torch.tensor([1, 0])))),
    ("select", lambda m, h: F.linear(h.select(2, 0), m.mix.weight, m.mix.bias)),
]

# picks by value whose positions only read the dim they index (``tests/test_experts.py``): the
# dim worked along stays a group, *routed* (permutation exact, dropping changes the picks),
# keeping at least as many units as the op picks
ROUTED: list[tuple[str, Callable[[Probe, torch.Tensor], torch.Tensor], tuple[str, str], int]] = [
    ("topk", lambda m, h: h.topk(3, 1).values.sum(1), A, 3),
    ("topk-last-dim", lambda m, h: _rows(m, h.topk(3).values), B, 3),
    ("argmax-gather", lambda m, h: h.gather(1, h.argmax(1, keepdim=True)).squeeze(1), A, 1),
    ("max-indices-gather", lambda m, h: h.gather(1, h.max(1, keepdim=True).indices)[:, 0],
     A, 1),
    ("scatter-argmax", lambda m, h: _mixed(m, (h * 0).scatter(
        1, h.argmax(1, keepdim=True), 1.0)), A, 1),
]

# value reductions and order-free ops: A stays searchable (and B too)
SEARCHABLE: list[tuple[str, Callable[[Probe, torch.Tensor], torch.Tensor]]] = [
    ("sum", lambda m, h: h.sum(1)),
    ("amax", lambda m, h: h.amax(1)),
    ("max-values", lambda m, h: h.max(1).values),
    ("max-getitem-0", lambda m, h: torch.max(h, 1)[0]),
    ("max-unpacked", _values_only),
    ("median-values", lambda m, h: h.median(1).values),
    ("var", lambda m, h: torch.var(h, 1)),
    ("std-unbiased-positional", lambda m, h: h.std(1, True)),
    ("std-keepdim-positional", lambda m, h: torch.std(h, 1, False, True).squeeze(1)),
    ("norm-p-dim", lambda m, h: torch.norm(h, 2, 1)),
    ("norm-method-p-dim", lambda m, h: h.norm(2, 1)),
    ("logsumexp", lambda m, h: h.logsumexp(1)),
    ("softmax", lambda m, h: _mixed(m, h.softmax(1))),
    ("log-softmax", lambda m, h: _mixed(m, F.log_softmax(h, dim=1))),
    ("normalize", lambda m, h: _mixed(m, F.normalize(h, dim=1))),
    ("where-three-args", lambda m, h: _mixed(m, torch.where(h > 0, h, -h))),
    ("bucketize", lambda m, h: _mixed(m, torch.bucketize(h, torch.tensor([-0.5, 0.0, 0.5])))),
    ("repeat-interleave", lambda m, h: h.repeat_interleave(2, dim=1).sum(1)),
    ("one-hot", lambda m, h: F.one_hot((h > 0).long(), 2).sum(-1).float().mean(1)),
]


def _analyze(op: Callable[[Probe, torch.Tensor], torch.Tensor],
             shape: tuple[int, ...]) -> tuple[Probe, fxsym.SymMap]:
    torch.manual_seed(0)
    model = Probe(op)
    inputs = (torch.randn(*shape),)
    sm = assert_oracles(model, inputs)
    perm = check_permutation(model, sm, inputs, seeds=SEEDS)
    assert perm.ok, f"permutation oracle failed: {perm}"
    return model, sm


def _members(sm: fxsym.SymMap) -> set[tuple[str, str]]:
    return {m for g in sm.groups() for m in g.members}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("op", "pinned", "reason"), [p[1:] for p in PINNED],
                         ids=[p[0] for p in PINNED])
def test_order_dependent_op_pins_its_dim(op: Callable[[Probe, torch.Tensor], torch.Tensor],
                                         pinned: set, reason: str,
                                         shape: tuple[int, ...]) -> None:
    _, sm = _analyze(op, shape)
    members = _members(sm)
    for key in (A, B):
        if key in pinned:
            assert key not in members
            why = sm.why_constant(*key)
            assert why is not None and reason in why, why
            assert any(e.kind == "boundary" and e.message == why for e in sm.trace_report)
        else:
            assert key in members, sm.why_constant(*key)
    assert ("d", "out_features") in members


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", [p[1] for p in OTHER_DIM], ids=[p[0] for p in OTHER_DIM])
def test_dims_not_worked_along_keep_their_groups(
        op: Callable[[Probe, torch.Tensor], torch.Tensor], shape: tuple[int, ...]) -> None:
    _, sm = _analyze(op, shape)
    groups = {g.name: set(g.members) for g in sm.groups()}
    assert MIX in groups["a.out_features"]
    assert B not in _members(sm)
    assert sm.why_constant(*B) is not None


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", [p[1] for p in SEARCHABLE], ids=[p[0] for p in SEARCHABLE])
def test_value_reductions_and_equivariant_ops_stay_searchable(
        op: Callable[[Probe, torch.Tensor], torch.Tensor], shape: tuple[int, ...]) -> None:
    _, sm = _analyze(op, shape)
    members = _members(sm)
    assert A in members, sm.why_constant(*A)
    assert B in members, sm.why_constant(*B)
    assert not any(g.routed for g in sm.groups())  # max(x, d).values picks no position


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("op", "key", "least"), [p[1:] for p in ROUTED],
                         ids=[p[0] for p in ROUTED])
def test_picks_by_value_read_back_by_position_route_the_dim(
        op: Callable[[Probe, torch.Tensor], torch.Tensor], key: tuple[str, str], least: int,
        shape: tuple[int, ...]) -> None:
    _, sm = _analyze(op, shape)
    (group,) = [g for g in sm.groups() if key in g.members]
    assert group.routed and group.min_size == least
    assert not any(g.routed for g in sm.groups() if g is not group)


# data-dependent shapes: no value on the meta device, so the node is a boundary (the rules
# registered for them apply once a tracer can give such values)
DATA_DEPENDENT: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
    ("nonzero", lambda h: h.gt(0).nonzero()),
    ("where-one-arg", lambda h: torch.where(h > 0)[1]),
    ("masked-select", lambda h: h.masked_select(h > 0)),
    ("unique", lambda h: torch.unique(h.round())),
]


@pytest.mark.parametrize("op", [p[1] for p in DATA_DEPENDENT], ids=[p[0] for p in DATA_DEPENDENT])
def test_data_dependent_positions_are_boundaries(
        op: Callable[[torch.Tensor], torch.Tensor]) -> None:
    class Side(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(6, 8), nn.Linear(6, 8)
            self.c, self.d = nn.Linear(8, 6), nn.Linear(6, 3)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.a(x)[:, :, None] * self.b(x)[:, None, :]
            return self.d(self.c(h.sum(1))), op(h).float().sum()

    model, inputs = Side(), (torch.randn(2, 6),)
    sm = assert_oracles(model, inputs)
    assert check_permutation(model, sm, inputs, seeds=SEEDS).ok
    assert A not in _members(sm) and sm.why_constant(*A) is not None
    assert ("c", "out_features") in _members(sm)


def test_diagonal_ties_the_two_dims_it_walks() -> None:
    """``diagonal`` of two equal dims follows a joint permutation: one group, searchable."""
    _, sm = _analyze(lambda m, h: torch.diagonal(h, dim1=1, dim2=2), (2, 6))
    (group,) = [g for g in sm.groups() if A in g.members]
    assert B in group.members and ("c", "in_features") in group.members


def test_repeat_interleave_keeps_the_group_in_longer_blocks() -> None:
    _, sm = _analyze(lambda m, h: _mixed(m, h.repeat_interleave(2, dim=2).view(
        h.size(0), h.size(1), -1, 2).sum(-1)), (2, 6))
    groups = {g.name: set(g.members) for g in sm.groups()}
    assert MIX in groups["a.out_features"]
    assert ("c", "in_features") in groups["b.out_features"]


def test_embedding_pins_the_rows_its_ids_pick() -> None:
    """``F.embedding(ids, table)``: the ids are positions in the table's rows, so a group the
    rows are tied to (here through ``proj``'s outputs) is pinned; the columns keep theirs."""

    class Table(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(6, 10)
            self.cols = nn.Linear(6, 4)
            self.table = nn.Parameter(torch.randn(10, 4))
            self.head = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            score = (self.proj(x) * self.table.sum(1)).sum(-1, keepdim=True)
            rows = F.embedding(ids, self.table) + self.cols(x)
            return self.head(rows) + score

    model = Table()
    for n in (2, 3):
        inputs = (torch.randn(n, 6), torch.arange(n) * 3)
        sm = assert_oracles(model, inputs)
        assert check_permutation(model, sm, inputs, seeds=SEEDS).ok
        assert ("proj", "out_features") not in _members(sm)
        assert sm.why_constant("proj", "out_features") == (
            "embedding picks the weight's rows by position")
        groups = {g.name: set(g.members) for g in sm.groups()}
        assert {("", "table:1"), ("head", "in_features")} <= groups["cols.out_features"]
