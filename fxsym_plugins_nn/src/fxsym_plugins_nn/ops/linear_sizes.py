"""Sizes as linear forms in the kept units of groups, and when a size keeps following a dim.

A :data:`LinearSize` is ``(fixed entries, {same-size class: entries per kept unit})``. A dim's
size is one (:func:`linear_size_of_dim`), and so is an int computed with ``+ - *`` from
numbers, sizes read from dims and module attributes (:func:`linear_size_of_int`). Two sizes
whose forms are equal stay equal under every resize: that is what lets a reshape by a traced
size or a slice bounded by one keep its group; so does an exact quotient (``key.shape[-1] //
self.heads``, a constant where the key holds whole heads). :func:`tie_part_to_bound` makes a
part of a dim follow a bound where it can (an attribute becomes a member of the group, updated
by resize; a size from another producer joins a same-size class), and
:func:`quotient_follows` a quotient's dividend keep a multiple of its divisor.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from fxsym.analysis import (
    AttributeSize,
    Dim,
    OpContext,
    SizeLayout,
    dim_size,
)
from fxsym.analysis.options import picked_blocks_kept


def _size_per_kept_unit(ctx: OpContext, dim: Dim) -> tuple[int, dict[int, int]]:
    """A dim's size as a function of its groups' kept units: fixed entries, and entries per
    kept unit of each group (groups that keep equal numbers of units counted as one)."""
    fixed = 0
    per: dict[int, int] = {}
    table = ctx.table
    for seg in dim:
        if seg.group is None or table.is_constant(seg.group):
            fixed += seg.length
            continue
        root = table.find(seg.group)
        key = min(table.same_size(root))
        per[key] = per.get(key, 0) + seg.length // table.units[root]
    return fixed, per


def keeps_size(ctx: OpContext, a: Dim, b: Dim, factor: int = 1) -> bool:
    """Whether dim ``a`` keeps ``factor`` times the size of dim ``b`` under every resize."""
    fa, pa = _size_per_kept_unit(ctx, a)
    fb, pb = _size_per_kept_unit(ctx, b)
    return fa == factor * fb and pa == {k: factor * v for k, v in pb.items()}


def share_of_size(ctx: OpContext, arg: Any, dim: Dim) -> bool:
    """Whether ``arg`` is ``n // k`` for an int ``n`` read from a dim that keeps ``k`` times
    ``dim``'s size (``channels_per_group = num_channels // groups`` in a channel shuffle)."""
    if not (isinstance(arg, torch.fx.Node) and arg.op == "call_function"
            and arg.target is operator.floordiv and len(arg.args) == 2):
        return False
    n, k = arg.args
    lay = ctx.layout(n)
    return (type(k) is int and k > 0 and isinstance(lay, SizeLayout) and not lay.derived
            and len(lay) == 1 and keeps_size(ctx, lay[0], dim, k))


def tie_equal_sizes(ctx: OpContext, a: Dim, b: Dim) -> bool:
    """Make dim ``a`` keep the size of dim ``b`` under every resize, where both are one group
    of equal size: the two groups form a same-size class (their entries stay independent;
    their unit counts become equal, so each unit has as many entries in both). A reshape of
    ``b`` by the size of ``a`` (``out.reshape(B, N, x.shape[-1])`` merging heads back into a
    dim read from the attention's input) then stays valid after every resize.

    Where one of them holds its group in copies (a group norm that keeps its norm groups) and
    the other is one group, that group is cut into as many blocks, each keeping the size of
    one copy (a same-size class with the copied group)."""
    if dim_size(a) != dim_size(b):
        return False
    if len(b) > 1:
        a, b = b, a
    if len(b) == 1 and len(a) > 1:
        return _tie_to_copies(ctx, a, b)
    if len(a) != 1 or len(b) != 1 or a[0].group is None or b[0].group is None:
        return False
    table = ctx.table
    ra, rb = table.find(a[0].group), table.find(b[0].group)
    if ra in table.children or rb in table.children:
        return False
    table.tie_sizes(ra, rb)
    return keeps_size(ctx, a, b)


