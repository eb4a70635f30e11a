"""Deciding the guards of a trace: questions Python asked about sizes at trace time.

The tracer records each question Python asked of a value computed from sizes — a
comparison in an ``if`` or an ``assert``, ``bool()``, ``int()``, ``float()``, an index,
``len()``, ``numel()`` — as a :class:`~fxsym.tracer.questions.Guard` on the nodes it reads
(``node.meta[CONCRETE_META]``). Its answer is baked into the graph, so once its reads have
layouts the analyzer decides it (:func:`decide`), in this order:

1. it reads no elastic group: nothing to do;
2. **it ties what it compares**: ``a == b`` answered ``True`` (or ``a != b`` answered
   ``False``) where ``a`` and ``b`` are each a size read or an int attribute read as a size.
   An attribute is unified with the dim it equals, so it becomes a member of that group and
   ``resize`` writes it (``if y.shape[1] == self.ch:``, diffusers' ``assert
   hidden_states.shape[1] == self.channels``); two tensor dims of one group each become a
   same-size class (their entries independent, their counts equal);
3. **it holds for every size**: each read lies in an interval — its current length at most,
   and at least one unit of each elastic group it holds (a resize keeps a subset of the
   entries, and at least one unit) — and the expression, evaluated over intervals
   (``+ - * // /``, comparisons, ``not``), gives one answer on all of them: ``C > 0``,
   ``C >= 1``, ``C <= 8`` for ``C == 8``, truth of ``C``. ``int()``, ``float()``, an index or
   ``len()`` must have one value over the intervals (a size read from a fixed dim). A
   comparison of two sizes linear in the groups' kept units is decided on their difference
   first (:func:`_compared_linearly`: ``k.shape[2] != v.shape[2]``, one key head against its
   two value heads, holds though the two intervals overlap);
4. two shapes compared as tuples (``if self.shape != x.shape:``) are decided entry by entry
   (:func:`_shapes_compared`);
5. otherwise it **pins** every group it reads, with a ``guard`` line in the trace report
   naming the question, the expression and where it was asked.

This module reads the analysis (the layouts and the group table) and changes nothing: it
returns its decision — :class:`Pin`, :class:`Unify`, :class:`TieSizes`, :class:`EachPair`,
or ``None`` (nothing to do) — and the analyzer applies it.

Imports from fxsym: tracer (questions).
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch.fx

from ..tracer.questions import CONCRETE_META, Apply, AttributeRead, Guard, SizeRead
from .groups import GroupTable
from .layout import Dim, Layout, SizeLayout, TensorLayout

Interval = tuple[float, float]
#: the layout of each node analyzed so far
Env: TypeAlias = Mapping[torch.fx.Node, Layout]


@dataclass(frozen=True)
class Pin:
    """Make the groups of ``dims`` constant, each pin site ``where`` with ``reason``; a
    ``guard`` report line if that changed a group and ``report`` (a group has a producer)."""

    dims: tuple[Dim, ...]
    where: str
    reason: str
    report: bool


@dataclass(frozen=True)
class Unify:
    """Tie an attribute read to the dim it was compared equal with (or two such reads), as an
    op rule's ``unify``; where that is not supported, apply ``otherwise``."""

    a: Dim
    b: Dim
    otherwise: Decision


@dataclass(frozen=True)
class TieSizes:
    """Make the groups rooted at ``a`` and ``b`` a same-size class
    (:meth:`~fxsym.analysis.groups.GroupTable.tie_sizes`)."""

    a: int
    b: int


@dataclass(frozen=True)
class EachPair:
    """Two shapes compared equal as tuples: decide each pair of entries as a guard of its
    own, in order, each after the previous one's decision is applied."""

    guards: tuple[Guard, ...]


Decision: TypeAlias = "Pin | Unify | TieSizes | EachPair | None"


