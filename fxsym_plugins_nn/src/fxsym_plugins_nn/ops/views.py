"""Reshape and view algebra: where groups land when dims are merged, split or moved.

``permute``/``transpose``/``unsqueeze``/``squeeze``/``expand`` move or add dims and keep the
groups of the dims they keep. A reshape pairs runs of input and output dims of equal products
(:func:`_equal_product_runs`): a run merged into one dim keeps its groups in its outermost dim
(as longer blocks) or in its only elastic dim under fixed outer dims (a copy per outer entry);
one dim split into several keeps its group on the outer dim where that dim indexes whole units
(``(C*49,)`` into ``(C, 7, 7)``) or whole groups of units (channels into ``(heads,
head_dim)``), or reads the dim as equal blocks cut apart and tied (the experts as expert
positions of every routing group, with ``routing_groups="keep"``: the mask's expand to
``num_experts // num_group`` then follows those positions, and ``num_experts``, a member of
them, sizes their ``num_group`` copies merged back). A size argument that cannot
follow a resize (a number, a size read from a fixed dim) makes the dim it sizes constant; a
traced size must provably keep sizing its dim (:mod:`.linear_sizes`), else both are pinned.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from fxsym.analysis import (
    AttributeSize,
    Dim,
    Layout,
    OpContext,
    Seg,
    SizeLayout,
    TensorLayout,
    Unsupported,
    concat_dims,
    dim_size,
    fixed_dim,
    is_fixed,
    scale_block,
    size_checked,
    tie_size,
)
from fxsym.analysis.options import picked_blocks_kept

from .common import dims_arg, norm_dim, same_dim
from .linear_sizes import (
    keeps_size,
    linear_size_of_dim,
    linear_size_of_int,
    product_follows,
    quotient_follows,
    share_of_size,
    stays_constant,
    tie_equal_sizes,
)
from .pieces import aligned_pieces, cut_dim


def _equal_product_runs(a: Sequence[int], b: Sequence[int]
                        ) -> list[tuple[list[int], list[int]]] | None:
    """Pair runs of dims of shapes ``a`` and ``b`` with equal products (size-1 dims skipped)."""
    ia = [i for i, s in enumerate(a) if s != 1]
    ib = [i for i, s in enumerate(b) if s != 1]
    out: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(ia) and j < len(ib):
        ca, cb = [ia[i]], [ib[j]]
        pa, pb = a[ia[i]], b[ib[j]]
        i += 1
        j += 1
        while pa != pb:
            if pa < pb:
                if i >= len(ia):
                    return None
                pa *= a[ia[i]]
                ca.append(ia[i])
                i += 1
            else:
                if j >= len(ib):
                    return None
                pb *= b[ib[j]]
                cb.append(ib[j])
                j += 1
        out.append((ca, cb))
    if i != len(ia) or j != len(ib):
        return None
    return out


def reshape_layout(ctx: OpContext, lay: TensorLayout, in_shape: Sequence[int],
                   out_shape: Sequence[int], literal: Sequence[bool] | None = None) -> TensorLayout:
    """The layout after a view/reshape/flatten, where provable.

    A run of dims merged into one keeps its groups if they sit in the outermost dim of the
    run (their blocks grow by the inner sizes), or in one dim whose outer dims are fixed (a
    copy of it per outer entry); one dim split into several keeps its
    group on the outermost piece when that piece is exactly the group's units. ``literal``
    marks output dims whose size cannot follow a resize (:func:`_is_literal_size`: written as a
    number, or read from a fixed dim): a group landing there becomes constant.
    """
    for i, s in enumerate(in_shape):
        if s == 1 and not is_fixed(lay[i]):
            ctx.fix(lay[i], "a size-1 elastic dim is reshaped")
    chunks = _equal_product_runs(in_shape, out_shape)
    out: list[Dim] = [fixed_dim(s) for s in out_shape]
    if chunks is None:
        ctx.unsupported(f"cannot map shape {tuple(in_shape)} to {tuple(out_shape)}")
        return TensorLayout(out)
    for ca, cb in chunks:
        dims = [lay[i] for i in ca]
        if all(is_fixed(d) for d in dims):
            continue
        if len(ca) == 1 and len(cb) == 1:
            out[cb[0]] = dims[0]
        elif len(cb) == 1:
            out[cb[0]] = _merged(ctx, dims, [in_shape[i] for i in ca])
        else:  # split (a run merged first: ``(heads, r * d)`` into ``(heads * r, d)``): the
            # outer piece indexes whole units (or parts of one)
            merged = dims[0] if len(ca) == 1 else _merged(ctx, dims, [in_shape[i] for i in ca])
            lits = [bool(literal[i]) if literal is not None and i < len(literal) else False
                    for i in cb]
            for i, dim in zip(cb, _unflatten_dim(ctx, merged, [out_shape[i] for i in cb], lits)):
                out[i] = dim
    if literal is not None:
        for i, lit in enumerate(literal):
            if lit and i < len(out) and not is_fixed(out[i]):
                ctx.fix(out[i], "reshaped to a literal size, which cannot follow a resize (a "
                        "number, or a size read from a fixed dim)")
                out[i] = fixed_dim(out_shape[i])
    return TensorLayout(out)


def _merged(ctx: OpContext, dims: Sequence[Dim], shape: Sequence[int]) -> Dim:
    """A run of dims (of sizes ``shape``) merged into one: groups only in the outermost dim
    (their blocks grow by the inner sizes), or in the only elastic dim under fixed outer dims
    (a copy of it per entry of the outer dims: heads of ``head_dim`` features merged into one
    feature dim)."""
    if is_fixed(dims[0]) and sum(not is_fixed(d) for d in dims) == 1:
        j = next(k for k, d in enumerate(dims) if not is_fixed(d))
        outer, inner = math.prod(shape[:j]), math.prod(shape[j + 1:])
        return concat_dims([scale_block(dims[j], inner)] * outer)
    if any(not is_fixed(d) for d in dims[1:]):
        if not all(_producerless(ctx, d) for d in dims[1:]):
            ctx.unsupported("merging dims with an elastic inner dim")
        for d in dims[1:]:  # a parameter's dims (a kernel) nothing has resized yet
            ctx.fix(d, "a parameter dim merged into an outer dim")
    return scale_block(dims[0], math.prod(shape[1:]))


def _unflatten_dim(ctx: OpContext, dim: Dim, sizes: Sequence[int], literal: Sequence[bool]
                   ) -> list[Dim]:
    """One elastic dim reshaped into dims of ``sizes`` (outermost first).

    The outer dim takes the groups where it indexes whole units (``(C*49,)`` into
    ``(C, 7, 7)``) or whole groups of units (channels into ``(heads, head_dim)``, unless the
    number of heads is written as a number). Otherwise the dim is read as ``sizes[0]`` equal
    *blocks* (``(3*C,)`` into ``(3, C)``, two concatenated branches into ``(2, C)`` before a
    channel shuffle): it is cut there (:func:`cut_dim`), the blocks are tied entry by entry
    (the inner dims are one layout for all of them) and the outer dim is fixed. Where both
    readings hold (BLOOM's fused ``(heads, 3, head_dim)``), heads come first and the blocks
    are the alternative (:meth:`OpContext.offer_alternative`) taken if the heads end constant:
    then every head keeps the same ``head_dim`` entries of its query, key and value.
    """
    first = sizes[0]
    out = [fixed_dim(s) for s in sizes]
    seg = dim[0]
    single = len(dim) == 1 and seg.group is not None
    if single and first % seg.units == 0 and seg.block % (first // seg.units) == 0:
        out[0] = (Seg(seg.group, seg.units, first // seg.units),)
        return out
    heads = single and seg.units % first == 0
    size = dim_size(dim)
    blocks = first > 1 and size % first == 0
    if heads and not literal[0] and not (blocks and ctx.alternative):
        assert seg.group is not None  # e.g. channels into (heads, head_dim)
        ctx.table.constrain(seg.group, first)
        out[0] = (Seg(seg.group, first, 1),)
        if blocks and len(sizes) > 1:
            ctx.offer_alternative(out[0])
        return out
    if blocks:  # a concatenation (a shuffle's branches) may keep a unit it cuts whole
        pieces = cut_dim(ctx, dim, [size // first] * first, pin_straddled=not single)
        if not single:
            pieces = aligned_pieces(ctx, pieces)
        piece = concat_dims([ctx.table.resolve(ctx.unify(*pieces))])
        if len(sizes) == 2:
            out[1] = piece
        elif not is_fixed(piece):
            out[1:] = _unflatten_dim(ctx, piece, sizes[1:], literal[1:])
        return out
    if heads:
        assert seg.group is not None
        ctx.table.constrain(seg.group, first)
        out[0] = (Seg(seg.group, first, 1),)
        return out
    ctx.unsupported(f"splitting an elastic dim of {size} entries into {list(sizes)}")


def view(ctx: OpContext) -> Layout:
    """``view``/``reshape`` (method or function) to an explicit shape."""
    node = ctx.node
    shape_args: Any = node.args[1:] if node.op == "call_method" else node.args[1:2]
    if node.op == "call_method" and len(shape_args) == 1 and isinstance(
            shape_args[0], (tuple, list)):
        shape_args = shape_args[0]
    elif node.op == "call_function" and shape_args:
        shape_args = shape_args[0]
    if not shape_args:
        shape_args = node.kwargs.get("shape", ())
    items, raws = _shape_items(ctx, shape_args)
    return reshape_to(ctx, ctx.arg(0, "input"), items, raws)


def unflatten(ctx: OpContext) -> Layout:
    """``unflatten(x, dim, sizes)`` (method or function): the view of ``x``'s shape with
    ``dim`` replaced by ``sizes``, under :func:`reshape_to`'s rule. The dims it does not
    name keep their own sizes, so only ``sizes`` are checked."""
    x = ctx.arg(0, "input")
    rank = len(ctx.shape(x))
    d = norm_dim(int(ctx.val(ctx.arg(1, "dim"))), rank)
    items, raws = _shape_items(ctx, ctx.arg(2, "sizes"))
    keep: list[Any] = [None] * d
    rest: list[Any] = [None] * (rank - d - 1)
    return reshape_to(ctx, x, [*keep, *items, *rest], [*keep, *raws, *rest])


def view_as(ctx: OpContext) -> Layout:
    """``x.view_as(y)``/``x.reshape_as(y)``: ``x.view(y.shape)``, each size read from a dim
    of ``y``."""
    other = ctx.tensor_layout(ctx.arg(1, "other"))
    items = [SizeLayout((dim,)) for dim in other]
    return reshape_to(ctx, ctx.arg(0, "input"), items, [None] * len(items))


def _shape_items(ctx: OpContext, shape_args: Any) -> tuple[list[Any], list[Any]]:
    """The size arguments of a reshape, one per output dim: each a traced size's layout or a
    value (``items``), with the argument it was written as (``raws``; ``None`` for a size of
    a shape read from a tensor)."""
    items: list[Any] = []
    raws: list[Any] = []
    for a in shape_args if isinstance(shape_args, (tuple, list)) else (shape_args,):
        al = ctx.layout(a) if isinstance(a, torch.fx.Node) else None
        if isinstance(al, tuple) and not isinstance(al, SizeLayout):
            items.extend(al)  # x.view(y.shape), x.view(x.shape[:-1] + (h, d))
            raws.extend(_joined_shape_args(ctx, a) or [None] * len(al))
        else:
            items.append(a if al is None else al)
            raws.append(a)
    return items, raws


def reshape_to(ctx: OpContext, x: Any, items: Sequence[Any], raws: Sequence[Any]) -> Layout:
    """The one rule of every op that reshapes ``x`` to a shape given size by size
    (``view``, ``reshape``, ``unflatten``, ``view_as``): ``items`` holds, per output dim, a
    traced size's layout, a number (or ``-1``), or ``None`` for a dim the op keeps without
    naming it. A number cannot follow a resize (the dim it sizes is fixed); a traced size must
    keep sizing its dim (:func:`_size_follows_dim`), else both are pinned."""
    lay = ctx.tensor_layout(x)
    literal = [_is_literal_size(ctx, a) for a in items]
    fused = _split_fixed_part(ctx, lay, ctx.shape(x), ctx.out_shape(), items, raws)
    if fused is not None:
        out, done = fused
    else:
        out, done = reshape_layout(ctx, lay, ctx.shape(x), ctx.out_shape(), literal), -1
    if len(items) != len(out):
        return out
    dims = [ctx.table.resolve(d) for d in out]  # groups the reshape cut into blocks
    # sizes read directly first: a quotient by an attribute (``last // self.group_size``)
    # follows its dim once the attribute is tied to the dim it sizes
    order = sorted(range(len(items)), key=lambda i: isinstance(items[i], SizeLayout)
                   and items[i].derived)
    for i in order:
        item = items[i]
        if not isinstance(item, SizeLayout):
            continue
        if i != done and any(not is_fixed(d) for d in item) and not _size_follows_dim(
                ctx, item, dims[i], raws[i]):
            ctx.fix(item, "a size read from one dim reshapes another")
            ctx.fix(dims[i], "a size read from one dim reshapes another")
            dims[i] = fixed_dim(ctx.out_shape()[i])
        size_checked(ctx, item)  # a literal, checked above, or pinned
    return TensorLayout(dims)


def _size_follows_dim(ctx: OpContext, item: SizeLayout, dim: Dim, raw: Any) -> bool:
    """Whether ``item``, a traced size sizing ``dim`` in a reshape, keeps sizing it right
    under every resize (or is made to: an attribute tied, a same-size class)."""
    if _member_sizing(ctx, item, dim):
        return True
    if tie_size(ctx, item, dim):  # an int read from a module attribute
        return True
    if item.derived and (product_follows(ctx, raw, dim) or quotient_follows(ctx, raw, dim)):
        return True
    item = ctx.table.resolve_layout(item)
    if share_of_size(ctx, raw, dim):
        return True
    if not item.derived and len(item) == 1 and tie_equal_sizes(ctx, item[0], dim):
        return True
    if not item.derived and len(item) == 1 and keeps_size(ctx, item[0], dim):
        return True
    return is_fixed(dim) and stays_constant(ctx, raw, dim_size(dim))


def _member_sizing(ctx: OpContext, item: SizeLayout, dim: Dim) -> bool:
    """Whether ``item`` is a module attribute already a member of the one elastic group of
    ``dim`` and keeps ``dim``'s size under every resize (``num_experts``, a member of the
    expert positions kept in every routing group, sizing the ``n_group`` copies of them)."""
    if not picked_blocks_kept() or not isinstance(item, AttributeSize) or len(item) != 1:
        return False
    table = ctx.table
    own = table.resolve(item[0])
    roots = {table.find(s.group) for s in (*own, *dim) if s.group is not None}
    return (len(roots) == 1 and not is_fixed(own)
            and linear_size_of_dim(ctx, own) == linear_size_of_dim(ctx, dim))


def _is_literal_size(ctx: OpContext, item: Any) -> bool:
    """Whether a reshape's size argument cannot follow a resize: a number (other than -1),
    arithmetic on fixed sizes, or a size read from a dim no group sizes (``C`` of
    ``B, N, C = x.shape`` reshaping heads merged back, where ``x``'s channels are fixed)."""
    if isinstance(item, SizeLayout):
        return all(is_fixed(d) for d in ctx.table.resolve_layout(item))
    if isinstance(item, torch.fx.Node):
        item = item.meta.get("val")
    return type(item) is int and item != -1


def _split_fixed_part(ctx: OpContext, lay: TensorLayout, in_shape: Sequence[int],
                      out_shape: Sequence[int], items: Sequence[Any], raws: Sequence[Any]
                      ) -> tuple[TensorLayout, int] | None:
    """One elastic dim split into ``(n + c, *inner)`` with ``n`` a traced size and ``c`` a
    number: Falcon's multi-query ``fused_qkv.view(b, s, self.num_heads + 2, self.head_dim)``,
    query heads then one key and one value head.

    The dim is cut (:func:`cut_dim`) after ``n * inner`` entries: the tail's size is the
    number ``c`` times the inner sizes, so it is pinned; the head's group splits into ``n``
    units along the outer dim, and ``n`` is tied to them (an attribute becomes a member) or
    must keep their size. Returns the layout and the position of the outer dim (checked here),
    or ``None`` where the reshape is not of this form (the general rule then applies)."""
    chunks = _equal_product_runs(in_shape, out_shape)
    if len(items) != len(out_shape) or chunks is None:
        return None
    elastic = [(ca, cb) for ca, cb in chunks if any(not is_fixed(lay[i]) for i in ca)]
    if len(elastic) != 1 or len(elastic[0][0]) != 1 or len(elastic[0][1]) < 2:
        return None
    (a,), cb = elastic[0]
    o, raw = cb[0], raws[cb[0]]
    if not (isinstance(raw, torch.fx.Node) and raw.op == "call_function"
            and raw.target is operator.add and len(raw.args) == 2 and not raw.kwargs):
        return None
    n_arg, c = raw.args if type(raw.args[1]) is int else raw.args[::-1]
    n_lay = ctx.layout(n_arg)
    if type(c) is not int or c < 1 or not isinstance(n_lay, SizeLayout) or len(n_lay) != 1:
        return None
    n, inner = out_shape[o] - c, math.prod(out_shape[i] for i in cb[1:])
    dim = lay[a]
    if n < 1 or len(dim) != 1 or dim[0].group is None:
        return None
    try:
        head, tail = cut_dim(ctx, dim, [n * inner, c * inner])
    except Unsupported:
        return None
    ctx.fix(tail, "a size written as a number (the + in a fused view) fixes this part")
    head = ctx.table.resolve(head)
    if len(head) != 1 or head[0].group is None or head[0].units % n:
        ctx.fix(head, "a fused view cuts inside a unit")
        return None
    g = head[0].group
    ctx.table.constrain(g, n)
    outer: Dim = (Seg(g, n, 1), Seg(None, c, 1))
    if tie_size(ctx, n_lay, outer[:1]) or (
            not n_lay.derived and keeps_size(ctx, n_lay[0], outer[:1])):
        if isinstance(items[o], SizeLayout):
            size_checked(ctx, items[o])
    else:
        ctx.fix(n_lay, "a size read from one dim reshapes another")
        ctx.fix(outer, "a size read from one dim reshapes another")
        outer = fixed_dim(out_shape[o])
    dims = [fixed_dim(k) for k in out_shape]
    for ca, cbx in chunks:
        if len(ca) == 1 and len(cbx) == 1:
            dims[cbx[0]] = lay[ca[0]]
    dims[o] = outer
    return TensorLayout(dims), o


def _joined_shape_args(ctx: OpContext, node: torch.fx.Node) -> list[Any] | None:
    """The arguments each entry of a shape joined from tuples (:func:`joined_shape`) was
    written with (``None`` for an entry of a shape read from a tensor)."""
    if not (node.op == "call_function" and node.target is operator.add):
        return None
    out: list[Any] = []
    for arg in node.args:
        if isinstance(arg, (tuple, list)):
            out.extend(arg)
        elif isinstance(arg, torch.fx.Node):
            out.extend(_joined_shape_args(ctx, arg) or [None] * len(ctx.val(arg)))
        else:
            return None
    return out


def flatten(ctx: OpContext) -> Layout:
    """``flatten``: dims merged, none split; the target shape is the node's value."""
    x = ctx.arg(0, "input")
    return reshape_layout(ctx, ctx.tensor_layout(x), ctx.shape(x), ctx.out_shape())


def permute(ctx: OpContext) -> Layout:
    x = ctx.arg(0, "input")
    lay = ctx.tensor_layout(x)
    node = ctx.node
    dims: Any = node.args[1:] if node.op == "call_method" else ctx.arg(1, "dims")
    if node.op == "call_method" and len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = dims[0]
    if not dims:
        dims = node.kwargs.get("dims", ())
    order = [norm_dim(int(ctx.val(d)), len(lay)) for d in dims]
    return TensorLayout(lay[i] for i in order)


def transpose(ctx: OpContext) -> Layout:
    x = ctx.arg(0, "input")
    lay = list(ctx.tensor_layout(x))
    a = norm_dim(int(ctx.val(ctx.arg(1, "dim0"))), len(lay))
    b = norm_dim(int(ctx.val(ctx.arg(2, "dim1"))), len(lay))
    lay[a], lay[b] = lay[b], lay[a]
    return TensorLayout(lay)


def matrix_transpose(ctx: OpContext) -> Layout:
    lay = list(ctx.tensor_layout(ctx.arg(0, "input")))
    if len(lay) >= 2:
        lay[-1], lay[-2] = lay[-2], lay[-1]
    return TensorLayout(lay)


def unsqueeze(ctx: OpContext) -> Layout:
    lay = list(ctx.tensor_layout(ctx.arg(0, "input")))
    d = norm_dim(int(ctx.val(ctx.arg(1, "dim"))), len(lay) + 1)
    lay.insert(d, fixed_dim(1))
    return TensorLayout(lay)


def squeeze(ctx: OpContext) -> Layout:
    x = ctx.arg(0, "input")
    lay = ctx.tensor_layout(x)
    shape = ctx.shape(x)
    dims = dims_arg(ctx, 1, "dim", len(lay))
    drop = [i for i, s in enumerate(shape) if s == 1 and (dims is None or i in dims)]
    for i in drop:
        if not is_fixed(lay[i]):
            ctx.fix(lay[i], "a size-1 elastic dim is squeezed away")
    return TensorLayout(d for i, d in enumerate(lay) if i not in drop)


def expand(ctx: OpContext) -> Layout:
    """``expand``/``expand_as``/``repeat``: dims that keep their size keep their groups (a
    module attribute giving that size is tied to the dim); a dim of one entry expanded to a
    size read directly from an elastic dim takes that dim's groups (every entry is the same
    copy, so any subset or order of them is too); one expanded to a traced size that keeps
    its value under every resize (``self.num_experts // self.num_group`` where the experts
    are whole routing groups: :mod:`.linear_sizes`) stays a dim of fixed size."""
    x = ctx.arg(0, "input")
    lay = ctx.tensor_layout(x)
    shape = ctx.shape(x)
    out_shape = ctx.out_shape()
    n = len(out_shape)
    name = ctx.node.target if isinstance(ctx.node.target, str) else ""
    raws = _expand_args(ctx, n) if name == "expand" else None
    sizes = None if raws is None else [_expand_size(ctx, a) for a in raws]
    dims: list[Dim] = []
    for i in range(n):
        j = i - (n - len(shape))
        size = sizes[i] if sizes is not None else -1
        if j >= 0 and shape[j] == out_shape[i]:
            if isinstance(size, SizeLayout) and (tie_size(ctx, size, lay[j]) or same_dim(
                    ctx, ctx.table.resolve(lay[j]), ctx.table.resolve_layout(size)[0])):
                size_checked(ctx, size)  # x.expand(b, x.size(1), h, w), self.num_group
            elif sizes is not None and size != -1 and not is_fixed(lay[j]):
                ctx.fix(lay[j], "expand to a size that does not follow an elastic dim")
                dims.append(fixed_dim(out_shape[i]))
                continue
            dims.append(ctx.table.resolve(lay[j]))
        elif (isinstance(size, SizeLayout) and not isinstance(size, AttributeSize)
              and (j < 0 or shape[j] == 1)):
            # a broadcast to a size read from a dim (k_rot.expand(-1, heads, -1, -1)): copies
            # of one entry, as many as that dim keeps, so the output dim follows its group
            size_checked(ctx, size)
            dims.append(ctx.table.resolve_layout(size)[0])
        elif (j < 0 or shape[j] == 1) and raws is not None and (
                followed := _dim_sized_by(ctx, raws[i])) is not None:
            # a broadcast to a traced size equal to one elastic dim it reads under every
            # resize (``self.num_experts // self.num_group`` of one routing group): the same
            # copies, as many as that dim keeps
            size_checked(ctx, ctx.layout(raws[i]))
            dims.append(followed)
        else:
            if j >= 0 and not is_fixed(lay[j]):
                ctx.fix(lay[j], f"{name or 'expand'} changes an elastic dim")
            elif raws is not None and isinstance(raws[i], torch.fx.Node):
                lay_i = ctx.layout(raws[i])
                if isinstance(lay_i, SizeLayout) and linear_size_of_int(
                        ctx, raws[i], pin=False) == (out_shape[i], {}):
                    size_checked(ctx, lay_i)  # a size constant under every resize
            dims.append(fixed_dim(out_shape[i]))
    return TensorLayout(dims)


def _dim_sized_by(ctx: OpContext, raw: Any) -> Dim | None:
    """The elastic dim, of those the traced size ``raw`` is computed from, whose size
    ``raw`` equals under every resize (:mod:`.linear_sizes`), or ``None``."""
    lay = ctx.layout(raw) if isinstance(raw, torch.fx.Node) else None
    if not isinstance(lay, SizeLayout):
        return None
    form = linear_size_of_int(ctx, raw, pin=False)
    if form is None or not form[1]:
        return None
    dims: list[Dim] = list(ctx.table.resolve_layout(lay))
    found = [d for d in dims if not is_fixed(d) and linear_size_of_dim(ctx, d) == form]
    if found:
        return found[0]
    if not picked_blocks_kept():
        return None
    # the size is one unit of a group the dims hold (``num_experts // num_group`` where
    # ``num_experts`` holds ``num_group`` entries a kept expert position): the copies follow
    # that group, one copy a unit
    table = ctx.table
    for d in dims:
        for seg in d:
            if seg.group is None or table.is_constant(seg.group):
                continue
            root = table.find(seg.group)
            whole: Dim = (Seg(root, table.units[root], 1),)
            if linear_size_of_dim(ctx, whole) == form:
                return whole
    return None


def _expand_args(ctx: OpContext, n: int) -> list[Any] | None:
    """The ``n`` size arguments of ``x.expand(...)``, as written; ``None`` if they cannot be
    read."""
    args: Any = ctx.node.args[1:] or ctx.node.kwargs.get("size", ())
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = args[0]
    return list(args) if len(args) == n else None


def _expand_size(ctx: OpContext, a: Any) -> Any:
    """An expand size: its layout where it is a traced size read directly from one dim or
    an attribute, ``-1``, or another int."""
    lay = ctx.layout(a) if isinstance(a, torch.fx.Node) else None
    direct = isinstance(lay, SizeLayout) and not lay.derived and len(lay) == 1
    return lay if direct else ctx.val(a)


def view_as_complex(ctx: OpContext) -> Layout:
    """``view_as_complex(x)``: ``x``'s last dim, two fixed entries (real and imaginary parts),
    becomes one complex entry; the other dims keep their groups. An elastic last dim is not
    mapped."""
    lay = ctx.tensor_layout(ctx.arg(0, "input"))
    if not lay or not is_fixed(lay[-1]) or dim_size(lay[-1]) != 2:
        ctx.unsupported("view_as_complex of a last dim that is not two fixed entries")
    return TensorLayout(lay[:-1])


def view_as_real(ctx: OpContext) -> Layout:
    """``view_as_real(z)``: each complex entry becomes a new last dim of two fixed entries."""
    lay = ctx.tensor_layout(ctx.arg(0, "input"))
    return TensorLayout([*lay, fixed_dim(2)])


def _producerless(ctx: OpContext, dim: Dim) -> bool:
    """Whether every group in ``dim`` has no producer (it only holds parameter dims)."""
    return all(s.group is None or not ctx.table.producers.get(ctx.table.find(s.group))
               for s in dim)

