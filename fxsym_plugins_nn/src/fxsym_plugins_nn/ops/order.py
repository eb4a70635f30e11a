"""Reductions and ops that depend on the order of entries along a dim.

A value reduction (``sum``, ``amax``, ``var``, the values of ``max(x, d)``) is invariant under
a permutation of the dims it reduces: their groups end there and stay searchable. An op whose
result holds or follows positions (``argmax``, ``topk``, ``sort``, ``cumsum``, ``gather``,
``scatter``, ``nonzero``...) depends on the order or the number of entries of the dims it works
along: exactly those are pinned, every other dim passes through (``docs/design.md``,
"Order-dependent ops").
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from fxsym.analysis import (
    Dim,
    Layout,
    OpContext,
    SizeLayout,
    TensorLayout,
    dim_size,
    fixed_dim,
    is_fixed,
    scale_block,
    size_checked,
)

from .common import (
    BY_POSITION,
    ORDER,
    POSITIONS,
    Rule,
    checked_layout,
    dims_arg_value,
    norm_dim,
    op_name,
    pin_dims,
    pin_extra_tensors,
    tensor_args,
)
from .creation import arange, one_hot
from .elementwise import broadcast_layouts, elementwise
from .linear_sizes import linear_size_of_dim, linear_size_of_int, stays_constant
from .slicing import narrow, select


def _indices_read(node: torch.fx.Node) -> bool:
    """Whether the indices of a ``(values, indices)`` result are used (not only the values)."""
    for user in node.users:
        which: Any = None
        if user.op == "call_function" and user.target is operator.getitem:
            which = user.args[1]
        elif user.op == "call_function" and user.target is getattr:
            which = {"values": 0, "indices": 1}.get(str(user.args[1]))
        if which == 0 or (which == 1 and not user.users):
            continue
        return True
    return False


def reduce_rule(*, dim_at: int = 1, keepdim_at: int = 2, default: int | None = None,
                why: str | None = None, pin_if_indices: bool = False) -> Rule:
    """Reductions: the reduced dims end their groups; the other dims pass through.

    A value reduction (``sum``, ``amax``, ``var``, ``max(x, d).values``) is invariant under a
    permutation of the reduced dim, so its groups stay searchable: they end here. An op whose
    result says *where* entries are (``argmax``, the indices of ``max``/``median``/``mode``
    with a dim) or that needs a number of entries (``kthvalue``'s k) depends on the order or
    size of the reduced dims: ``why`` pins them (with ``pin_if_indices``, only when the
    indices are read). Without a dim, a position-returning op addresses the flattened
    tensor: every elastic dim is pinned.
    """

    def rule(ctx: OpContext) -> Layout:
        other = ctx.arg(1, "other", None)
        if isinstance(other, torch.fx.Node) and isinstance(ctx.layout(other), TensorLayout):
            return elementwise(ctx)  # torch.max(a, b): the binary, elementwise form
        x = ctx.arg(0, "input")
        lay = ctx.tensor_layout(x)
        raw = ctx.val(ctx.arg(dim_at, "dim", default))
        if isinstance(raw, bool):  # std(x, unbiased): a whole-tensor reduction
            raw = None
        dims = None if raw is None else dims_arg_value(raw, len(lay))
        keepdim = bool(ctx.val(ctx.arg(keepdim_at, "keepdim", False)))
        value = ctx.value
        pin = why is not None and (not pin_if_indices or (
            isinstance(value, tuple) and _indices_read(ctx.node)))
        if dims is None:
            if pin:
                pin_dims(ctx, list(lay), f"{why} (the flattened tensor)")
            return ctx.fixed()
        if pin:
            pin_dims(ctx, [lay[i] for i in dims], why or "")
        out: list[Dim] = []
        for i, d in enumerate(lay):
            if i in dims:
                if keepdim:
                    out.append(fixed_dim(1))
            else:
                out.append(d)
        if isinstance(value, tuple):  # (values, indices)
            return tuple(checked_layout(ctx, out, v) for v in value)
        return checked_layout(ctx, out, value)

    return rule


reduction = reduce_rule()


def _positional_dims(ctx: OpContext, dim_at: int, name: str, default: Any, ndim: int,
                     varargs: bool = False) -> list[int] | None:
    """The dims an order-dependent op works along (``None``: the flattened tensor)."""
    node = ctx.node
    if varargs and node.op == "call_method" and len(node.args) > dim_at + 1:
        raw: Any = list(node.args[dim_at:])
    else:
        raw = ctx.val(ctx.arg(dim_at, name, default))
    return None if raw is None else dims_arg_value(raw, ndim)


def along(why: str, *, dim_at: int = 1, name: str = "dim", default: Any = None,
          varargs: bool = False, dims: Sequence[int] | None = None) -> Rule:
    """Ops that work along some dims and depend on the order of their entries (``cumsum``,
    ``flip``, ``roll``, ``sort``, ``topk``, ``diff``, ``tril``...): those dims are pinned,
    every other dim passes through. The dims are argument ``dim_at``/``name`` (``varargs``:
    the method also takes them as ``x.flip(0, 1)``), or always ``dims``; ``None`` means the
    flattened tensor: every dim is pinned."""

    def rule(ctx: OpContext) -> Layout:
        x = ctx.arg(0, "input")
        lay = ctx.tensor_layout(x)
        worked: list[int] | None
        if dims is not None:
            worked = dims_arg_value(list(dims), len(lay))
        else:
            worked = _positional_dims(ctx, dim_at, name, default, len(lay), varargs)
        if worked is None:
            worked = list(range(len(lay)))
        pin_dims(ctx, [lay[i] for i in worked], why)
        pin_extra_tensors(ctx, x)
        value = ctx.value
        out = []
        for v in value if isinstance(value, tuple) else (value,):
            if not isinstance(v, torch.Tensor):
                ctx.unsupported("expected tensor results")
            if v.dim() == len(lay):
                kept = [fixed_dim(v.shape[i]) if i in worked else d for i, d in enumerate(lay)]
            else:  # the dims worked along were reduced away (kthvalue, mode)
                kept = [d for i, d in enumerate(lay) if i not in worked]
            out.append(checked_layout(ctx, kept, v))
        return tuple(out) if isinstance(value, tuple) else out[0]

    return rule


def pin_all(why: str) -> Rule:
    """Ops over the flattened tensor whose result holds or follows positions (``nonzero``,
    ``masked_select``, ``take``, ``unique``...): every elastic dim of every operand pinned."""

    def rule(ctx: OpContext) -> Layout:
        for a in tensor_args(ctx):
            pin_dims(ctx, ctx.layout(a), why)
        return ctx.fixed()

    return rule


def where(ctx: OpContext) -> Layout:
    """``torch.where(c, a, b)`` is elementwise; ``torch.where(c)`` returns positions."""
    if len(tensor_args(ctx)) == 1 and isinstance(ctx.value, tuple):
        return pin_all(f"(one argument) {POSITIONS}")(ctx)
    return elementwise(ctx)


def gather(ctx: OpContext) -> Layout:
    """``gather(x, d, index)``: ``index`` holds positions along ``x``'s dim ``d`` (pinned);
    the result has ``index``'s layout along ``d`` and ties the other dims of both."""
    x, index = ctx.arg(0, "input"), ctx.arg(2, "index")
    lx, li = ctx.tensor_layout(x), ctx.tensor_layout(index)
    sx, si = ctx.shape(x), ctx.shape(index)
    d = norm_dim(int(ctx.val(ctx.arg(1, "dim"))), len(lx))
    pin_dims(ctx, lx[d], BY_POSITION)
    return checked_layout(ctx, gathered_dims(ctx, lx, li, sx, si, d), ctx.value)


def gathered_dims(ctx: OpContext, lx: TensorLayout, li: TensorLayout, sx: Sequence[int],
                  si: Sequence[int], d: int) -> list[Dim]:
    """The dims of ``gather(x, d, index)``'s result: ``index``'s along ``d``; every other dim
    tied to ``x``'s where their sizes agree, else both pinned (a part of it is read)."""
    dims: list[Dim] = []
    for k in range(len(li)):
        if k == d:
            dims.append(li[k])
        elif sx[k] == si[k]:
            dims.append(ctx.unify(lx[k], li[k]))
        else:
            pin_dims(ctx, [lx[k], li[k]], "reads a part of an elastic dim")
            dims.append(fixed_dim(si[k]))
    return dims


def take_along_dim(ctx: OpContext) -> Layout:
    """``take_along_dim(x, indices, d)``: ``gather`` with broadcasting; no ``d``: positions
    into the flattened ``x``."""
    x, index = ctx.arg(0, "input"), ctx.arg(1, "indices")
    lx, li = ctx.tensor_layout(x), ctx.tensor_layout(index)
    raw = ctx.val(ctx.arg(2, "dim", None))
    if raw is None:
        pin_dims(ctx, lx, f"{BY_POSITION} (the flattened tensor)")
        return checked_layout(ctx, list(li), ctx.value)
    d = norm_dim(int(raw), len(lx))
    pin_dims(ctx, lx[d], BY_POSITION)
    out_shape = ctx.out_shape()
    drop = [TensorLayout(lay[:d] + lay[d + 1:]) for lay in (lx, li)]
    shapes = [s[:d] + s[d + 1:] for s in (ctx.shape(x), ctx.shape(index))]
    rest = list(broadcast_layouts(ctx, drop, shapes, out_shape[:d] + out_shape[d + 1:]))
    rest.insert(d, li[d])
    return checked_layout(ctx, rest, ctx.value)


def index_select(ctx: OpContext) -> Layout:
    """``index_select(x, d, index)``: the result's dim ``d`` follows the 1-D ``index``."""
    x, index = ctx.arg(0, "input"), ctx.arg(2, "index")
    lx, li = ctx.tensor_layout(x), ctx.tensor_layout(index)
    d = norm_dim(int(ctx.val(ctx.arg(1, "dim"))), len(lx))
    pin_dims(ctx, lx[d], BY_POSITION)
    dims = list(lx)
    dims[d] = li[0] if len(li) == 1 else fixed_dim(1)
    return checked_layout(ctx, dims, ctx.value)


def scatter(ctx: OpContext) -> Layout:
    """``scatter``/``scatter_add``/``scatter_reduce`` (and in-place forms): ``index`` holds
    positions along ``x``'s dim ``d`` (pinned, with ``index``'s and ``src``'s own dim ``d``);
    the other dims tie where ``index`` and ``src`` cover all of ``x``, else are pinned."""
    x, index = ctx.arg(0, "input"), ctx.arg(2, "index")
    src = ctx.arg(3, "src", None)
    lx, li = ctx.tensor_layout(x), ctx.tensor_layout(index)
    sx, si = ctx.shape(x), ctx.shape(index)
    operands = [(li, si)]
    if isinstance(src, torch.fx.Node) and isinstance(ctx.layout(src), TensorLayout):
        operands.append((ctx.tensor_layout(src), ctx.shape(src)))
    d = norm_dim(int(ctx.val(ctx.arg(1, "dim"))), len(lx))
    pin_dims(ctx, [lx[d], *(lay[d] for lay, _ in operands)], BY_POSITION)
    dims = list(lx)
    for k in range(len(lx)):
        if k == d:
            dims[k] = fixed_dim(sx[k])
        elif all(s[k] == sx[k] for _, s in operands):
            dims[k] = ctx.unify(lx[k], *(lay[k] for lay, _ in operands))
        else:
            pin_dims(ctx, [lx[k], *(lay[k] for lay, _ in operands)],
                     "writes a part of an elastic dim")
    return checked_layout(ctx, dims, ctx.value)


def index_update(ctx: OpContext) -> Layout:
    """``index_add``/``index_copy``/``index_fill``/``index_reduce``: the 1-D ``index`` holds
    positions along ``x``'s dim ``d`` (pinned, with the source's dim ``d``); the source's
    other dims tie with ``x``'s."""
    x, index = ctx.arg(0, "input"), ctx.arg(2, "index")
    lx = ctx.tensor_layout(x)
    d = norm_dim(int(ctx.val(ctx.arg(1, "dim"))), len(lx))
    pin_dims(ctx, [lx[d], ctx.tensor_layout(index)], BY_POSITION)
    dims = list(lx)
    dims[d] = fixed_dim(ctx.shape(x)[d])
    source = ctx.arg(3, "source", None)
    if isinstance(source, torch.fx.Node) and isinstance(ctx.layout(source), TensorLayout):
        ls = ctx.tensor_layout(source)
        if ctx.shape(source) == () or len(ls) != len(lx):
            pin_dims(ctx, ls, BY_POSITION)
        else:
            pin_dims(ctx, ls[d], BY_POSITION)
            for k in range(len(lx)):
                if k != d:
                    dims[k] = ctx.unify(lx[k], ls[k])
    return checked_layout(ctx, dims, ctx.value)


def index_put(ctx: OpContext) -> Layout:
    """``index_put(x, (i0, i1, ...), values)``: the index tensors hold positions along
    ``x``'s leading dims (pinned); ``values`` ties with ``x``'s remaining dims from the
    right."""
    x, indices, values = ctx.arg(0, "input"), ctx.arg(1, "indices"), ctx.arg(2, "values")
    lx, sx = ctx.tensor_layout(x), ctx.shape(x)
    if not isinstance(indices, (tuple, list)) or any(i is None for i in indices):
        ctx.unsupported("index_put with missing index tensors")
    n = len(indices)
    pin_dims(ctx, [*lx[:n], *(ctx.tensor_layout(i) for i in indices)], BY_POSITION)
    dims = list(lx)
    for k in range(n):
        dims[k] = fixed_dim(sx[k])
    if isinstance(values, torch.fx.Node) and isinstance(ctx.layout(values), TensorLayout):
        lv, sv = ctx.tensor_layout(values), ctx.shape(values)
        for j in range(1, len(lv) + 1):
            k = len(lx) - j
            if k >= n and sv[-j] == sx[k]:
                dims[k] = ctx.unify(dims[k], lv[-j])
            elif not is_fixed(lv[-j]):
                pin_dims(ctx, lv[-j], "broadcasts its values by position")
    return checked_layout(ctx, dims, ctx.value)


def diagonal(ctx: OpContext) -> Layout:
    """``diagonal``/``diag``/``trace``: the main diagonal of two equal dims follows a joint
    permutation of both, so they tie; an offset diagonal, or a non-square one, pins them."""
    x = ctx.arg(0, "input")
    lay = list(ctx.tensor_layout(x))
    shape = ctx.shape(x)
    name = op_name(ctx)
    if name == "diagonal":
        offset = int(ctx.val(ctx.arg(1, "offset", 0)))
        a = norm_dim(int(ctx.val(ctx.arg(2, "dim1", 0))), len(lay))
        b = norm_dim(int(ctx.val(ctx.arg(3, "dim2", 1))), len(lay))
    else:
        offset = 0 if name == "trace" else int(ctx.val(ctx.arg(1, "diagonal", 0)))
        a, b = 0, len(lay) - 1
    if offset == 0 and shape[a] == shape[b]:
        tied = ctx.unify(lay[a], lay[b])
    else:
        pin_dims(ctx, [lay[a], lay[b]], "takes an off-centre diagonal of an elastic dim")
        tied = fixed_dim(min(shape[a], shape[b]))
    if name == "trace":
        return ctx.fixed()
    if name == "diag" and len(lay) == 1:  # a vector becomes a diagonal matrix
        n = ctx.out_shape()[0]
        d = tied if offset == 0 else fixed_dim(n)
        return checked_layout(ctx, [d, d], ctx.value)
    rest = [d for i, d in enumerate(lay) if i not in (a, b)]
    return checked_layout(ctx, [*rest, tied], ctx.value)


def cross(ctx: OpContext) -> Layout:
    """``cross(a, b, dim)``: elementwise over the other dims; the 3 entries of ``dim`` are
    x, y, z by position."""
    out = elementwise(ctx)
    default = -1 if ctx.node.target is torch.linalg.cross else None
    raw = ctx.val(ctx.arg(2, "dim", default))
    shape = ctx.out_shape()
    d = norm_dim(int(raw), len(shape)) if raw is not None else shape.index(3)
    pin_dims(ctx, out[d], BY_POSITION)
    return out


def repeat_interleave(ctx: OpContext) -> Layout:
    """``repeat_interleave(x, r, d)`` with an int ``r``: each unit along ``d`` becomes ``r``
    times longer, in place, so the group follows (a longer block); a traced ``r`` must keep
    its value under every resize (``value.shape[-2] // key.shape[-2]``, value heads per key
    head). Tensor repeats, or no dim (the flattened tensor), place entries by position:
    pinned."""
    x = ctx.arg(0, "input")
    lay = list(ctx.tensor_layout(x))
    repeats = ctx.arg(1, "repeats", None)
    if repeats is None:  # torch.repeat_interleave(counts): positions
        return pin_all(POSITIONS)(ctx)
    raw = ctx.val(ctx.arg(2, "dim", None))
    if raw is None and len(lay) != 1:
        return pin_all(f"{BY_POSITION} (the flattened tensor)")(ctx)
    d = 0 if raw is None else norm_dim(int(raw), len(lay))
    r = ctx.val(repeats)
    follows = _repeats_follow_a_dim(ctx, lay[d], repeats) if isinstance(r, int) else None
    if follows is not None:
        lay[d] = follows
    elif isinstance(r, int):
        lay[d] = scale_block(lay[d], r)
        size = ctx.layout(repeats) if isinstance(repeats, torch.fx.Node) else None
        if isinstance(size, SizeLayout) and stays_constant(ctx, repeats, r):
            size_checked(ctx, size)  # value heads per key head, a constant
    else:
        pin_dims(ctx, lay[d], "repeats the entries of an elastic dim unevenly")
        pin_extra_tensors(ctx, x)
        lay[d] = fixed_dim(ctx.out_shape()[d])
    return checked_layout(ctx, lay, ctx.value)


def _repeats_follow_a_dim(ctx: OpContext, dim: Dim, repeats: Any) -> Dim | None:
    """The dim a ``repeat_interleave`` of a dim of one entry makes, where the repeats are a
    size that keeps following a dim under every resize (``B.repeat_interleave(num_heads //
    n_groups, dim=2, output_size=num_heads)`` in transformers' Mamba2 scan, ``n_groups`` 1
    and ``num_heads`` read from the heads' dim): the entry is broadcast, as by ``expand``, so
    the result has that dim's groups. ``output_size``, where given, must follow it too;
    ``None`` otherwise (the caller's rule applies)."""
    if dim_size(dim) != 1 or not is_fixed(dim) or not isinstance(repeats, torch.fx.Node):
        return None
    form = linear_size_of_int(ctx, repeats, pin=False)
    if form is None or not form[1]:
        return None
    given = ctx.arg(3, "output_size", None)
    sizes = [ctx.layout(repeats)]
    candidates = [given, repeats] if given is not None else [repeats]
    target: Dim | None = None
    for c in candidates:
        lay = ctx.layout(c) if isinstance(c, torch.fx.Node) else None
        if isinstance(lay, SizeLayout) and not lay.derived and len(lay) == 1:
            target = ctx.table.resolve(lay[0])
            break
    if target is None or linear_size_of_dim(ctx, target) != form:
        return None
    if given is not None:
        if linear_size_of_int(ctx, given, pin=False) != form:
            return None
        sizes.append(ctx.layout(given))
    for size in sizes:
        if isinstance(size, SizeLayout):
            size_checked(ctx, size)
    return target


def searchsorted(ctx: OpContext) -> Layout:
    """``searchsorted(seq, values)``: positions along ``seq``'s last dim (pinned); the result
    has ``values``' layout, and ``seq``'s leading dims tie with ``values``'."""
    seq, values = ctx.arg(0, "sorted_sequence"), ctx.arg(1, "input")
    ls = ctx.tensor_layout(seq)
    pin_dims(ctx, ls[-1], POSITIONS)
    if not isinstance(ctx.layout(values), TensorLayout):
        return ctx.fixed()
    lv = list(ctx.tensor_layout(values))
    if len(ls) > 1:
        for k in range(len(ls) - 1):
            lv[k] = ctx.unify(lv[k], ls[k])
    return checked_layout(ctx, lv, ctx.value)


def bucketize(ctx: OpContext) -> Layout:
    """``bucketize(x, boundaries)``: positions in the 1-D ``boundaries`` (pinned); the result
    has ``x``'s layout."""
    x, boundaries = ctx.arg(0, "input"), ctx.arg(1, "boundaries")
    pin_dims(ctx, ctx.layout(boundaries), POSITIONS)
    if not isinstance(ctx.layout(x), TensorLayout):
        return ctx.fixed()
    return checked_layout(ctx, list(ctx.tensor_layout(x)), ctx.value)


def register_order_rules(register: Callable[[Any, Rule], None]) -> None:
    """Reductions that may return positions, and the ops whose result depends on the order
    (or the number) of the entries along a dim. Value reductions end a group and leave it
    searchable; the rest pin the dims they work along, and only those (see ``docs/design.md``,
    "Order-dependent ops")."""
    both = ((torch.max, "max"), (torch.min, "min"), (torch.median, "median"),
            (torch.nanmedian, "nanmedian"))
    for f, m in both:  # values are a reduction; indices are positions
        rule = reduce_rule(why=POSITIONS, pin_if_indices=True)
        register(f, rule)
        register(m, rule)
    mode = reduce_rule(default=-1, why=POSITIONS, pin_if_indices=True)
    kth = reduce_rule(dim_at=2, keepdim_at=3, default=-1,
                      why="needs k entries of an elastic dim and returns their positions")
    variance = reduce_rule(keepdim_at=3)  # std(x, dim, unbiased, keepdim)
    norm = reduce_rule(dim_at=2, keepdim_at=3)  # norm(x, p, dim, keepdim)
    arg = reduce_rule(why=POSITIONS)
    for rule, targets in (
        (mode, (torch.mode, "mode")),
        (kth, (torch.kthvalue, "kthvalue")),
        (variance, (torch.std, torch.var, "std", "var")),
        (norm, (torch.norm, "norm")),
        (arg, (torch.argmax, torch.argmin, "argmax", "argmin")),
        (along(ORDER), (torch.cumsum, torch.cumprod, torch.logcumsumexp, torch.cummax,
                        torch.cummin, "cumsum", "cumprod", "logcumsumexp", "cummax", "cummin",
                        "cumsum_", "cumprod_")),
        (along(ORDER, default=-1), (torch.sort, "sort")),
        (along(POSITIONS, default=-1), (torch.argsort, "argsort")),
        (along(ORDER, dims=(0,)), (torch.msort, "msort", torch.flipud, "flipud")),
        (along(ORDER, dims=(1,)), (torch.fliplr, "fliplr")),
        (along("needs k entries of an elastic dim and returns their positions", dim_at=2,
               default=-1), (torch.topk, "topk")),
        (along(ORDER, name="dims", varargs=True), (torch.flip, "flip")),
        (along(ORDER, dim_at=2, name="dims"), (torch.roll, "roll")),
        (along(ORDER, dim_at=2, name="dims", default=(0, 1)), (torch.rot90, "rot90")),
        (along(ORDER, dim_at=2, default=-1), (torch.diff, "diff")),
        (along(BY_POSITION, dims=(-2, -1)), (torch.tril, torch.triu, "tril", "triu", "tril_",
                                               "triu_")),
        (gather, (torch.gather, "gather")),
        (take_along_dim, (torch.take_along_dim, "take_along_dim")),
        (index_select, (torch.index_select, "index_select")),
        (scatter, (torch.scatter, torch.scatter_add, torch.scatter_reduce, "scatter",
                   "scatter_", "scatter_add", "scatter_add_", "scatter_reduce",
                   "scatter_reduce_")),
        (index_update, (torch.index_add, torch.index_copy, torch.index_fill,
                        torch.index_reduce, "index_add", "index_add_", "index_copy",
                        "index_copy_", "index_fill", "index_fill_", "index_reduce",
                        "index_reduce_")),
        (index_put, (torch.index_put, "index_put", "index_put_")),
        (pin_all(POSITIONS), (torch.nonzero, torch.argwhere, "nonzero", "argwhere",
                              torch.unique, torch.unique_consecutive, "unique",
                              "unique_consecutive", torch.bincount, "bincount")),
        (pin_all(f"{BY_POSITION} (the flattened tensor)"),
         (torch.masked_select, "masked_select", torch.take, "take", torch.masked_scatter,
          "masked_scatter", "masked_scatter_", "put", "put_")),
        (where, (torch.where,)),
        (diagonal, (torch.diagonal, "diagonal", torch.diag, "diag", torch.trace, "trace")),
        (cross, (torch.cross, "cross", torch.linalg.cross)),
        (narrow, (torch.narrow, "narrow")),
        (select, (torch.select, "select")),
        (repeat_interleave, (torch.repeat_interleave, "repeat_interleave")),
        (searchsorted, (torch.searchsorted,)),
        (bucketize, (torch.bucketize,)),
        (one_hot, (F.one_hot,)),
        (arange, (torch.arange,)),
    ):
        for t in targets:
            register(t, rule)