def _tie_to_copies(ctx: OpContext, copies: Dim, one: Dim) -> bool:
    """:func:`tie_equal_sizes` of a dim holding one group in equal copies and a dim of one
    group (of the same size)."""
    table = ctx.table
    roots = {table.find(s.group) for s in copies if s.group is not None}
    if (len(roots) != 1 or any(s.group is None or s.length != copies[0].length for s in copies)
            or one[0].group is None):
        return False
    (ra,) = roots
    rb = table.find(one[0].group)
    n, units = len(copies), table.units[rb]
    if ra in table.children or rb in table.children or rb == ra or units % n:
        return False
    try:
        blocks = table.split(rb, [units // n] * n)
    except ValueError:
        return False
    for block in blocks:
        table.tie_sizes(ra, block)
    return keeps_size(ctx, copies, table.resolve(one))


def product_follows(ctx: OpContext, raw: Any, dim: Dim) -> bool:
    """Whether ``raw`` is a product of sizes linear in the kept units (every factor but one
    constant) that keeps ``dim``'s size under every resize (``self.num_heads *
    self.head_dim`` merging heads of a constant ``head_dim``). Nothing is pinned."""
    if not (isinstance(raw, torch.fx.Node) and raw.op == "call_function"
            and raw.target is operator.mul):
        return False
    form = linear_size_of_int(ctx, raw, pin=False)
    return form is not None and form == linear_size_of_dim(ctx, dim)


#: a size as a linear function of the kept units of groups: (fixed entries, {same-size class
#: key: entries per kept unit}), as :func:`_size_per_kept_unit` with constant groups as fixed
#: entries
LinearSize = tuple[int, dict[int, int]]


def linear_size_of_dim(ctx: OpContext, dim: Dim) -> LinearSize:
    fixed, per = _size_per_kept_unit(ctx, dim)
    return fixed, {k: v for k, v in per.items() if v}


def linear_size_of_int(ctx: OpContext, a: Any, depth: int = 0, *, pin: bool = True
                       ) -> LinearSize | None:
    """The int ``a`` (a number, a size read from a dim or an attribute, or ``+ - *`` of them,
    or an exact ``//``: :func:`_exact_quotient`) as a :data:`LinearSize`, where it is linear
    in the kept units. In a product of two elastic
    sizes (``config.num_attention_heads * self.head_dim``) the second factor is pinned, so
    the product stays linear in the first; without ``pin``, such a product has no form."""
    if type(a) is int:
        return a, {}
    if not isinstance(a, torch.fx.Node) or depth > 32:
        return None
    if (a.op == "call_function" and a.target is operator.floordiv and not a.kwargs
            and len(a.args) == 2):
        num = linear_size_of_int(ctx, a.args[0], depth + 1, pin=pin)
        den = linear_size_of_int(ctx, a.args[1], depth + 1, pin=pin)
        return None if num is None or den is None else _exact_quotient(num, den)
    if a.op == "call_function" and a.target in _LINEAR_OPS and not a.kwargs and len(a.args) == 2:
        first = linear_size_of_int(ctx, a.args[0], depth + 1, pin=pin)
        second = linear_size_of_int(ctx, a.args[1], depth + 1, pin=pin)
        if first is None or second is None:
            return None
        (c1, p1), (c2, p2) = first, second
        if a.target is operator.mul:
            if p1 and p2 and not pin:
                return None
            if p1 and p2:
                ctx.fix(ctx.layout(a.args[1]), "a factor of a product of sizes bounding a slice")
                first = linear_size_of_int(ctx, a.args[0], depth + 1)
                second = linear_size_of_int(ctx, a.args[1], depth + 1)
                if first is None or second is None or second[1]:
                    return None
                (c1, p1), (c2, p2) = first, second
            (c, per), k = ((c1, p1), c2) if not p2 else ((c2, p2), c1)
            return c * k, {g: v * k for g, v in per.items() if v * k}
        sign = 1 if a.target is operator.add else -1
        merged = dict(p1)
        for g, v in p2.items():
            merged[g] = merged.get(g, 0) + sign * v
        return c1 + sign * c2, {g: v for g, v in merged.items() if v}
    lay = ctx.layout(a)
    if isinstance(lay, SizeLayout) and not lay.derived and len(lay) == 1:
        return linear_size_of_dim(ctx, lay[0])
    return None


_LINEAR_OPS = frozenset({operator.add, operator.sub, operator.mul})


def _exact_quotient(num: LinearSize, den: LinearSize) -> LinearSize | None:
    """``num // den`` where the division is exact under every resize: by a number dividing
    every coefficient, or by an elastic size of which ``num`` is a constant multiple
    (``key.shape[-1] // self.heads`` where the key holds ``heads`` whole heads: ``head_dim``,
    a constant)."""
    (cn, pn), (cd, pd) = num, den
    if not pd:
        if cd <= 0 or cn % cd or any(v % cd for v in pn.values()):
            return None
        return cn // cd, {g: v // cd for g, v in pn.items()}
    key, coefficient = next(iter(pd.items()))
    factor = pn.get(key, 0) // coefficient
    if factor <= 0 or (cn, pn) != (factor * cd, {g: factor * v for g, v in pd.items()}):
        return None
    return factor, {}


def tie_part_to_bound(ctx: OpContext, part: Dim, bound: Any, base: LinearSize) -> bool:
    """Make ``part`` keep the size ``bound`` minus ``base`` under every resize, where it can:
    a part of one elastic block against a bound linear in one group's kept units is tied to
    that group (its units coarsened to match): the same group where the bound's group has no
    producer (an attribute such as ``config.num_attention_heads``, which becomes a member and
    is updated by resize), a same-size class where it has one (a size read from another
    producer's dim)."""
    form = linear_size_of_int(ctx, bound)
    if form is None:
        return False

    def target() -> LinearSize | None:
        now = linear_size_of_int(ctx, bound)
        if now is None:
            return None
        per = dict(now[1])
        for g, v in base[1].items():
            per[g] = per.get(g, 0) - v
        return now[0] - base[0], {g: v for g, v in per.items() if v}

    return _tie_part_to_size(ctx, part, target)


def quotient_follows(ctx: OpContext, raw: Any, dim: Dim) -> bool:
    """Whether ``raw``, ``n // k`` for ``n`` a size read from a dim and ``k`` an elastic size,
    sizing a dim of fixed size ``c``, keeps the value ``c`` under every resize, or can be made
    to: ``n``'s dim is made to keep ``c`` times ``k``'s size, as a part is made to follow a
    bound (diffusers' ``head_dim = key.shape[-1] // attn.heads`` reshaping the query, where
    ``heads`` is tied to the query's heads: the key's features become whole heads of ``c``
    entries, a same-size class with the query's heads)."""
    if not (isinstance(raw, torch.fx.Node) and raw.op == "call_function"
            and raw.target is operator.floordiv and len(raw.args) == 2 and not raw.kwargs):
        return False
    n, k = raw.args
    n_lay = ctx.layout(n)
    if not isinstance(n_lay, SizeLayout) or n_lay.derived or len(n_lay) != 1:
        return False
    fixed, per = linear_size_of_dim(ctx, dim)
    den = linear_size_of_int(ctx, k, pin=False)
    if den is None or (per and den[1]):
        return False
    if per:  # a constant k (one routing group, or n_group kept): an attribute n follows k
        # times the dim, a member of its group
        if not isinstance(n_lay, AttributeSize):
            return False

        def scaled() -> LinearSize | None:
            now = linear_size_of_dim(ctx, dim)
            return now[0] * den[0], {g: v * den[0] for g, v in now[1].items()}

        return den[0] > 0 and _tie_part_to_size(ctx, n_lay[0], scaled,
                                                member=picked_blocks_kept())

    def target() -> LinearSize | None:
        den = linear_size_of_int(ctx, k, pin=False)
        if den is None or not den[1]:
            return None
        return fixed * den[0], {g: fixed * v for g, v in den[1].items()}

    return _tie_part_to_size(ctx, n_lay[0], target)


def _tie_part_to_size(ctx: OpContext, part: Dim, target: Callable[[], LinearSize | None],
                      member: bool = False) -> bool:
    """Make ``part`` keep the size ``target()`` under every resize, where it can (see
    :func:`tie_part_to_bound`); ``target`` is read again after tying, which renames the
    same-size classes its form counts. ``member``: ``part`` is a module attribute's own
    group, which becomes a member of the group it follows (resize then updates it)."""
    want = target()
    if want is None:
        return False
    if linear_size_of_dim(ctx, part) == want:
        return True
    table = ctx.table
    elastic = [s for s in part if s.group is not None and not table.is_constant(s.group)]
    fixed = sum(s.length for s in part) - sum(s.length for s in elastic)
    if len(elastic) != 1 or len(want[1]) != 1 or fixed != want[0]:
        return False
    ((key, per_unit),) = want[1].items()
    seg, other = elastic[0], table.find(key)
    units = table.units[other]
    root = table.find(seg.group)  # type: ignore[arg-type]
    if root == other or root in table.children or seg.length != per_unit * units or (
            table.units[root] % units):
        return False
    table.constrain(root, units)
    if table.producers.get(other) and not member:
        table.tie_sizes(root, other)  # a size read from another producer's dim: counts only
    else:  # an attribute (or a parameter dim) sizing the part, or the part an attribute's
        # own group: a member of the other group
        table.union(root, other)
    return linear_size_of_dim(ctx, part) == target()


def computed_from_sizes(node: torch.fx.Node, depth: int = 0) -> bool:
    """Whether the int ``node`` is computed from numbers, attribute reads and tensor sizes
    only (never from a tensor's entries)."""
    if depth > 32:
        return False
    if node.op == "get_attr":
        return not isinstance(node.meta.get("val"), torch.Tensor)
    if (node.op == "call_method" and node.target == "size") or (
            node.op == "call_function" and node.target is getattr
            and len(node.args) > 1 and node.args[1] == "shape"):
        return True
    if node.op != "call_function" or isinstance(node.meta.get("val"), torch.Tensor):
        return False
    if node.target not in _SIZE_ARITHMETIC:
        return False
    return all(computed_from_sizes(n, depth + 1) for n in node.all_input_nodes)


_SIZE_ARITHMETIC = frozenset({operator.add, operator.sub, operator.mul, operator.floordiv,
                              operator.neg, operator.getitem})



def stays_constant(ctx: OpContext, raw: Any, value: int) -> bool:
    """Whether ``raw``, an int computed from sizes and module attributes, keeps ``value``
    under every resize, or can be made to (it sizes a dim of fixed size: a fused view's
    per-head width ``2 * self.head_k_dim + 2 * self.head_v_dim * self.num_v_heads //
    self.num_k_heads``, where ``num_k_heads`` is tied to the heads it sizes).

    A quotient ``a // b`` by an elastic ``b`` keeps its value where ``a`` keeps that many
    times ``b``: an attribute of ``a`` tied to nothing yet becomes a member of ``b``'s group,
    that many entries per unit (of several, the smallest multiple of ``b``: a count per unit,
    such as value heads per key head, before a width). Every other attribute in ``raw`` tied
    to nothing elastic is pinned (it sizes fixed entries). Each tie is a claim the attribute's
    other uses are checked against, so a wrong one pins, never passes. ``False``: ``raw`` is
    not such an int or its value may change (the caller pins what it reads)."""
    raw = _written(ctx, raw)
    if type(raw) is int:
        return raw == value
    if not isinstance(raw, torch.fx.Node) or not computed_from_sizes(raw):
        return False
    for q in _tree(raw):
        if q.op == "call_function" and q.target is operator.floordiv and len(q.args) == 2:
            _tie_dividend(ctx, q.args[0], q.args[1])
    for dim in _free_attributes(ctx, raw):
        ctx.fix(dim, "a size read from a module attribute sizes fixed entries")
    return linear_size_of_int(ctx, raw, pin=False) == (value, {})


def _tie_dividend(ctx: OpContext, a: Any, b: Any) -> None:
    """Make ``a`` keep ``a // b`` times ``b`` under every resize where ``b`` is elastic and
    ``a`` reads an attribute tied to nothing (see :func:`stays_constant`)."""
    den = linear_size_of_int(ctx, b, pin=False)
    va, vb = ctx.val(a), ctx.val(b)
    if den is None or not den[1] or type(va) is not int or type(vb) is not int or (
            vb <= 0 or va % vb):
        return
    free = _free_attributes(ctx, a)
    whole = sorted((d for d in free if dim_size(d) % vb == 0), key=dim_size)
    if not whole:
        return
    tied = whole[0]
    others = [d for d in free if d is not tied]
    for dim in others:
        ctx.fix(dim, "a size read from a module attribute sizes fixed entries")
    num = linear_size_of_int(ctx, a, pin=False)
    if num is None or len(num[1]) != 1:
        return
    factor = va // vb
    (k,) = num[1].values()
    if num[0] != factor * den[0] or k <= 0:
        return

    def target() -> LinearSize | None:
        now = linear_size_of_int(ctx, b, pin=False)
        if now is None or any(factor * v % k for v in now[1].values()):
            return None
        return 0, {g: factor * v // k for g, v in now[1].items()}

    _tie_part_to_size(ctx, tied, target, member=True)


def _written(ctx: OpContext, raw: Any) -> Any:
    """``raw`` as written where it is an entry of a shape joined from tuples
    (``x.size()[:-1] + (self.num_heads, width)`` unpacked into a view: ``width``)."""
    for _ in range(32):
        if not (isinstance(raw, torch.fx.Node) and raw.op == "call_function"
                and raw.target is operator.getitem and type(raw.args[1]) is int):
            return raw
        joined, i = raw.args[0], int(raw.args[1])  # an int, checked above
        if not (isinstance(joined, torch.fx.Node) and joined.op == "call_function"
                and joined.target is operator.add):
            return raw
        entries: list[Any] = []
        for part in joined.args:
            if isinstance(part, (tuple, list)):
                entries.extend(part)
            elif isinstance(part, torch.fx.Node) and isinstance(
                    value := ctx.val(part), (tuple, list)):
                entries.extend([None] * len(value))  # a shape read from a tensor
            else:
                return raw
        if not -len(entries) <= i < len(entries) or entries[i] is None:
            return raw
        raw = entries[i]
    return raw


def _tree(node: torch.fx.Node) -> list[torch.fx.Node]:
    """``node`` and the nodes of the size arithmetic it is computed from, each once."""
    seen: dict[torch.fx.Node, None] = {}
    stack = [node]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen[n] = None
            if n.op == "call_function" and n.target in _SIZE_ARITHMETIC:
                stack.extend(n.all_input_nodes)
    return list(seen)


def _free_attributes(ctx: OpContext, raw: Any) -> list[Dim]:
    """The attribute groups ``raw`` reads that nothing elastic joined (no producer, not
    constant), one dim each, in the order read."""
    if not isinstance(raw, torch.fx.Node):
        return []
    table = ctx.table
    out: dict[int, Dim] = {}
    for n in _tree(raw):
        lay = ctx.layout(n)
        if not isinstance(lay, AttributeSize) or len(lay) != 1:
            continue
        dim = table.resolve(lay[0])
        roots = {table.find(s.group) for s in dim if s.group is not None}
        if len(roots) == 1 and not any(table.is_constant(r) or table.producers.get(r)
                                       for r in roots):
            out.setdefault(roots.pop(), dim)
    return list(out.values())