def due_guards(graph: torch.fx.Graph) -> dict[torch.fx.Node, list[Guard]]:
    """Each guard of ``graph``, keyed by the last node (in graph order) it reads: the node
    after whose visit every read has its layout."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    due: dict[torch.fx.Node, list[Guard]] = {}
    seen: set[int] = set()
    for node in graph.nodes:
        for guard in node.meta.get(CONCRETE_META, ()):
            if id(guard) in seen:
                continue
            seen.add(id(guard))
            reads = [r.node for r in guard.reads()]
            last = max(reads, key=lambda n: order.get(n, -1))
            due.setdefault(last, []).append(guard)
    return due


def decide(guard: Guard, env: Env, table: GroupTable) -> Decision:
    """What to do about ``guard`` (see the module docstring), its reads analyzed (their
    layouts in ``env``, their groups in ``table``); nothing is changed here."""
    an = _View(env, table)
    dims: dict[int, Dim | None] = {id(r): _dim(an, r) for r in guard.reads()}
    elastic = [d for d in dims.values() if d is not None and _elastic(an, d)]
    if not elastic:
        return None
    tie = _tie(an, guard, dims)
    if not isinstance(tie, (_Not, Unify)):
        return tie
    rest = _untied(an, guard, dims, elastic)
    return Unify(tie.a, tie.b, rest) if isinstance(tie, Unify) else rest


def _untied(an: _View, guard: Guard, dims: dict[int, Dim | None], elastic: list[Dim]
            ) -> Decision:
    """The decision on a guard that ties nothing: it holds, its shapes are compared entry by
    entry, or it pins what it reads."""
    if _holds(an, guard, dims):
        return None
    compared = _shapes_compared(an, guard)
    if not isinstance(compared, _Not):
        return compared
    where = f"{guard.where or '<root>'} (node {guard.node})"
    reason = f"the trace depends on {guard}, asked in {guard.where or '<root>'}"
    return Pin(tuple(elastic), where, reason, _produces(an, elastic))


@dataclass(frozen=True)
class _View:
    """What the decisions read of the analysis."""

    env: Env
    table: GroupTable


class _Not(enum.Enum):
    """``_tie``'s answer for a guard that is no tie; ``_shapes_compared``'s for one that
    compares no two shapes (or shapes it cannot decide)."""

    APPLICABLE = "not applicable"



def _shapes_compared(an: _View, guard: Guard) -> Decision | _Not:
    """Decide ``a == b`` / ``a != b`` of two shapes compared as tuples entry by entry.

    Answered "all equal", each pair of entries is a question of its own, decided (tied, held
    or pinned) as any other (:class:`EachPair`). Answered "some differ", it holds if the
    tuples' lengths differ or one pair differs for every size; otherwise
    :data:`_Not.APPLICABLE`, and the caller pins every read."""
    e = guard.expr
    if not (isinstance(e, Apply) and e.fn in (operator.eq, operator.ne) and len(e.args) == 2
            and guard.question == "bool()"):
        return _Not.APPLICABLE
    a, b = (_entries(x) for x in e.args)
    if a is None or b is None:
        return _Not.APPLICABLE
    if len(a) != len(b):
        return None
    pairs = [Guard(Apply(operator.eq, (x, y)), guard.question, True, guard.where, guard.node)
             for x, y in zip(a, b)]
    if (e.fn is operator.eq) == bool(guard.answer):
        return EachPair(tuple(pairs))
    differs = any(_holds(an, Guard(Apply(operator.ne, p.expr.args), p.question, True, p.where,
                                   p.node), {id(r): _dim(an, r) for r in p.reads()})
                  for p in pairs)
    return None if differs else _Not.APPLICABLE


def _entries(e: Any) -> list[Any] | None:
    """The entries of a shape compared as a tuple: a traced shape's size reads, or a
    constant tuple of ints; ``None`` for anything else."""
    if isinstance(e, Apply) and e.fn is tuple:
        return list(e.args)
    if isinstance(e, tuple) and all(type(v) is int for v in e):
        return list(e)
    return None


def _dim(an: _View, read: SizeRead | AttributeRead) -> Dim | None:
    lay = an.env.get(read.node)
    if isinstance(read, SizeRead):
        if isinstance(lay, TensorLayout) and read.dim < len(lay):
            return an.table.resolve(lay[read.dim])
        return None
    if isinstance(lay, SizeLayout) and len(lay) == 1:
        return an.table.resolve(lay[0])
    return None


def _elastic(an: _View, dim: Dim) -> bool:
    return any(s.group is not None and not an.table.is_constant(s.group) for s in dim)


def _produces(an: _View, dims: list[Dim]) -> bool:
    """Whether a group of ``dims`` has a producer (a pinned lone attribute is not worth a
    report line: it sizes nothing)."""
    table = an.table
    return any(table.producers.get(table.find(g)) for d in dims for s in d
               if (g := s.group) is not None)


def _tie(an: _View, guard: Guard, dims: dict[int, Dim | None]) -> Decision | _Not:
    """``a == b`` known true of two reads: how to tie them (see the module docstring), or
    :data:`_Not.APPLICABLE`. A :class:`Unify` answer's ``otherwise`` is the caller's to fill."""
    e = guard.expr
    if not (isinstance(e, Apply) and len(e.args) == 2 and guard.question == "bool()" and (
            (e.fn is operator.eq and guard.answer) or (e.fn is operator.ne and not guard.answer))):
        return _Not.APPLICABLE
    a, b = e.args
    if not (isinstance(a, (SizeRead, AttributeRead)) and isinstance(b, (SizeRead, AttributeRead))):
        return _Not.APPLICABLE
    da, db = dims[id(a)], dims[id(b)]
    if da is None or db is None:
        return _Not.APPLICABLE
    table = an.table
    if isinstance(a, AttributeRead) or isinstance(b, AttributeRead):
        return Unify(da, db, None)
    if _same(an, da, db):
        return None
    if len(da) != 1 or len(db) != 1 or da[0].group is None or db[0].group is None:
        return _Not.APPLICABLE
    ra, rb = table.find(da[0].group), table.find(db[0].group)
    if ra in table.children or rb in table.children or da[0].length != db[0].length:
        return _Not.APPLICABLE
    if table.units[ra] != table.units[rb] or da[0].block != db[0].block:
        return _Not.APPLICABLE
    return TieSizes(ra, rb)


def _same(an: _View, a: Dim, b: Dim) -> bool:
    find = an.table.find
    return len(a) == len(b) and all(
        sa.length == sb.length and (
            sa.group == sb.group or (sa.group is not None and sb.group is not None
                                     and find(sa.group) == find(sb.group)))
        for sa, sb in zip(a, b))


def _holds(an: _View, guard: Guard, dims: dict[int, Dim | None]) -> bool:
    """Whether the guard gives its answer for every size its reads may take."""
    compared = _compared_linearly(an, guard.expr, dims)
    if compared is not None and guard.question == "bool()" and _truth(compared) is not None:
        return _truth(compared) == bool(guard.answer)
    found = _interval(an, guard.expr, dims)
    if found is None:
        return False
    if guard.question == "bool()":
        return _truth(found) == bool(guard.answer)
    return found[0] == found[1]


#: a size as fixed entries and entries per kept unit of each same-size class (its first root)
_Linear: TypeAlias = "tuple[int, dict[int, int]]"


def _compared_linearly(an: _View, e: Any, dims: dict[int, Dim | None]) -> Interval | None:
    """A comparison of two sizes linear in the kept units of groups (``key.shape[2] !=
    value.shape[2]`` where the key holds one entry per kept head and the value two): decided
    on their difference, each class keeping between one unit and all of them, so sizes of one
    group are compared as they move together (intervals of each side would lose that).
    ``None`` where either side is not such a size."""
    if not (isinstance(e, Apply) and e.fn in _COMPARE and len(e.args) == 2):
        return None
    a, b = (_linear(an, x, dims) for x in e.args)
    if a is None or b is None:
        return None
    lo = hi = float(a[0] - b[0])
    for key in {*a[1], *b[1]}:
        k = a[1].get(key, 0) - b[1].get(key, 0)
        units = an.table.units[an.table.find(key)]
        lo, hi = lo + min(k, k * units), hi + max(k, k * units)
    return _apply(e.fn, [(lo, hi), (0.0, 0.0)])


def _linear(an: _View, e: Any, dims: dict[int, Dim | None], depth: int = 0) -> _Linear | None:
    """``e`` (a size read, a number, or ``+ -`` and ``*`` by a number of them) as a
    :data:`_Linear`, or ``None``."""
    if type(e) is int:
        return e, {}
    if isinstance(e, (SizeRead, AttributeRead)):
        d = dims.get(id(e))
        if d is None:
            return None
        table = an.table
        fixed, per = 0, dict[int, int]()
        for s in d:
            if s.group is None or table.is_constant(s.group):
                fixed += s.length
                continue
            root = table.find(s.group)
            key = min(table.same_size(root))
            per[key] = per.get(key, 0) + s.length // table.units[root]
        return fixed, per
    if not (isinstance(e, Apply) and len(e.args) == 2 and depth < 16
            and e.fn in (operator.add, operator.sub, operator.mul)):
        return None
    x, y = (_linear(an, v, dims, depth + 1) for v in e.args)
    if x is None or y is None:
        return None
    if e.fn is operator.mul:
        if x[1] and y[1]:
            return None
        (c, per), k = (y, x[0]) if not x[1] else (x, y[0])
        return c * k, {g: v * k for g, v in per.items() if v * k}
    sign = 1 if e.fn is operator.add else -1
    merged = dict(x[1])
    for g, v in y[1].items():
        merged[g] = merged.get(g, 0) + sign * v
    return x[0] + sign * y[0], {g: v for g, v in merged.items() if v}


def _interval(an: _View, e: Any, dims: dict[int, Dim | None]) -> Interval | None:
    if isinstance(e, (SizeRead, AttributeRead)):
        d = dims.get(id(e))
        return None if d is None else _range(an, d)
    if isinstance(e, bool | int | float):
        return (float(e), float(e))
    if not isinstance(e, Apply) or e.fn is None:
        return None
    args = [_interval(an, a, dims) for a in e.args]
    if any(a is None for a in args):
        return None
    return _apply(e.fn, args)  # type: ignore[arg-type]


def _range(an: _View, dim: Dim) -> Interval:
    """The sizes ``dim`` may take: at least one unit of each elastic group, at most now."""
    table = an.table
    lo = hi = 0
    for s in dim:
        hi += s.length
        if s.group is None or table.is_constant(s.group):
            lo += s.length
        else:
            lo += max(1, s.length // table.units[table.find(s.group)])
    return (float(lo), float(hi))


_UNKNOWN: Interval = (0.0, 1.0)  # a comparison that may go either way


def _apply(fn: Any, args: list[Interval]) -> Interval | None:
    if len(args) == 1:
        (lo, hi), = args
        if fn is operator.neg:
            return (-hi, -lo)
        if fn is operator.not_:
            truth = _truth((lo, hi))
            return _UNKNOWN if truth is None else _bool(not truth)
        return None
    if len(args) != 2:
        return None
    (alo, ahi), (blo, bhi) = args
    if fn is operator.add:
        return (alo + blo, ahi + bhi)
    if fn is operator.sub:
        return (alo - bhi, ahi - blo)
    if fn is operator.mul:
        products = (alo * blo, alo * bhi, ahi * blo, ahi * bhi)
        return (min(products), max(products))
    if fn in (operator.floordiv, operator.truediv) and blo == bhi and blo > 0:
        if fn is operator.floordiv:
            return (float(alo // blo), float(ahi // blo))
        return (alo / blo, ahi / blo)
    if fn in (operator.and_, operator.or_):
        ta, tb = _truth((alo, ahi)), _truth((blo, bhi))
        if fn is operator.and_ and (ta is False or tb is False):
            return _bool(False)
        if fn is operator.or_ and (ta is True or tb is True):
            return _bool(True)
        return _UNKNOWN if ta is None or tb is None else _bool(fn(ta, tb))
    compare = _COMPARE.get(fn)
    if compare is None:
        return None
    found: Interval = compare(alo, ahi, blo, bhi)
    return found


def _truth(i: Interval) -> bool | None:
    lo, hi = i
    if lo > 0 or hi < 0:
        return True
    if lo == hi == 0:
        return False
    return None


def _bool(v: bool) -> Interval:
    return (1.0, 1.0) if v else (0.0, 0.0)


def _decided(always: bool, never: bool) -> Interval:
    return _bool(True) if always else _bool(False) if never else _UNKNOWN


_COMPARE: dict[Any, Any] = {
    operator.lt: lambda alo, ahi, blo, bhi: _decided(ahi < blo, alo >= bhi),
    operator.le: lambda alo, ahi, blo, bhi: _decided(ahi <= blo, alo > bhi),
    operator.gt: lambda alo, ahi, blo, bhi: _decided(alo > bhi, ahi <= blo),
    operator.ge: lambda alo, ahi, blo, bhi: _decided(alo >= bhi, ahi < blo),
    operator.eq: lambda alo, ahi, blo, bhi: _decided(alo == ahi == blo == bhi,
                                                     ahi < blo or bhi < alo),
    operator.ne: lambda alo, ahi, blo, bhi: _decided(ahi < blo or bhi < alo,
                                                     alo == ahi == blo == bhi),
}


__all__ = ["Decision", "EachPair", "Pin", "TieSizes", "Unify", "decide", "due_guards"]
