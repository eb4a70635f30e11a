"""Op rules for torch functions, tensor methods and Python operators.

Each rule reads the input layouts from an :class:`fxsym.analysis.OpContext` and returns the
layout of the node's value. Where a mapping cannot be proven from the trace-time shapes the
rule raises through ``ctx.unsupported``: the node becomes a boundary, never a guess.
"""

from __future__ import annotations

import itertools
import math
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

Rule = Callable[[OpContext], Layout]
#: what an op rule is registered for: a function, or a method name
OpTarget = Callable[..., Any] | str


# -- helpers -----------------------------------------------------------------------------------
def _tensor_args(ctx: OpContext) -> list[Any]:
    out = []
    for a in (*ctx.node.args, *ctx.node.kwargs.values()):
        if isinstance(a, torch.fx.Node) and isinstance(ctx.layout(a), TensorLayout):
            out.append(a)
    return out


def _norm_dim(d: int, ndim: int) -> int:
    if not -max(ndim, 1) <= d < max(ndim, 1):
        raise IndexError(d)
    return d % max(ndim, 1)


def _broadcast(ctx: OpContext, layouts: Sequence[TensorLayout], shapes: Sequence[tuple[int, ...]],
               out_shape: tuple[int, ...]) -> TensorLayout:
    """Align layouts from the right; tie every dim whose size equals the output's."""
    n = len(out_shape)
    dims: list[Dim] = []
    for i in range(n):
        size = out_shape[i]
        candidates: list[Dim] = []
        for lay, shape in zip(layouts, shapes):
            j = i - (n - len(shape))
            if j < 0:
                continue
            if shape[j] == size:
                candidates.append(lay[j])
            elif shape[j] != 1:
                ctx.unsupported(f"cannot broadcast {shape} to {out_shape}")
            elif not is_fixed(lay[j]):  # a size-1 group broadcast: it must stay 1
                ctx.fix(lay[j], "broadcast against a larger dim")
        if size == 1 or not candidates:
            for c in candidates:
                if not is_fixed(c) and size != 1:
                    ctx.fix(c, "broadcast")
            dims.append(candidates[0] if candidates and size == 1 else fixed_dim(size))
            continue
        dims.append(ctx.unify(*candidates))
    return TensorLayout(dims)


# -- generic rules -----------------------------------------------------------------------------
def elementwise(ctx: OpContext) -> Layout:
    """Any number of tensor operands broadcast together (``a + b``, ``torch.where``...)."""
    args = _tensor_args(ctx)
    if not isinstance(ctx.value, torch.Tensor):
        if ctx.node.target is operator.add and isinstance(ctx.value, tuple):
            return _joined_shape(ctx)
        return _derived_size(ctx)
    if not args:
        return ctx.fixed()
    return _broadcast(ctx, [ctx.tensor_layout(a) for a in args], [ctx.shape(a) for a in args],
                      ctx.out_shape())


def same_as_input(ctx: OpContext) -> Layout:
    """The value has the layout of the first argument (activations, dropout, casts, clones)."""
    x = ctx.arg(0, "input")
    lay = ctx.layout(x)
    if not isinstance(lay, TensorLayout):
        return ctx.fixed()
    if ctx.shape(x) != ctx.out_shape():
        ctx.unsupported("expected the output shape to equal the input shape")
    if ctx.node.target in ("type_as", "to"):  # x.type_as(y): only y's dtype/device is read
        return lay
    for other in _tensor_args(ctx)[1:]:
        if other is not x:
            ctx.fix(ctx.layout(other), "extra tensor operand")
    return lay


def _derived_size(ctx: OpContext) -> Layout:
    """Arithmetic on sizes: the result follows every elastic dim it was computed from."""
    dims = [d for a in ctx.node.all_input_nodes
            if isinstance(lay := ctx.layout(a), SizeLayout) for d in lay if not is_fixed(d)]
    return SizeLayout(dims, derived=True) if dims else ctx.fixed()


def _joined_shape(ctx: OpContext) -> Layout:
    """``x.size()[:-1] + (self.num_heads, self.head_dim)``: a shape built by joining tuples.

    Its layout is the tuple of its entries' layouts, in order, so a reshape by it checks each
    entry against the dim it sizes: a size read from a shape stays a
    :class:`~fxsym.analysis.SizeLayout` (an int read from a module attribute, or arithmetic on
    one, is passed on, not used here: the reshape ties or pins it), and any other entry is
    kept as its int, which a reshape reads as a literal."""
    out: list[Any] = []
    for arg in ctx.node.args:
        lay = ctx.layout(arg) if isinstance(arg, torch.fx.Node) else None
        if isinstance(lay, tuple) and not isinstance(lay, (SizeLayout, TensorLayout)):
            entries = list(zip(lay, ctx.val(arg)))
        elif isinstance(arg, (tuple, list)):
            entries = [(ctx.layout(a), ctx.val(a)) for a in arg]
        else:
            return _derived_size(ctx)
        for entry, value in entries:
            if not isinstance(value, int):
                return _derived_size(ctx)
            out.append(entry if isinstance(entry, SizeLayout) else value)
    return tuple(out)


def size(ctx: OpContext) -> Layout:
    """``x.size()``, ``x.size(d)``, ``x.shape``: ints that follow the dims they read."""
    lay = ctx.tensor_layout(ctx.arg(0))
    d = ctx.val(ctx.arg(1, "dim", None))
    if d is None:
        return tuple(SizeLayout((dim,)) for dim in lay)
    return SizeLayout((lay[_norm_dim(int(d), len(lay))],))


def numel(ctx: OpContext) -> Layout:
    lay = ctx.tensor_layout(ctx.arg(0))
    dims = [d for d in lay if not is_fixed(d)]
    return SizeLayout(dims, derived=True) if dims else None


def not_a_tensor(ctx: OpContext) -> Layout:
    """Sizes, dtypes, devices: nothing to propagate."""
    if isinstance(ctx.value, torch.Tensor):
        ctx.unsupported("expected a non-tensor result")
    return ctx.fixed()


def creation(ctx: OpContext) -> Layout:
    """New tensors from sizes (``torch.zeros(n, c)``): fixed, unless built from a tensor."""
    for a in _tensor_args(ctx):
        ctx.fix(ctx.layout(a), "used as data of a new tensor")
    return ctx.fixed()


def constant_fill(ctx: OpContext) -> Layout:
    """``torch.zeros/ones/full(size)``, ``x.new_zeros/new_ones/new_full(size)``: every entry
    holds the same value, so the tensor built at any other size, or with its entries in any
    other order, is the same tensor sliced or permuted. A dim follows what sizes it: an int
    read from a module attribute (tied to it), or one read directly from a shape (the dim
    read); any other size (a number, arithmetic on sizes) is fixed and pins what it was
    computed from."""
    method = isinstance(ctx.node.target, str)
    args = ctx.node.args[1:] if method else ctx.node.args
    sizes: Any = ctx.node.kwargs.get("size", args[0] if len(args) == 1 else args)
    if ctx.node.target in (torch.full, "new_full"):
        sizes = ctx.node.kwargs.get("size", args[0] if args else ())
    if not isinstance(sizes, (tuple, list)):
        sizes = (sizes,)
    layouts = [ctx.layout(a) for a in sizes]
    if len(layouts) == 1 and isinstance(layouts[0], tuple) and not isinstance(
            layouts[0], SizeLayout):  # torch.zeros(x.shape)
        layouts = list(layouts[0])
    for a in _tensor_args(ctx):  # x.new_zeros(...) reads only x's dtype and device
        if not (method and a is ctx.node.args[0]):
            ctx.fix(ctx.layout(a), "used as data of a new tensor")
    shape = ctx.out_shape()
    if len(layouts) != len(shape):
        return ctx.fixed()
    dims: list[Dim] = []
    for n, lay in zip(shape, layouts):
        dim = fixed_dim(n)
        if isinstance(lay, SizeLayout) and len(lay) == 1 and not lay.derived and dim_size(
                lay[0]) == n:
            dim = lay[0]
            if not tie_size(ctx, lay, dim):  # an attribute read tied, or a size read
                size_checked(ctx, lay)
        elif isinstance(lay, SizeLayout):
            ctx.fix(lay, "a size computed from sizes makes a new tensor")
        dims.append(dim)
    return _checked(ctx, dims, ctx.value)


def _dims_arg(ctx: OpContext, index: int, name: str, ndim: int) -> list[int] | None:
    d = ctx.val(ctx.arg(index, name, None))
    return None if d is None else _dims_arg_value(d, ndim)


def _dims_arg_value(d: Any, ndim: int) -> list[int]:
    """One dim or several, normalized to sorted non-negative indices."""
    if isinstance(d, int):
        d = [d]
    return sorted({_norm_dim(int(x), ndim) for x in d})


#: what an order-dependent op does to the dims it works along, for the trace report
POSITIONS = "returns positions along an elastic dim"
ORDER = "depends on the order of the entries of an elastic dim"
BY_POSITION = "addresses an elastic dim by position"


def _op_name(ctx: OpContext) -> str:
    target = ctx.node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _pin(ctx: OpContext, dims: Any, why: str) -> None:
    """Pin every group in ``dims`` (a Dim, a layout, or a list of them), naming the op."""
    for d in dims if isinstance(dims, list) else [dims]:
        ctx.fix(d, f"{_op_name(ctx)} {why}")


def _pin_extra_tensors(ctx: OpContext, first: Any) -> None:
    """Tensor operands other than ``first`` (prepend/append of ``diff``...): pinned whole."""
    for other in _tensor_args(ctx):
        if other is not first:
            _pin(ctx, ctx.layout(other), "takes it as an extra operand")


def _checked(ctx: OpContext, dims: Sequence[Dim], value: Any) -> TensorLayout:
    """``dims`` as the layout of ``value``, if every size agrees (a misread argument never
    passes a group on)."""
    if not isinstance(value, torch.Tensor) or len(dims) != value.dim() or any(
            dim_size(d) != n for d, n in zip(dims, value.shape)):
        ctx.unsupported("the computed layout does not match the value's shape")
    return TensorLayout(dims)


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
        dims = None if raw is None else _dims_arg_value(raw, len(lay))
        keepdim = bool(ctx.val(ctx.arg(keepdim_at, "keepdim", False)))
        value = ctx.value
        pin = why is not None and (not pin_if_indices or (
            isinstance(value, tuple) and _indices_read(ctx.node)))
        if dims is None:
            if pin:
                _pin(ctx, list(lay), f"{why} (the flattened tensor)")
            return ctx.fixed()
        if pin:
            _pin(ctx, [lay[i] for i in dims], why or "")
        out: list[Dim] = []
        for i, d in enumerate(lay):
            if i in dims:
                if keepdim:
                    out.append(fixed_dim(1))
            else:
                out.append(d)
        if isinstance(value, tuple):  # (values, indices)
            return tuple(_checked(ctx, out, v) for v in value)
        return _checked(ctx, out, value)

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
    return None if raw is None else _dims_arg_value(raw, ndim)


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
            worked = _dims_arg_value(list(dims), len(lay))
        else:
            worked = _positional_dims(ctx, dim_at, name, default, len(lay), varargs)
        if worked is None:
            worked = list(range(len(lay)))
        _pin(ctx, [lay[i] for i in worked], why)
        _pin_extra_tensors(ctx, x)
        value = ctx.value
        out = []
        for v in value if isinstance(value, tuple) else (value,):
            if not isinstance(v, torch.Tensor):
                ctx.unsupported("expected tensor results")
            if v.dim() == len(lay):
                kept = [fixed_dim(v.shape[i]) if i in worked else d for i, d in enumerate(lay)]
            else:  # the dims worked along were reduced away (kthvalue, mode)
                kept = [d for i, d in enumerate(lay) if i not in worked]
            out.append(_checked(ctx, kept, v))
        return tuple(out) if isinstance(value, tuple) else out[0]

    return rule


def pin_all(why: str) -> Rule:
    """Ops over the flattened tensor whose result holds or follows positions (``nonzero``,
    ``masked_select``, ``take``, ``unique``...): every elastic dim of every operand pinned."""

    def rule(ctx: OpContext) -> Layout:
        for a in _tensor_args(ctx):
            _pin(ctx, ctx.layout(a), why)
        return ctx.fixed()

    return rule


def where(ctx: OpContext) -> Layout:
    """``torch.where(c, a, b)`` is elementwise; ``torch.where(c)`` returns positions."""
    if len(_tensor_args(ctx)) == 1 and isinstance(ctx.value, tuple):
        return pin_all(f"(one argument) {POSITIONS}")(ctx)
    return elementwise(ctx)


def gather(ctx: OpContext) -> Layout:
    """``gather(x, d, index)``: ``index`` holds positions along ``x``'s dim ``d`` (pinned);
    the result has ``index``'s layout along ``d`` and ties the other dims of both."""
    x, index = ctx.arg(0, "input"), ctx.arg(2, "index")
    lx, li = ctx.tensor_layout(x), ctx.tensor_layout(index)
    sx, si = ctx.shape(x), ctx.shape(index)
    d = _norm_dim(int(ctx.val(ctx.arg(1, "dim"))), len(lx))
    _pin(ctx, lx[d], BY_POSITION)
    dims: list[Dim] = []
    for k in range(len(li)):
        if k == d:
            dims.append(li[k])
        elif sx[k] == si[k]:
            dims.append(ctx.unify(lx[k], li[k]))
        else:
            _pin(ctx, [lx[k], li[k]], "reads a part of an elastic dim")
            dims.append(fixed_dim(si[k]))
    return _checked(ctx, dims, ctx.value)


def take_along_dim(ctx: OpContext) -> Layout:
    """``take_along_dim(x, indices, d)``: ``gather`` with broadcasting; no ``d``: positions
    into the flattened ``x``."""
    x, index = ctx.arg(0, "input"), ctx.arg(1, "indices")
    lx, li = ctx.tensor_layout(x), ctx.tensor_layout(index)
    raw = ctx.val(ctx.arg(2, "dim", None))
    if raw is None:
        _pin(ctx, lx, f"{BY_POSITION} (the flattened tensor)")
        return _checked(ctx, list(li), ctx.value)
    d = _norm_dim(int(raw), len(lx))
    _pin(ctx, lx[d], BY_POSITION)
    out_shape = ctx.out_shape()
    drop = [TensorLayout(lay[:d] + lay[d + 1:]) for lay in (lx, li)]
    shapes = [s[:d] + s[d + 1:] for s in (ctx.shape(x), ctx.shape(index))]
    rest = list(_broadcast(ctx, drop, shapes, out_shape[:d] + out_shape[d + 1:]))
    rest.insert(d, li[d])
    return _checked(ctx, rest, ctx.value)


def index_select(ctx: OpContext) -> Layout:
    """``index_select(x, d, index)``: the result's dim ``d`` follows the 1-D ``index``."""
    x, index = ctx.arg(0, "input"), ctx.arg(2, "index")
    lx, li = ctx.tensor_layout(x), ctx.tensor_layout(index)
    d = _norm_dim(int(ctx.val(ctx.arg(1, "dim"))), len(lx))
    _pin(ctx, lx[d], BY_POSITION)
    dims = list(lx)
    dims[d] = li[0] if len(li) == 1 else fixed_dim(1)
    return _checked(ctx, dims, ctx.value)


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
    d = _norm_dim(int(ctx.val(ctx.arg(1, "dim"))), len(lx))
    _pin(ctx, [lx[d], *(lay[d] for lay, _ in operands)], BY_POSITION)
    dims = list(lx)
    for k in range(len(lx)):
        if k == d:
            dims[k] = fixed_dim(sx[k])
        elif all(s[k] == sx[k] for _, s in operands):
            dims[k] = ctx.unify(lx[k], *(lay[k] for lay, _ in operands))
        else:
            _pin(ctx, [lx[k], *(lay[k] for lay, _ in operands)], "writes a part of an elastic dim")
    return _checked(ctx, dims, ctx.value)


def index_update(ctx: OpContext) -> Layout:
    """``index_add``/``index_copy``/``index_fill``/``index_reduce``: the 1-D ``index`` holds
    positions along ``x``'s dim ``d`` (pinned, with the source's dim ``d``); the source's
    other dims tie with ``x``'s."""
    x, index = ctx.arg(0, "input"), ctx.arg(2, "index")
    lx = ctx.tensor_layout(x)
    d = _norm_dim(int(ctx.val(ctx.arg(1, "dim"))), len(lx))
    _pin(ctx, [lx[d], ctx.tensor_layout(index)], BY_POSITION)
    dims = list(lx)
    dims[d] = fixed_dim(ctx.shape(x)[d])
    source = ctx.arg(3, "source", None)
    if isinstance(source, torch.fx.Node) and isinstance(ctx.layout(source), TensorLayout):
        ls = ctx.tensor_layout(source)
        if ctx.shape(source) == () or len(ls) != len(lx):
            _pin(ctx, ls, BY_POSITION)
        else:
            _pin(ctx, ls[d], BY_POSITION)
            for k in range(len(lx)):
                if k != d:
                    dims[k] = ctx.unify(lx[k], ls[k])
    return _checked(ctx, dims, ctx.value)


def index_put(ctx: OpContext) -> Layout:
    """``index_put(x, (i0, i1, ...), values)``: the index tensors hold positions along
    ``x``'s leading dims (pinned); ``values`` ties with ``x``'s remaining dims from the
    right."""
    x, indices, values = ctx.arg(0, "input"), ctx.arg(1, "indices"), ctx.arg(2, "values")
    lx, sx = ctx.tensor_layout(x), ctx.shape(x)
    if not isinstance(indices, (tuple, list)) or any(i is None for i in indices):
        ctx.unsupported("index_put with missing index tensors")
    n = len(indices)
    _pin(ctx, [*lx[:n], *(ctx.tensor_layout(i) for i in indices)], BY_POSITION)
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
                _pin(ctx, lv[-j], "broadcasts its values by position")
    return _checked(ctx, dims, ctx.value)


def diagonal(ctx: OpContext) -> Layout:
    """``diagonal``/``diag``/``trace``: the main diagonal of two equal dims follows a joint
    permutation of both, so they tie; an offset diagonal, or a non-square one, pins them."""
    x = ctx.arg(0, "input")
    lay = list(ctx.tensor_layout(x))
    shape = ctx.shape(x)
    name = _op_name(ctx)
    if name == "diagonal":
        offset = int(ctx.val(ctx.arg(1, "offset", 0)))
        a = _norm_dim(int(ctx.val(ctx.arg(2, "dim1", 0))), len(lay))
        b = _norm_dim(int(ctx.val(ctx.arg(3, "dim2", 1))), len(lay))
    else:
        offset = 0 if name == "trace" else int(ctx.val(ctx.arg(1, "diagonal", 0)))
        a, b = 0, len(lay) - 1
    if offset == 0 and shape[a] == shape[b]:
        tied = ctx.unify(lay[a], lay[b])
    else:
        _pin(ctx, [lay[a], lay[b]], "takes an off-centre diagonal of an elastic dim")
        tied = fixed_dim(min(shape[a], shape[b]))
    if name == "trace":
        return ctx.fixed()
    if name == "diag" and len(lay) == 1:  # a vector becomes a diagonal matrix
        n = ctx.out_shape()[0]
        d = tied if offset == 0 else fixed_dim(n)
        return _checked(ctx, [d, d], ctx.value)
    rest = [d for i, d in enumerate(lay) if i not in (a, b)]
    return _checked(ctx, [*rest, tied], ctx.value)


def cross(ctx: OpContext) -> Layout:
    """``cross(a, b, dim)``: elementwise over the other dims; the 3 entries of ``dim`` are
    x, y, z by position."""
    out = elementwise(ctx)
    default = -1 if ctx.node.target is torch.linalg.cross else None
    raw = ctx.val(ctx.arg(2, "dim", default))
    shape = ctx.out_shape()
    d = _norm_dim(int(raw), len(shape)) if raw is not None else shape.index(3)
    _pin(ctx, out[d], BY_POSITION)
    return out


def narrow(ctx: OpContext) -> Layout:
    """``narrow(x, d, start, length)``: a slice; the whole dim passes. A part given by
    numbers is ``x[start:start + length]`` along ``d`` (:func:`slice_dim`), a negative start
    counting from the end as in a slice: ``narrow(x, d, 3, 2)`` pins the head and the part
    kept (the tail may change), ``narrow(x, d, -5, 2)`` is ``x[-5:-3]`` and pins the part kept
    and the tail (the head may change). Other parts pin the dim."""
    x = ctx.arg(0, "input")
    lay = list(ctx.tensor_layout(x))
    d = _norm_dim(int(ctx.val(ctx.arg(1, "dim"))), len(lay))
    out = ctx.out_shape()
    n = ctx.shape(x)[d]
    if out[d] != n:
        start, length = ctx.arg(2, "start"), ctx.arg(3, "length")
        if type(start) is int and type(length) is int and not is_fixed(lay[d]):
            stop = start + length if start >= 0 or start + length < 0 else None
            lay[d] = slice_dim(ctx, lay[d], start, stop, n,
                               "narrow keeps a part of an elastic dim, of a size written "
                               "as a number")
            lay = list(ctx.table.resolve_layout(TensorLayout(lay)))
        else:
            _pin(ctx, lay[d], "keeps a part of an elastic dim")
            lay[d] = fixed_dim(out[d])
    return _checked(ctx, lay, ctx.value)


def select(ctx: OpContext) -> Layout:
    """``select(x, d, i)``: one entry of dim ``d``, picked by position."""
    x = ctx.arg(0, "input")
    lay = list(ctx.tensor_layout(x))
    d = _norm_dim(int(ctx.val(ctx.arg(1, "dim"))), len(lay))
    _pin(ctx, lay[d], "picks one entry of an elastic dim by position")
    return _checked(ctx, lay[:d] + lay[d + 1:], ctx.value)


def repeat_interleave(ctx: OpContext) -> Layout:
    """``repeat_interleave(x, r, d)`` with an int ``r``: each unit along ``d`` becomes ``r``
    times longer, in place, so the group follows (a longer block). Tensor repeats, or no dim
    (the flattened tensor), place entries by position: pinned."""
    x = ctx.arg(0, "input")
    lay = list(ctx.tensor_layout(x))
    repeats = ctx.arg(1, "repeats", None)
    if repeats is None:  # torch.repeat_interleave(counts): positions
        return pin_all(POSITIONS)(ctx)
    raw = ctx.val(ctx.arg(2, "dim", None))
    if raw is None and len(lay) != 1:
        return pin_all(f"{BY_POSITION} (the flattened tensor)")(ctx)
    d = 0 if raw is None else _norm_dim(int(raw), len(lay))
    r = ctx.val(repeats)
    if isinstance(r, int):
        lay[d] = scale_block(lay[d], r)
    else:
        _pin(ctx, lay[d], "repeats the entries of an elastic dim unevenly")
        _pin_extra_tensors(ctx, x)
        lay[d] = fixed_dim(ctx.out_shape()[d])
    return _checked(ctx, lay, ctx.value)


def searchsorted(ctx: OpContext) -> Layout:
    """``searchsorted(seq, values)``: positions along ``seq``'s last dim (pinned); the result
    has ``values``' layout, and ``seq``'s leading dims tie with ``values``'."""
    seq, values = ctx.arg(0, "sorted_sequence"), ctx.arg(1, "input")
    ls = ctx.tensor_layout(seq)
    _pin(ctx, ls[-1], POSITIONS)
    if not isinstance(ctx.layout(values), TensorLayout):
        return ctx.fixed()
    lv = list(ctx.tensor_layout(values))
    if len(ls) > 1:
        for k in range(len(ls) - 1):
            lv[k] = ctx.unify(lv[k], ls[k])
    return _checked(ctx, lv, ctx.value)


def bucketize(ctx: OpContext) -> Layout:
    """``bucketize(x, boundaries)``: positions in the 1-D ``boundaries`` (pinned); the result
    has ``x``'s layout."""
    x, boundaries = ctx.arg(0, "input"), ctx.arg(1, "boundaries")
    _pin(ctx, ctx.layout(boundaries), POSITIONS)
    if not isinstance(ctx.layout(x), TensorLayout):
        return ctx.fixed()
    return _checked(ctx, list(ctx.tensor_layout(x)), ctx.value)


def one_hot(ctx: OpContext) -> Layout:
    """``one_hot(labels, n)``: a new last dim of ``n`` classes; the labels' dims pass."""
    lay = ctx.tensor_layout(ctx.arg(0, "input"))
    return _checked(ctx, [*lay, fixed_dim(ctx.out_shape()[-1])], ctx.value)


def arange(ctx: OpContext) -> Layout:
    """``arange(n)``: entry ``i`` is the position ``i``; a size read from an elastic dim is
    pinned (``x * (torch.arange(x.size(1)) < k)`` treats entries by position)."""
    for a in ctx.node.all_input_nodes:
        lay = ctx.layout(a)
        if isinstance(lay, SizeLayout):
            _pin(ctx, list(lay), "counts the positions of an elastic dim")
    return creation(ctx)


def _tensor_list(ctx: OpContext, a: Any) -> tuple[list[TensorLayout], list[tuple[int, ...]]]:
    """Layouts and shapes of a list of tensors: a list of nodes, or one node holding a tuple."""
    if isinstance(a, torch.fx.Node):
        lays, vals = ctx.layout(a), ctx.val(a)
        if not isinstance(lays, tuple) or isinstance(lays, TensorLayout):
            ctx.unsupported("expected a sequence of tensors")
        return list(lays), [tuple(v.shape) for v in vals]
    return [ctx.tensor_layout(t) for t in a], [ctx.shape(t) for t in a]


def concat(ctx: OpContext) -> Layout:
    """``torch.cat``: segments laid end to end along ``dim``; other dims tied."""
    dim = ctx.val(ctx.arg(1, "dim", 0))
    lays, shapes = _tensor_list(ctx, ctx.arg(0, "tensors"))
    lays = [lay for lay, s in zip(lays, shapes) if s != (0,)]
    if not lays:
        return ctx.fixed()
    ndim = len(lays[0])
    d = _norm_dim(dim, ndim)
    out: list[Dim] = []
    for i in range(ndim):
        if i == d:
            out.append(concat_dims([lay[i] for lay in lays]))
        else:
            out.append(ctx.unify(*[lay[i] for lay in lays]))
    return TensorLayout(out)


def stack(ctx: OpContext) -> Layout:
    dim = ctx.val(ctx.arg(1, "dim", 0))
    lays, _ = _tensor_list(ctx, ctx.arg(0, "tensors"))
    ndim = len(lays[0])
    d = _norm_dim(dim, ndim + 1)
    dims = [ctx.unify(*[lay[i] for lay in lays]) for i in range(ndim)]
    dims.insert(d, fixed_dim(len(lays)))
    return TensorLayout(dims)


def split(ctx: OpContext) -> Layout:
    """``split``/``chunk``/``unbind``: pieces keep the other dims' groups.

    Along an elastic dim, ``chunk`` into equal pieces cuts the dim's groups into blocks at
    the piece boundaries (:func:`cut_dim`), and the blocks of each piece keep as many units
    as the first piece's (``chunk`` cuts at equal sizes at run time); their entries are chosen
    independently. Pieces of sizes written as numbers (``split(64)``), unequal pieces and
    ``unbind`` pin that dim.
    """
    x = ctx.arg(0, "input")
    lay = ctx.tensor_layout(x)
    name = _op_name(ctx)
    default_dim = 0
    d = ctx.val(ctx.arg(2 if name in ("split", "chunk", "tensor_split") else 1, "dim",
                        default_dim))
    d = _norm_dim(int(d), len(lay))
    pieces = ctx.value
    sizes = [p.shape[d] for p in pieces] if name != "unbind" else []
    cuts: list[Dim] | None = None
    if not is_fixed(lay[d]):
        if name == "chunk" and len(sizes) > 1 and len(set(sizes)) == 1:
            cuts = _equal_blocks(ctx, lay[d], sizes)
        else:
            ctx.fix(lay[d], f"{name} cuts an elastic dim at sizes written as numbers")
        lay = ctx.table.resolve_layout(lay)
    out = []
    for i, piece in enumerate(pieces):
        dims = list(lay)
        if name == "unbind":
            dims.pop(d)
        else:
            dims[d] = cuts[i] if cuts is not None else fixed_dim(piece.shape[d])
        out.append(TensorLayout(dims))
    return tuple(out)


def _equal_blocks(ctx: OpContext, dim: Dim, sizes: Sequence[int]) -> list[Dim] | None:
    """``dim`` cut into pieces of ``sizes`` entries whose sizes stay equal under every resize;
    ``None`` (and the dim pinned) where the cut or the equal sizes cannot be proven.

    A unit a cut falls inside becomes a constant block of its own (``chunk`` after a channel
    shuffle whose units hold several channels); the pieces' free segments are then paired in
    order and keep equal numbers of units (a same-size class), and their fixed entries must
    match. Where one piece has a single free segment longer than the other's by whole units,
    its last units are made constant to balance them."""
    try:
        pieces = cut_dim(ctx, dim, sizes, pin_straddled=True)
    except Unsupported as exc:
        ctx.fix(dim, str(exc))
        return None
    if not _balance(ctx, pieces):
        ctx.fix(dim, "chunk pieces with different group structure")
        return None
    pieces = [ctx.table.resolve(p) for p in pieces]
    free = [_free_segments(ctx, p) for p in pieces]
    for other in free[1:]:
        for a, b in zip(free[0], other, strict=True):
            ctx.table.tie_sizes(a.group, b.group)  # type: ignore[arg-type]
    return pieces


def _free_segments(ctx: OpContext, dim: Dim) -> list[Seg]:
    return [s for s in ctx.table.resolve(dim)
            if s.group is not None and not ctx.table.is_constant(s.group)]


def _balance(ctx: OpContext, pieces: list[Dim]) -> bool:
    """Whether ``pieces`` (of equal sizes now) keep equal sizes under every resize once their
    free segments, paired in order, keep equal numbers of units; a single free segment per
    piece longer than the shortest by whole units gives up its last units (made constant)."""
    table = ctx.table
    free = [_free_segments(ctx, p) for p in pieces]
    if any(len(f) != len(free[0]) for f in free):
        return False
    if len(free[0]) == 1:
        shortest = min(f[0].length for f in free)
        for f in free:
            seg = f[0]
            root = table.find(seg.group)  # type: ignore[arg-type]
            per = seg.length // table.units[root]
            extra = seg.length - shortest
            if extra % per:
                return False
            if extra:
                n = table.units[root]
                try:
                    blocks = table.split(root, [n - extra // per, extra // per])
                except ValueError:
                    return False
                ctx.fix((Seg(blocks[1], extra // per, per),),
                        "given up to keep the halves of a chunk equal")
        free = [_free_segments(ctx, p) for p in pieces]
    for other in free[1:]:
        for a, b in zip(free[0], other, strict=True):
            ra, rb = table.find(a.group), table.find(b.group)  # type: ignore[arg-type]
            if a.length != b.length or a.length // table.units[ra] != b.length // table.units[rb]:
                return False
    return True


def cut_dim(ctx: OpContext, dim: Dim, sizes: Sequence[int], *,
            pin_straddled: bool = False) -> list[Dim]:
    """``dim`` cut into consecutive pieces of ``sizes`` entries.

    A group segment crossing a piece boundary is split there into blocks
    (:meth:`GroupTable.split <fxsym.analysis.GroupTable.split>`), so every dim that refers to
    the group sees the same blocks; fixed segments (with ``pin_straddled``, constant groups
    too) are cut locally.
    Unsupported where a boundary falls inside a unit of a group (whole heads, whole conv
    groups) or the group is tied so that it cannot be cut (its size must equal another's that
    is not cut alike). With ``pin_straddled``, a unit a boundary falls inside becomes a block
    of its own, constant, instead: the caller must then prove that the boundary stays at the
    same place inside it under every resize (equal pieces whose sizes are tied).
    """
    table = ctx.table
    if sum(sizes) != dim_size(dim):
        raise Unsupported(f"pieces {list(sizes)} do not cover a dim of {dim_size(dim)}")
    bounds = list(itertools.accumulate(sizes))[:-1]
    while True:  # a group is cut once at every boundary inside it (blocks #0, #1, ...)
        dim = table.resolve(dim)
        offset = 0
        for seg in dim:
            end = offset + seg.length
            inside = sorted({b - offset for b in bounds if offset < b < end})
            if seg.group is not None and inside and not (
                    pin_straddled and table.is_constant(seg.group)):
                break
            offset = end
        else:
            break
        assert seg.group is not None
        root = table.find(seg.group)
        per = seg.length // table.units[root]
        if any(b % per for b in inside):
            if not pin_straddled:
                raise Unsupported(f"a cut falls inside a unit of {per} entries")
            _pin_straddled_unit(ctx, root, next(b for b in inside if b % per) // per, per)
            continue
        cuts = [0, *(b // per for b in inside), table.units[root]]
        try:
            table.split(root, [hi - lo for lo, hi in itertools.pairwise(cuts)])
        except ValueError as exc:
            raise Unsupported(str(exc)) from exc
    dim = table.resolve(dim)
    pieces: list[list[Seg]] = [[] for _ in sizes]
    starts = [0, *bounds]
    offset = 0
    for seg in dim:
        end = offset + seg.length
        for i, start in enumerate(starts):
            stop = start + sizes[i]
            lo, hi = max(offset, start), min(end, stop)
            if lo >= hi:
                continue
            if seg.group is None or (hi - lo < seg.length and table.is_constant(seg.group)):
                pieces[i].append(Seg(None, hi - lo, 1))
            else:  # a cut group segment lies within one piece
                pieces[i].append(seg)
        offset = end
    return [concat_dims([tuple(p)]) for p in pieces]


def _pin_straddled_unit(ctx: OpContext, root: int, unit: int, per: int) -> None:
    """Make unit ``unit`` of group ``root`` a constant block of its own (the blocks before and
    after it stay free)."""
    table = ctx.table
    n = table.units[root]
    parts = [p for p in (unit, 1, n - unit - 1) if p]
    why = f"a cut falls inside a unit of {per} entries"
    if len(parts) < 2:
        table.fix(root, why)
        return
    try:
        blocks = table.split(root, parts)
    except ValueError as exc:
        raise Unsupported(str(exc)) from exc
    ctx.fix((Seg(blocks[1 if unit else 0], 1, per),), why)


def _chunks(a: Sequence[int], b: Sequence[int]) -> list[tuple[list[int], list[int]]] | None:
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
    marks output dims whose size cannot follow a resize (:func:`_literal`: written as a number,
    or read from a fixed dim): a group landing there becomes constant.
    """
    for i, s in enumerate(in_shape):
        if s == 1 and not is_fixed(lay[i]):
            ctx.fix(lay[i], "a size-1 elastic dim is reshaped")
    chunks = _chunks(in_shape, out_shape)
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
        elif len(cb) == 1 and is_fixed(dims[0]) and sum(not is_fixed(d) for d in dims) == 1:
            # fixed outer dims, one elastic dim: the merged dim holds a copy of it per entry
            # of the outer dims (heads of head_dim features merged into one feature dim)
            j = next(k for k, d in enumerate(dims) if not is_fixed(d))
            outer = math.prod(in_shape[i] for i in ca[:j])
            inner = math.prod(in_shape[i] for i in ca[j + 1:])
            out[cb[0]] = concat_dims([scale_block(dims[j], inner)] * outer)
        elif len(cb) == 1:  # merge: groups only in the outermost dim of the run
            if any(not is_fixed(d) for d in dims[1:]):
                if not all(_producerless(ctx, d) for d in dims[1:]):
                    ctx.unsupported("merging dims with an elastic inner dim")
                for d in dims[1:]:  # a parameter's dims (a kernel) nothing has resized yet
                    ctx.fix(d, "a parameter dim merged into an outer dim")
            inner = math.prod(in_shape[i] for i in ca[1:])
            out[cb[0]] = scale_block(dims[0], inner)
        elif len(ca) == 1:  # split: the outer piece indexes whole units (or parts of one)
            lits = [bool(literal[i]) if literal is not None and i < len(literal) else False
                    for i in cb]
            for i, dim in zip(cb, _split_dim(ctx, dims[0], [out_shape[i] for i in cb], lits)):
                out[i] = dim
        else:
            ctx.unsupported("reshaping several elastic dims at once")
    if literal is not None:
        for i, lit in enumerate(literal):
            if lit and i < len(out) and not is_fixed(out[i]):
                ctx.fix(out[i], "reshaped to a literal size, which cannot follow a resize (a "
                        "number, or a size read from a fixed dim)")
                out[i] = fixed_dim(out_shape[i])
    return TensorLayout(out)


def _split_dim(ctx: OpContext, dim: Dim, sizes: Sequence[int], literal: Sequence[bool]
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
            pieces = _aligned(ctx, pieces)
        piece = concat_dims([ctx.table.resolve(ctx.unify(*pieces))])
        if len(sizes) == 2:
            out[1] = piece
        elif not is_fixed(piece):
            out[1:] = _split_dim(ctx, piece, sizes[1:], literal[1:])
        return out
    if heads:
        assert seg.group is not None
        ctx.table.constrain(seg.group, first)
        out[0] = (Seg(seg.group, first, 1),)
        return out
    ctx.unsupported(f"splitting an elastic dim of {size} entries into {list(sizes)}")


def _aligned(ctx: OpContext, pieces: list[Dim]) -> list[Dim]:
    """Equal pieces cut at every segment boundary any of them has (:func:`cut_dim`, a unit a
    boundary falls inside made constant), so they can be tied segment by segment."""
    for _ in range(8):
        pieces = [ctx.table.resolve(p) for p in pieces]
        bounds = sorted({b for p in pieces for b in itertools.accumulate(s.length for s in p)})
        if all(set(itertools.accumulate(s.length for s in p)) == set(bounds) for p in pieces):
            return pieces
        sizes = [hi - lo for lo, hi in itertools.pairwise([0, *bounds])]
        pieces = [tuple(itertools.chain.from_iterable(cut_dim(ctx, p, sizes, pin_straddled=True)))
                  for p in pieces]
    return pieces


def _size_form(ctx: OpContext, dim: Dim) -> tuple[int, dict[int, int]]:
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


def _keeps_size(ctx: OpContext, a: Dim, b: Dim, factor: int = 1) -> bool:
    """Whether dim ``a`` keeps ``factor`` times the size of dim ``b`` under every resize."""
    fa, pa = _size_form(ctx, a)
    fb, pb = _size_form(ctx, b)
    return fa == factor * fb and pa == {k: factor * v for k, v in pb.items()}


def _share_of_size(ctx: OpContext, arg: Any, dim: Dim) -> bool:
    """Whether ``arg`` is ``n // k`` for an int ``n`` read from a dim that keeps ``k`` times
    ``dim``'s size (``channels_per_group = num_channels // groups`` in a channel shuffle)."""
    if not (isinstance(arg, torch.fx.Node) and arg.op == "call_function"
            and arg.target is operator.floordiv and len(arg.args) == 2):
        return False
    n, k = arg.args
    lay = ctx.layout(n)
    return (type(k) is int and k > 0 and isinstance(lay, SizeLayout) and not lay.derived
            and len(lay) == 1 and _keeps_size(ctx, lay[0], dim, k))


def _tie_equal_sizes(ctx: OpContext, a: Dim, b: Dim) -> bool:
    """Make dim ``a`` keep the size of dim ``b`` under every resize, where both are one group
    of equal size: the two groups form a same-size class (their entries stay independent;
    their unit counts become equal, so each unit has as many entries in both). A reshape of
    ``b`` by the size of ``a`` (``out.reshape(B, N, x.shape[-1])`` merging heads back into a
    dim read from the attention's input) then stays valid after every resize."""
    if len(a) != 1 or len(b) != 1 or a[0].group is None or b[0].group is None:
        return False
    if dim_size(a) != dim_size(b):
        return False
    table = ctx.table
    ra, rb = table.find(a[0].group), table.find(b[0].group)
    if ra in table.children or rb in table.children:
        return False
    table.tie_sizes(ra, rb)
    return _keeps_size(ctx, a, b)


def view(ctx: OpContext) -> Layout:
    """``view``/``reshape`` (method or function) to an explicit shape."""
    x = ctx.arg(0, "input")
    lay = ctx.tensor_layout(x)
    node = ctx.node
    shape_args: Any = node.args[1:] if node.op == "call_method" else node.args[1:2]
    if node.op == "call_method" and len(shape_args) == 1 and isinstance(
            shape_args[0], (tuple, list)):
        shape_args = shape_args[0]
    elif node.op == "call_function" and shape_args:
        shape_args = shape_args[0]
    if not shape_args:
        shape_args = node.kwargs.get("shape", ())
    items: list[Any] = []
    raws: list[Any] = []
    for a in shape_args if isinstance(shape_args, (tuple, list)) else (shape_args,):
        al = ctx.layout(a) if isinstance(a, torch.fx.Node) else None
        if isinstance(al, tuple) and not isinstance(al, SizeLayout):
            items.extend(al)  # x.view(y.shape), x.view(x.shape[:-1] + (h, d))
            raws.extend(_joined_raws(ctx, a) or [None] * len(al))
        else:
            items.append(a if al is None else al)
            raws.append(a)
    literal = [_literal(ctx, a) for a in items]
    fused = _split_fixed_part(ctx, lay, ctx.shape(x), ctx.out_shape(), items, raws)
    if fused is not None:
        out, done = fused
    else:
        out, done = reshape_layout(ctx, lay, ctx.shape(x), ctx.out_shape(), literal), -1
    if len(items) != len(out):
        return out
    dims = [ctx.table.resolve(d) for d in out]  # groups the reshape cut into blocks
    for i, item in enumerate(items):
        if not isinstance(item, SizeLayout):
            continue
        if i != done and any(not is_fixed(d) for d in item) and not _follows(
                ctx, item, dims[i], raws[i]):
            ctx.fix(item, "a size read from one dim reshapes another")
            ctx.fix(dims[i], "a size read from one dim reshapes another")
            dims[i] = fixed_dim(ctx.out_shape()[i])
        size_checked(ctx, item)  # a literal, checked above, or pinned
    return TensorLayout(dims)


def _follows(ctx: OpContext, item: SizeLayout, dim: Dim, raw: Any) -> bool:
    """Whether ``item``, a traced size sizing ``dim`` in a reshape, keeps sizing it right
    under every resize (or is made to: an attribute tied, a same-size class)."""
    if tie_size(ctx, item, dim):  # an int read from a module attribute
        return True
    if item.derived and _product_follows(ctx, raw, dim):
        return True
    item = ctx.table.resolve_layout(item)
    if _share_of_size(ctx, raw, dim):
        return True
    if not item.derived and len(item) == 1 and _tie_equal_sizes(ctx, item[0], dim):
        return True
    return not item.derived and len(item) == 1 and _keeps_size(ctx, item[0], dim)


def _literal(ctx: OpContext, item: Any) -> bool:
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
    chunks = _chunks(in_shape, out_shape)
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
            not n_lay.derived and _keeps_size(ctx, n_lay[0], outer[:1])):
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


def _joined_raws(ctx: OpContext, node: torch.fx.Node) -> list[Any] | None:
    """The arguments each entry of a shape joined from tuples (:func:`_joined_shape`) was
    written with (``None`` for an entry of a shape read from a tensor)."""
    if not (node.op == "call_function" and node.target is operator.add):
        return None
    out: list[Any] = []
    for arg in node.args:
        if isinstance(arg, (tuple, list)):
            out.extend(arg)
        elif isinstance(arg, torch.fx.Node):
            out.extend(_joined_raws(ctx, arg) or [None] * len(ctx.val(arg)))
        else:
            return None
    return out


def _product_follows(ctx: OpContext, raw: Any, dim: Dim) -> bool:
    """Whether ``raw`` is a product of sizes linear in the kept units (every factor but one
    constant) that keeps ``dim``'s size under every resize (``self.num_heads *
    self.head_dim`` merging heads of a constant ``head_dim``). Nothing is pinned."""
    if not (isinstance(raw, torch.fx.Node) and raw.op == "call_function"
            and raw.target is operator.mul):
        return False
    form = _linear_form(ctx, raw, pin=False)
    return form is not None and form == _constant_form(ctx, dim)


def _same_dim(ctx: OpContext, a: Dim, b: Dim) -> bool:
    if len(a) != len(b):
        return False
    for sa, sb in zip(a, b):
        if sa.length != sb.length:
            return False
        if (sa.group is None) != (sb.group is None):
            return False
        if (sa.group is not None and sb.group is not None
                and ctx.table.find(sa.group) != ctx.table.find(sb.group)):
            return False
    return True


def reshape_as_value(ctx: OpContext) -> Layout:
    """``flatten``/``unflatten``/``view_as``...: the target shape is the node's value."""
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
    order = [_norm_dim(int(ctx.val(d)), len(lay)) for d in dims]
    return TensorLayout(lay[i] for i in order)


def transpose(ctx: OpContext) -> Layout:
    x = ctx.arg(0, "input")
    lay = list(ctx.tensor_layout(x))
    a = _norm_dim(int(ctx.val(ctx.arg(1, "dim0"))), len(lay))
    b = _norm_dim(int(ctx.val(ctx.arg(2, "dim1"))), len(lay))
    lay[a], lay[b] = lay[b], lay[a]
    return TensorLayout(lay)


def matrix_transpose(ctx: OpContext) -> Layout:
    lay = list(ctx.tensor_layout(ctx.arg(0, "input")))
    if len(lay) >= 2:
        lay[-1], lay[-2] = lay[-2], lay[-1]
    return TensorLayout(lay)


def unsqueeze(ctx: OpContext) -> Layout:
    lay = list(ctx.tensor_layout(ctx.arg(0, "input")))
    d = _norm_dim(int(ctx.val(ctx.arg(1, "dim"))), len(lay) + 1)
    lay.insert(d, fixed_dim(1))
    return TensorLayout(lay)


def squeeze(ctx: OpContext) -> Layout:
    x = ctx.arg(0, "input")
    lay = ctx.tensor_layout(x)
    shape = ctx.shape(x)
    dims = _dims_arg(ctx, 1, "dim", len(lay))
    drop = [i for i, s in enumerate(shape) if s == 1 and (dims is None or i in dims)]
    for i in drop:
        if not is_fixed(lay[i]):
            ctx.fix(lay[i], "a size-1 elastic dim is squeezed away")
    return TensorLayout(d for i, d in enumerate(lay) if i not in drop)


def expand(ctx: OpContext) -> Layout:
    """``expand``/``expand_as``/``repeat``: dims that keep their size keep their groups."""
    x = ctx.arg(0, "input")
    lay = ctx.tensor_layout(x)
    shape = ctx.shape(x)
    out_shape = ctx.out_shape()
    n = len(out_shape)
    name = ctx.node.target if isinstance(ctx.node.target, str) else ""
    sizes = _expand_sizes(ctx, n) if name == "expand" else None
    dims: list[Dim] = []
    for i in range(n):
        j = i - (n - len(shape))
        if j >= 0 and shape[j] == out_shape[i]:
            size = sizes[i] if sizes is not None else -1
            if isinstance(size, SizeLayout) and _same_dim(
                    ctx, ctx.table.resolve(lay[j]), ctx.table.resolve_layout(size)[0]):
                size_checked(ctx, size)  # x.expand(b, x.size(1), h, w)
            elif sizes is not None and size != -1 and not is_fixed(lay[j]):
                ctx.fix(lay[j], "expand to a size that does not follow an elastic dim")
                dims.append(fixed_dim(out_shape[i]))
                continue
            dims.append(lay[j])
        else:
            if j >= 0 and not is_fixed(lay[j]):
                ctx.fix(lay[j], f"{name or 'expand'} changes an elastic dim")
            dims.append(fixed_dim(out_shape[i]))
    return TensorLayout(dims)


def _expand_sizes(ctx: OpContext, n: int) -> list[Any] | None:
    """The ``n`` sizes ``x.expand(...)`` was given: each a size's layout (a traced size read
    directly from one dim), ``-1``, or another int; ``None`` if they cannot be read."""
    args: Any = ctx.node.args[1:] or ctx.node.kwargs.get("size", ())
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = args[0]
    if len(args) != n:
        return None
    out: list[Any] = []
    for a in args:
        lay = ctx.layout(a) if isinstance(a, torch.fx.Node) else None
        direct = isinstance(lay, SizeLayout) and not lay.derived and len(lay) == 1
        out.append(lay if direct else ctx.val(a))
    return out


def trailing_spatial(k: int) -> Rule:
    """Pooling, interpolation and padding over the last ``k`` dims: leading dims pass through."""

    def rule(ctx: OpContext) -> Layout:
        x = ctx.arg(0, "input")
        lay = ctx.tensor_layout(x)
        out_shape = ctx.out_shape()
        if len(out_shape) != len(lay):
            ctx.unsupported("pooling changed the rank")
        dims = list(lay[: len(lay) - k])
        for d in lay[len(lay) - k:]:
            if not is_fixed(d):
                ctx.fix(d, "pooled over an elastic dim")
        dims += [fixed_dim(s) for s in out_shape[len(lay) - k:]]
        res = TensorLayout(dims)
        if isinstance(ctx.value, tuple):  # return_indices=True
            return tuple(res for _ in ctx.value)
        return res

    return rule


def pad(ctx: OpContext) -> Layout:
    x = ctx.arg(0, "input")
    lay = ctx.tensor_layout(x)
    padding = ctx.val(ctx.arg(1, "pad"))
    k = len(padding) // 2
    padded = [len(lay) - 1 - i for i in range(k) if padding[2 * i] or padding[2 * i + 1]]
    dims = list(lay)
    out_shape = ctx.out_shape()
    for i in padded:
        if not is_fixed(dims[i]):
            ctx.fix(dims[i], "padding an elastic dim")
        dims[i] = fixed_dim(out_shape[i])
    return TensorLayout(dims)


def getitem(ctx: OpContext) -> Layout:
    """Indexing a tuple/list (module outputs) or a tensor (ints, slices, None, Ellipsis)."""
    container = ctx.arg(0)
    index = ctx.val(ctx.arg(1))
    lay = ctx.layout(container)
    if not isinstance(lay, TensorLayout):
        if isinstance(lay, (tuple, list)) and isinstance(index, int):
            return lay[index]
        if isinstance(lay, (tuple, list)) and isinstance(index, slice):
            return tuple(lay[index])
        if isinstance(lay, dict):
            return lay.get(index)
        return ctx.fixed()
    shape = ctx.shape(container)
    shape_only = _read_for_shape_only(ctx.node)
    items = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, (torch.Tensor, list)) for i in items):
        return _take_by_index(ctx, lay, items)
    n_consuming = sum(1 for i in items if i is not None and i is not Ellipsis)
    raw = ctx.arg(1)
    raw_items = raw if isinstance(raw, tuple) else (raw,)
    out: list[Dim] = []
    d = 0
    for k, item in enumerate(items):
        if item is Ellipsis:
            take = len(lay) - d - (n_consuming - sum(
                1 for i in items[: items.index(item)] if i is not None and i is not Ellipsis))
            out.extend(lay[d: d + take])
            d += take
        elif item is None:
            out.append(fixed_dim(1))
        elif isinstance(item, int):
            if not is_fixed(lay[d]):
                if not shape_only:
                    ctx.fix(lay[d], "one entry of an elastic dim is picked by index")
            d += 1
        elif isinstance(item, slice):
            start, stop, step = item.indices(shape[d])
            if (start, stop, step) == (0, shape[d], 1):
                out.append(lay[d])
            elif is_fixed(lay[d]) or shape_only:
                out.append(fixed_dim(len(range(start, stop, step))))
            else:
                r = raw_items[k] if k < len(raw_items) else None
                traced = None
                if isinstance(r, slice) and step == 1 and 0 <= start < stop:
                    traced = _traced_slice(ctx, lay[d], r, start, stop, shape[d])
                literal = traced is not None or (isinstance(r, slice) and all(
                    _constant_bound(ctx, v) for v in (r.start, r.stop)))
                if traced is not None:
                    out.append(traced)
                    lay = ctx.table.resolve_layout(lay)
                    out = [ctx.table.resolve(o) for o in out]
                elif step != 1 or not literal or start >= stop:
                    ctx.fix(lay[d], "an elastic dim is sliced")
                    out.append(fixed_dim(len(range(start, stop, step))))
                else:
                    out.append(slice_dim(ctx, lay[d], item.start, item.stop, shape[d]))
                    lay = ctx.table.resolve_layout(lay)
                    out = [ctx.table.resolve(o) for o in out]
            d += 1
        else:
            ctx.unsupported(f"index {item!r}")
    out.extend(lay[d:])
    return TensorLayout(out)


def _take_by_index(ctx: OpContext, lay: TensorLayout, items: tuple[Any, ...]) -> Layout:
    """``x[idx]``, ``x[:, idx]``, ``x[..., idx, :]``: one integer tensor (or list) of positions
    along one dim, every other dim taken whole. The indexed dim is read by position (pinned,
    unless a list of numbers picks only entries of a fixed part: :func:`_picks_fixed_entries`);
    the index's own dims take its place (a relative-position table ``t[index]``: its other
    dims pass through and may belong to a group, such as the heads a bias is added to).
    Several index tensors, boolean masks and other indices mixed in are not mapped."""
    raw = ctx.arg(1)
    raw_items = raw if isinstance(raw, tuple) else (raw,)
    tensors = [k for k, i in enumerate(items) if isinstance(i, (torch.Tensor, list))]
    whole = all(i is Ellipsis or (isinstance(i, slice) and i == slice(None))
                for k, i in enumerate(items) if k != tensors[0])
    if len(tensors) != 1 or not whole or sum(i is Ellipsis for i in items) > 1:
        ctx.unsupported("advanced (tensor or list) indexing")
    k = tensors[0]
    index = items[k]
    if isinstance(index, list):
        index = torch.tensor(index) if all(type(v) is int for v in index) else None
    if not isinstance(index, torch.Tensor) or index.dtype in (torch.bool, torch.uint8) or (
            index.is_floating_point() or index.is_complex()):
        ctx.unsupported("advanced indexing by a mask or a non-integer index")
    if Ellipsis in items[:k]:
        d = len(lay) - (len(items) - k)
    else:
        d = k
    source = raw_items[k] if k < len(raw_items) else None
    index_lay = ctx.layout(source) if isinstance(source, torch.fx.Node) else None
    index_dims = list(index_lay) if isinstance(index_lay, TensorLayout) else [
        fixed_dim(n) for n in index.shape]
    if not (isinstance(items[k], list) and _picks_fixed_entries(
            lay[d], items[k], ctx.shape(ctx.arg(0))[d])):
        _pin(ctx, lay[d], BY_POSITION)
    return _checked(ctx, [*lay[:d], *index_dims, *lay[d + 1:]], ctx.value)


def _picks_fixed_entries(dim: Dim, index: list[Any], n: int) -> bool:
    """Whether a list of numbers indexes only entries of fixed size that keep their position
    under every resize: counted from the end within the dim's trailing fixed part
    (``qkv[..., [-2], :]``, Falcon's key head after the query heads), or from the start within
    its leading fixed part."""
    if not index or any(type(i) is not int or not -n <= i < n for i in index):
        return False
    if is_fixed(dim):
        return True
    lead = dim[0].length if dim[0].group is None else 0
    trail = dim[-1].length if dim[-1].group is None else 0
    return all(0 <= i < lead for i in index) or all(-trail <= i < 0 for i in index)


#: a size as a linear function of the kept units of groups: (fixed entries, {same-size class
#: key: entries per kept unit}), as :func:`_size_form` with constant groups as fixed entries
Form = tuple[int, dict[int, int]]


def _constant_form(ctx: OpContext, dim: Dim) -> Form:
    fixed, per = _size_form(ctx, dim)
    return fixed, {k: v for k, v in per.items() if v}


def _linear_form(ctx: OpContext, a: Any, depth: int = 0, *, pin: bool = True) -> Form | None:
    """The int ``a`` (a number, a size read from a dim or an attribute, or ``+ - *`` of them)
    as a :data:`Form`, where it is linear in the kept units. In a product of two elastic
    sizes (``config.num_attention_heads * self.head_dim``) the second factor is pinned, so
    the product stays linear in the first; without ``pin``, such a product has no form."""
    if type(a) is int:
        return a, {}
    if not isinstance(a, torch.fx.Node) or depth > 32:
        return None
    if a.op == "call_function" and a.target in _FORM_OPS and not a.kwargs and len(a.args) == 2:
        first = _linear_form(ctx, a.args[0], depth + 1, pin=pin)
        second = _linear_form(ctx, a.args[1], depth + 1, pin=pin)
        if first is None or second is None:
            return None
        (c1, p1), (c2, p2) = first, second
        if a.target is operator.mul:
            if p1 and p2 and not pin:
                return None
            if p1 and p2:
                ctx.fix(ctx.layout(a.args[1]), "a factor of a product of sizes bounding a slice")
                first = _linear_form(ctx, a.args[0], depth + 1)
                second = _linear_form(ctx, a.args[1], depth + 1)
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
        return _constant_form(ctx, lay[0])
    return None


_FORM_OPS = frozenset({operator.add, operator.sub, operator.mul})


def _holds(ctx: OpContext, part: Dim, bound: Any, base: Form) -> bool:
    """Make ``part`` keep the size ``bound`` minus ``base`` under every resize, where it can:
    a part of one elastic block against a bound linear in one group's kept units is tied to
    that group (its units coarsened to match): the same group where the bound's group has no
    producer (an attribute such as ``config.num_attention_heads``, which becomes a member and
    is updated by resize), a same-size class where it has one (a size read from another
    producer's dim)."""
    form = _linear_form(ctx, bound)
    if form is None:
        return False

    def target() -> Form | None:
        now = _linear_form(ctx, bound)
        if now is None:
            return None
        per = dict(now[1])
        for g, v in base[1].items():
            per[g] = per.get(g, 0) - v
        return now[0] - base[0], {g: v for g, v in per.items() if v}

    want = target()
    if want is None:
        return False
    if _constant_form(ctx, part) == want:
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
    if table.producers.get(other):  # a size read from another producer's dim: counts only
        table.tie_sizes(root, other)
    else:  # an attribute (or a parameter dim) sizing the part: a member of its group
        table.union(root, other)
    return _constant_form(ctx, part) == target()


def _traced_slice(ctx: OpContext, dim: Dim, raw: slice, start: int, stop: int,
                  n: int) -> Dim | None:
    """``x[..., a:b]`` of an elastic dim, ``a`` and ``b`` computed from sizes that follow a
    resize (``qkv[..., q:q + self.num_key_value_heads * self.head_dim]``): the dim is cut at
    both ends, and the part before ``a`` and the parts before ``b`` are made to keep the
    bounds' sizes (:func:`_holds`). ``None`` where a bound is constant, or not linear in the
    kept units, or a part cannot be made to follow it (the caller then pins)."""
    bounds = [v for v in (raw.start, raw.stop) if v is not None]
    if not bounds or not all(isinstance(v, torch.fx.Node) or type(v) is int for v in bounds):
        return None
    if not all(type(v) is int or _from_sizes(v) for v in bounds):
        return None
    forms = [_linear_form(ctx, v) for v in bounds]
    if any(f is None for f in forms) or not any(f[1] for f in forms if f is not None):
        return None
    try:
        head, mid, _tail = cut_dim(ctx, dim, [start, stop - start, n - stop])
    except Unsupported:
        return None
    zero: Form = (0, {})
    if raw.start is not None and not _holds(ctx, head, raw.start, zero):
        return None
    if raw.stop is not None:
        base = _constant_form(ctx, head) if raw.start is not None else zero
        if not _holds(ctx, ctx.table.resolve(mid), raw.stop, base):
            return None
    for v in bounds:
        lay = ctx.layout(v) if isinstance(v, torch.fx.Node) else None
        if isinstance(lay, SizeLayout):
            size_checked(ctx, lay)
    return ctx.table.resolve(mid)


def _constant_bound(ctx: OpContext, bound: Any) -> bool:
    """Whether a slice bound keeps its trace-time value under every resize: a number, or an
    int computed from sizes only (``cos.shape[-1]``, ``4 * self.head_dim``), whose elastic
    sources are pinned here (a resize of them would move the bound)."""
    if bound is None or type(bound) is int:
        return True
    if not isinstance(bound, torch.fx.Node) or type(ctx.val(bound)) is not int:
        return False
    if not _from_sizes(bound):
        return False
    lay = ctx.layout(bound)
    if isinstance(lay, SizeLayout):
        for d in lay:
            if not is_fixed(d):
                ctx.fix(d, "a slice bound is computed from this size")
    return True


def _from_sizes(node: torch.fx.Node, depth: int = 0) -> bool:
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
    return all(_from_sizes(n, depth + 1) for n in node.all_input_nodes)


_SIZE_ARITHMETIC = frozenset({operator.add, operator.sub, operator.mul, operator.floordiv,
                              operator.neg, operator.getitem})


def slice_dim(ctx: OpContext, dim: Dim, start: int | None, stop: int | None, n: int,
              why: str = "a slice bound of constant value fixes the size of this part"
              ) -> Dim:
    """The part ``[start:stop]`` (step 1, bounds of constant value or left out: see
    :func:`_constant_bound`) of an elastic dim of ``n`` entries.

    The dim is cut at the slice's ends (:func:`cut_dim`) into a head, the part kept and a
    tail; only the parts whose sizes the numbers fix are pinned, so the rest can still
    change: ``x[..., :r]`` pins the part kept (a rotary slice), ``x[..., r:]`` the head,
    ``x[..., :-1]`` the tail. Where the cut cannot be made the whole dim is pinned.
    """
    a, b, _ = slice(start, stop).indices(n)
    try:
        head, mid, tail = cut_dim(ctx, dim, [a, b - a, n - b])
    except Unsupported as exc:
        ctx.fix(dim, f"an elastic dim is sliced: {exc}")
        return fixed_dim(b - a)
    pinned: list[Dim] = []
    if start is not None:  # from the start: the head's size; from the end: mid and tail's
        pinned += [head] if start >= 0 else [mid, tail]
    if stop is not None:
        pinned += [head, mid] if stop >= 0 else [tail]
    for part in pinned:
        ctx.fix(part, why)
    return ctx.table.resolve(mid)


_SHAPE_READS = frozenset({"size", "dim", "numel", "nelement"})


def _read_for_shape_only(node: torch.fx.Node) -> bool:
    """Whether the value is only asked for its shape, dtype or device (its entries unused)."""
    def shape_read(user: torch.fx.Node) -> bool:
        if user.op == "call_method":
            return user.target in _SHAPE_READS
        return user.op == "call_function" and user.target is getattr and len(user.args) > 1 \
            and user.args[1] in ("shape", "dtype", "device", "ndim")

    return bool(node.users) and all(shape_read(u) for u in node.users)


def getattr_rule(ctx: OpContext) -> Layout:
    name = ctx.arg(1)
    if name == "shape" and isinstance(ctx.layout(ctx.arg(0)), TensorLayout):
        return tuple(SizeLayout((dim,)) for dim in ctx.tensor_layout(ctx.arg(0)))
    container = ctx.layout(ctx.arg(0))
    if name in ("values", "indices") and isinstance(container, tuple) and not isinstance(
            container, TensorLayout) and len(container) == 2:  # (values, indices) of max...
        return container[0 if name == "values" else 1]
    if not isinstance(ctx.value, torch.Tensor):
        return ctx.fixed()
    if name in ("T", "mT"):
        return matrix_transpose(ctx)
    if name in ("data", "real"):
        return same_as_input(ctx)
    ctx.unsupported(f"tensor attribute {name!r}")
    return None


# -- functional forms of the module families ----------------------------------------------------
# A subclass that overrides ``forward`` (a Linear with its own forward, timm's StdConv2d) is
# traced into; there the family's weights arrive through ``get_attr``, possibly after
# arithmetic. Each rule ties the weight's input dim to the input's and declares the weight's
# output dim a producer (``ctx.produce``), so the group starts there as at the family's
# OUTGOING symbol; biases and norm weights become members. Arithmetic before the op keeps a
# group only where the other rules prove it: a reduction over the other dims of the weight
# with ``keepdim`` (weight standardisation per output channel), a broadcast against a per-row
# gain, ``batch_norm`` of ``weight.reshape(1, weight.shape[0], -1)`` in training mode, which
# normalises each row over its own entries only.
def linear_fn(ctx: OpContext) -> Layout:
    """``F.linear(x, w, b)``: x's last dim meets w's input dim; the output dim is w's rows,
    produced there."""
    x, w = ctx.arg(0, "input"), ctx.arg(1, "weight")
    lx, lw = ctx.tensor_layout(x), ctx.tensor_layout(w)
    if len(lw) != 2:
        ctx.unsupported("linear weight of unexpected rank")
    ctx.unify(lx[-1], lw[-1])
    b = ctx.arg(2, "bias", None)
    out_dim = lw[0]
    if isinstance(b, torch.fx.Node):
        out_dim = ctx.unify(out_dim, ctx.tensor_layout(b)[0])
    ctx.produce(out_dim, w)
    return TensorLayout([*lx[:-1], out_dim])


def embedding_fn(ctx: OpContext) -> Layout:
    """``F.embedding(ids, w)``: the output's last dim is w's columns, produced there; the ids'
    dims are fixed. The ids pick w's rows by position, so the rows (the vocabulary) are
    pinned: were they tied to a group, permuting it would change which row each id reads."""
    idx, w = ctx.arg(0, "input"), ctx.arg(1, "weight")
    lw = ctx.tensor_layout(w)
    if len(lw) != 2:
        ctx.unsupported("embedding weight of unexpected rank")
    ctx.fix(lw[0], "embedding picks the weight's rows by position")
    ctx.produce(lw[1], w)
    return TensorLayout([*(fixed_dim(s) for s in ctx.shape(idx)), lw[1]])


def norm_fn(channel_dim: int | None, param_names: Sequence[tuple[int, str]]) -> Rule:
    """Functional norms: per-channel parameters meet the input's channel dim."""

    def rule(ctx: OpContext) -> Layout:
        x = ctx.arg(0, "input")
        lay = list(ctx.tensor_layout(x))
        if channel_dim is None:
            # a normalized shape written as numbers cannot follow a resize; sizes read from
            # the input (``x.shape[-1:]``) can, and so can module attributes
            # (``self.normalized_shape``), which are tied to the dims they normalize
            arg = ctx.arg(1, "normalized_shape")
            items = list(arg) if isinstance(arg, (tuple, list)) else [arg]
            shape = ctx.val(arg)
            shape = [shape] if isinstance(shape, int) else list(shape)
            sizes = ctx.layout(arg) if isinstance(arg, torch.fx.Node) else tuple(
                ctx.layout(a) for a in items)
            traced = _traced_sizes(sizes, len(shape))
            for i, d in enumerate(lay[len(lay) - len(shape):]):
                if traced and tie_size(ctx, sizes[i], d):
                    continue
                if traced and _same_size(ctx, traced[i], d):
                    size_checked(ctx, sizes[i])
                elif not is_fixed(d):
                    ctx.fix(d, "layer_norm's normalized_shape is a literal")
            d = len(lay) - 1
        else:
            d = channel_dim
        for idx, pname in param_names:
            p = ctx.arg(idx, pname, None)
            if isinstance(p, torch.fx.Node):
                lay[d] = ctx.unify(lay[d], ctx.tensor_layout(p)[0])
        return TensorLayout(lay)

    return rule


def conv_fn(ctx: OpContext) -> Layout:
    """``F.conv1d/2d/3d(x, w, b)`` with one group: x's channels meet w's input channels; the
    output channels are w's rows, produced there; the kernel dims are fixed."""
    x, w = ctx.arg(0, "input"), ctx.arg(1, "weight")
    lx, lw = ctx.tensor_layout(x), ctx.tensor_layout(w)
    if int(ctx.val(ctx.arg(6, "groups", 1))) != 1:
        ctx.unsupported("functional grouped convolution")
    batched = len(lx) == len(lw)
    c = 1 if batched else 0
    ctx.unify(lx[c], lw[1])
    for k in lw[2:]:
        if not is_fixed(k):
            ctx.fix(k, "a convolution's kernel size")
    out_c = lw[0]
    b = ctx.arg(2, "bias", None)
    if isinstance(b, torch.fx.Node):
        out_c = ctx.unify(out_c, ctx.tensor_layout(b)[0])
    ctx.produce(out_c, w)
    shape = ctx.out_shape()
    dims = [*lx[:c], out_c, *(fixed_dim(n) for n in shape[c + 1:])]
    return TensorLayout(dims)


def pixel_shuffle(ctx: OpContext) -> Layout:
    """``pixel_shuffle``: r*r consecutive channels become one channel (coarser units);
    ``pixel_unshuffle``: each channel becomes r*r consecutive ones (a longer block)."""
    x = ctx.arg(0, "input")
    lay = list(ctx.tensor_layout(x))
    c = len(lay) - 3
    seg_dim = lay[c]
    out_shape = ctx.out_shape()
    dims = [*lay[:c], fixed_dim(out_shape[c]), *(fixed_dim(n) for n in out_shape[c + 1:])]
    if is_fixed(seg_dim):
        return TensorLayout(dims)
    if len(seg_dim) != 1:
        ctx.unsupported("pixel shuffle of concatenated groups")
    seg = seg_dim[0]
    assert seg.group is not None
    if out_shape[c] > seg.length:  # unshuffle
        dims[c] = (Seg(seg.group, seg.units, seg.block * out_shape[c] // seg.length),)
    elif seg.block == 1 and seg.units % out_shape[c] == 0:
        ctx.table.constrain(seg.group, out_shape[c])
        dims[c] = (Seg(seg.group, out_shape[c], 1),)
    else:
        ctx.unsupported("pixel shuffle within a unit")
    return TensorLayout(dims)


def patch_merging_pad(ctx: OpContext) -> Layout:
    """torchvision's Swin ``_patch_merging_pad``: 2x2 neighbours concatenated on channels."""
    lay = ctx.tensor_layout(ctx.arg(0, "x"))
    shape = ctx.out_shape()
    return TensorLayout([*lay[:-3], fixed_dim(shape[-3]), fixed_dim(shape[-2]),
                         concat_dims([lay[-1]] * 4)])


def _of_model_tensors_only(node: Any) -> bool:
    """Whether ``node`` is computed from the model's own tensors alone: no graph input reaches
    it (``self.weight.T``, ``self.weight * self.gain``), so it is a weight, not an activation.

    A selection by position (``self.gate_up_proj[expert_ids]``, ``index_select``) counts as the
    tensor it selects from, whatever computed the positions: each selected slice is one of the
    model's own, so its other dims still hold the weight's entries one for one (the experts a
    router picks per token, each a ``[2I, H]`` matrix). The indexed dim itself is pinned by the
    indexing rule, so it is never declared a producer through this."""
    if not isinstance(node, torch.fx.Node):
        return False
    seen: set[torch.fx.Node] = set()
    queue = [node]
    while queue:
        n = queue.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder" or len(seen) > 64:
            return False
        selected = _selected_from(n)
        queue.extend([selected] if selected is not None else n.all_input_nodes)
    return True


def _selected_from(node: torch.fx.Node) -> torch.fx.Node | None:
    """The tensor ``node`` selects entries of by a tensor of positions (``x[index]``,
    ``x.index_select(d, index)``), or ``None``."""
    if node.op not in ("call_function", "call_method") or not node.args:
        return None
    source = node.args[0]
    if not isinstance(source, torch.fx.Node):
        return None
    if node.target in (torch.index_select, "index_select"):
        return source
    if node.target is operator.getitem and len(node.args) > 1:
        items = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
        if any(isinstance(i, torch.fx.Node) for i in items) and all(
                isinstance(i, torch.fx.Node) or i is None or i is Ellipsis
                or i == slice(None) for i in items):
            return source
    return None


def _matmul_layout(ctx: OpContext, a: Any, b: Any) -> TensorLayout:
    """``a @ b``: batch dims broadcast, the contracted dims tie, the rest pass through.

    Where an operand is one of the model's tensors (``x @ self.weight.T``,
    ``self.weight @ x``), each entry of its free matrix dim (b's columns, a's rows) makes one
    entry of the output's, as a Linear's weight rows make its outputs: that dim is declared a
    producer (:meth:`OpContext.produce`), so the group starts there."""
    la, lb = list(ctx.tensor_layout(a)), list(ctx.tensor_layout(b))
    sa, sb = list(ctx.shape(a)), list(ctx.shape(b))
    a1, b1 = len(la) == 1, len(lb) == 1
    if a1:
        la, sa = [fixed_dim(1), *la], [1, *sa]
    if b1:
        lb, sb = [*lb, fixed_dim(1)], [*sb, 1]
    ctx.unify(la[-1], lb[-2])
    batch_shape = tuple(torch.broadcast_shapes(  # type: ignore[no-untyped-call]  # torch: untyped
        tuple(sa[:-2]), tuple(sb[:-2])))
    batch = _broadcast(ctx, [TensorLayout(la[:-2]), TensorLayout(lb[:-2])],
                       [tuple(sa[:-2]), tuple(sb[:-2])], batch_shape)
    if not b1 and _of_model_tensors_only(b):
        ctx.produce(lb[-1], b)
    if not a1 and _of_model_tensors_only(a):
        ctx.produce(la[-2], a)
    return TensorLayout([*batch, *([] if a1 else [la[-2]]), *([] if b1 else [lb[-1]])])


def matmul(ctx: OpContext) -> Layout:
    """``a @ b``, ``torch.matmul``, ``mm``, ``bmm``: see :func:`_matmul_layout`."""
    return _matmul_layout(ctx, ctx.arg(0, "input"), ctx.arg(1, "other"))


def add_matmul(ctx: OpContext) -> Layout:
    """``addmm(c, a, b)`` and ``baddbmm(c, a, b)``: ``beta * c + alpha * (a @ b)``; ``c``
    broadcasts against the product (a bias joins the output's group)."""
    c = ctx.arg(0, "input")
    names = ("mat1", "mat2") if ctx.node.target in (torch.addmm, "addmm") else ("batch1", "batch2")
    prod = _matmul_layout(ctx, ctx.arg(1, names[0]), ctx.arg(2, names[1]))
    out_shape = ctx.out_shape()
    if not isinstance(c, torch.fx.Node):
        return prod
    return _broadcast(ctx, [prod, ctx.tensor_layout(c)], [out_shape, ctx.shape(c)], out_shape)


def einsum(ctx: OpContext) -> Layout:
    """``torch.einsum``: dims sharing a letter tie; letters missing from the output end."""
    eq = str(ctx.arg(0, "equation")).replace(" ", "")
    operands = list(ctx.node.args[1:])
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = list(operands[0])
    if "..." in eq or "->" not in eq:
        ctx.unsupported("einsum with an ellipsis or an implicit output")
    inputs, output = eq.split("->")
    by_letter: dict[str, list[Dim]] = {}
    for spec, op in zip(inputs.split(","), operands):
        lay = ctx.tensor_layout(op)
        shape = ctx.shape(op)
        for letter, dim, n in zip(spec, lay, shape):
            if n != 1:
                by_letter.setdefault(letter, []).append(dim)
    tied = {k: ctx.unify(*v) for k, v in by_letter.items()}
    out_shape = ctx.out_shape()
    return TensorLayout(tied.get(letter, fixed_dim(n)) for letter, n in zip(output, out_shape))


def sdpa(ctx: OpContext) -> Layout:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask)``: heads and batch tie across q, k,
    v (and broadcast with the mask); q and k tie on the feature dim."""
    q, k, v = ctx.arg(0, "query"), ctx.arg(1, "key"), ctx.arg(2, "value")
    lq, lk, lv = ctx.tensor_layout(q), ctx.tensor_layout(k), ctx.tensor_layout(v)
    sq, sk, sv = ctx.shape(q), ctx.shape(k), ctx.shape(v)
    if ctx.val(ctx.arg(7, "enable_gqa", False)) and sq[:-2] != sk[:-2]:
        ctx.unsupported("grouped-query attention inside scaled_dot_product_attention")
    ctx.unify(lq[-1], lk[-1])
    ctx.unify(lk[-2], lv[-2])
    layouts = [TensorLayout(lq[:-2]), TensorLayout(lk[:-2]), TensorLayout(lv[:-2])]
    shapes = [sq[:-2], sk[:-2], sv[:-2]]
    mask = ctx.arg(3, "attn_mask", None)
    if isinstance(mask, torch.fx.Node):
        lm, sm = ctx.tensor_layout(mask), ctx.shape(mask)
        if sm[-1] != 1:
            ctx.unify(lm[-1], lk[-2])
        if len(sm) > 1 and sm[-2] != 1:
            ctx.unify(lm[-2], lq[-2])
        layouts.append(TensorLayout(lm[:-2]))
        shapes.append(tuple(sm[:-2]))
    out_shape = ctx.out_shape()
    batch = _broadcast(ctx, layouts, shapes, tuple(out_shape[:-2]))
    return TensorLayout([*batch, lq[-2], lv[-1]])


# -- the table ---------------------------------------------------------------------------------
_ELEMENTWISE_FUNCS: list[Any] = [
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
    operator.pow, operator.mod, operator.iadd, operator.isub, operator.imul, operator.itruediv,
    operator.and_, operator.or_, operator.xor, operator.eq, operator.ne, operator.lt,
    operator.le, operator.gt, operator.ge,
    torch.add, torch.sub, torch.mul, torch.div, torch.true_divide, torch.pow, torch.maximum,
    torch.minimum, torch.eq, torch.ne, torch.lt, torch.gt, torch.le, torch.ge,
    torch.logical_and, torch.logical_or, torch.lerp, torch.addcmul, torch.addcdiv,
    torch.masked_fill, torch.fmod, torch.remainder, torch.atan2, torch.hypot,
]
_ELEMENTWISE_METHODS = [
    "add", "sub", "mul", "div", "true_divide", "pow", "maximum", "minimum", "masked_fill",
    "add_", "sub_", "mul_", "div_", "pow_", "masked_fill_", "eq", "ne", "lt", "gt", "le", "ge",
    "where", "lerp", "addcmul", "addcdiv", "addcmul_", "addcdiv_", "fmod", "remainder",
    "__add__", "__mul__", "__sub__", "__truediv__", "__radd__", "__rmul__",
]
_UNARY_FUNCS: list[Any] = [
    operator.neg, operator.pos, operator.invert, abs,
    torch.relu, torch.relu_, torch.sigmoid, torch.tanh, torch.exp, torch.log, torch.sqrt,
    torch.rsqrt, torch.abs, torch.neg, torch.sin, torch.cos, torch.erf, torch.clamp,
    torch.clip, torch.sign, torch.square, torch.reciprocal, torch.log1p, torch.expm1,
    torch.floor, torch.ceil, torch.round, torch.trunc, torch.isnan, torch.isinf,
    torch.logical_not, torch.nan_to_num, torch.clone, torch.detach, torch.softmax,
    torch.log_softmax, torch.dropout, torch.alpha_dropout, torch.feature_dropout,
    F.relu, F.relu_, F.relu6, F.elu, F.selu, F.celu, F.leaky_relu, F.leaky_relu_, F.gelu,
    F.silu, F.mish, F.hardswish, F.hardsigmoid, F.hardtanh, F.hardtanh_, F.sigmoid, F.tanh,
    F.softplus, F.softsign, F.tanhshrink, F.logsigmoid, F.threshold, F.rrelu, F.dropout,
    F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout,
    F.feature_alpha_dropout, F.softmax, F.log_softmax, F.softmin, F.normalize,
]
_UNARY_METHODS = [
    "relu", "relu_", "sigmoid", "sigmoid_", "tanh", "tanh_", "exp", "log", "sqrt", "rsqrt",
    "abs", "neg", "sin", "cos", "erf", "clamp", "clamp_", "clamp_min", "clamp_max", "clip",
    "sign", "square", "reciprocal", "floor", "ceil", "round", "float", "double", "half",
    "bfloat16", "int", "long", "bool", "to", "type", "type_as", "contiguous", "clone",
    "detach", "detach_", "cpu", "cuda", "softmax", "log_softmax",
    "masked_fill", "nan_to_num", "requires_grad_", "exp_", "log_", "sqrt_", "fill_", "zero_",
    "hardtanh_", "clamp_min_", "abs_", "neg_", "logical_not", "isnan", "isinf", "pin_memory",
    "sigmoid", "erf_", "pow", "square_", "float_power",
]


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


def register_op_rules(register: Callable[[Any, Rule], None]) -> None:
    """Register every rule of this module with fxsym (called from the plugin hook)."""
    t: OpTarget
    for f in _ELEMENTWISE_FUNCS:
        register(f, elementwise)
    for m in _ELEMENTWISE_METHODS:
        register(m, elementwise)
    for f in dict.fromkeys(_UNARY_FUNCS):
        register(f, same_as_input)
    for m in dict.fromkeys(_UNARY_METHODS):
        register(m, same_as_input)
    for t in (torch.sum, torch.mean, torch.amax, torch.amin, torch.prod, torch.logsumexp,
              torch.all, torch.any, torch.nansum, torch.nanmean, "sum", "mean", "amax", "amin",
              "prod", "logsumexp", "all", "any", "nansum", "nanmean"):
        register(t, reduction)
    register_order_rules(register)
    register(torch.cat, concat)
    register(torch.concat, concat)
    register(torch.concatenate, concat)
    register(torch.stack, stack)
    for t in (torch.split, torch.chunk, torch.unbind, "split", "chunk", "unbind"):
        register(t, split)
    for t in ("view", "reshape", torch.reshape):
        register(t, view)
    for t in (torch.flatten, "flatten", "unflatten", torch.unflatten, "view_as", "reshape_as"):
        register(t, reshape_as_value)
    for t in (torch.permute, "permute"):
        register(t, permute)
    for t in (torch.transpose, "transpose", torch.swapaxes, "swapaxes", "swapdims"):
        register(t, transpose)
    for t in (torch.t, "t"):
        register(t, matrix_transpose)
    for t in (torch.unsqueeze, "unsqueeze"):
        register(t, unsqueeze)
    for t in (torch.squeeze, "squeeze"):
        register(t, squeeze)
    for t in ("expand", "expand_as", "repeat", torch.broadcast_to, "broadcast_to"):
        register(t, expand)
    register("size", size)
    for t in ("numel", "nelement", torch.numel):
        register(t, numel)
    for t in ("dim", "element_size", "is_contiguous",
              "is_floating_point", "tolist", "item", operator.not_, operator.is_,
              operator.is_not, len, isinstance, math.prod):
        register(t, not_a_tensor)
    for t in (torch.empty, torch.rand, torch.randn, torch.tensor, torch.zeros_like,
              torch.ones_like, torch.empty_like, torch.full_like, torch.rand_like,
              torch.randn_like, "new_empty", "new_tensor", "bernoulli_", "uniform_", "normal_",
              "bernoulli", torch.bernoulli):
        register(t, creation)
    for t in (torch.zeros, torch.ones, torch.full, "new_zeros", "new_ones", "new_full"):
        register(t, constant_fill)
    for k, fs in {
        1: (F.max_pool1d, F.avg_pool1d, F.adaptive_avg_pool1d, F.adaptive_max_pool1d,
            F.lp_pool1d),
        2: (F.max_pool2d, F.avg_pool2d, F.adaptive_avg_pool2d, F.adaptive_max_pool2d,
            F.lp_pool2d, F.max_pool2d_with_indices, torch.max_pool2d, torch.avg_pool1d,
            torch._C._nn.avg_pool2d, torch._C._nn.adaptive_avg_pool2d),
        3: (F.max_pool3d, F.avg_pool3d, F.adaptive_avg_pool3d, F.adaptive_max_pool3d),
    }.items():
        for f in fs:
            register(f, trailing_spatial(k))
    register(F.interpolate, _interpolate)
    register(F.pad, pad)
    # stochastic depth drops whole samples: channels pass through
    register("torchvision.ops.stochastic_depth.stochastic_depth", same_as_input)
    register("torchvision.models.swin_transformer._patch_merging_pad", patch_merging_pad)
    register(operator.getitem, getitem)
    register(getattr, getattr_rule)
    register(F.linear, linear_fn)
    register(F.embedding, embedding_fn)
    for t in (torch.var_mean, torch.std_mean):  # (var, mean): both reduce the same dims
        register(t, reduce_rule(keepdim_at=3))
    for t in (torch.matmul, operator.matmul, torch.bmm, torch.mm, "matmul", "bmm", "mm",
              "__matmul__"):
        register(t, matmul)
    for t in (torch.addmm, torch.baddbmm, "addmm", "baddbmm"):
        register(t, add_matmul)
    register(torch.einsum, einsum)
    for t in (F.conv1d, F.conv2d, F.conv3d):
        register(t, conv_fn)
    for t in (F.pixel_shuffle, F.pixel_unshuffle, torch.pixel_shuffle, torch.pixel_unshuffle):
        register(t, pixel_shuffle)
    register(F.scaled_dot_product_attention, sdpa)
    register(F.layer_norm, norm_fn(None, [(2, "weight"), (3, "bias")]))
    register(F.batch_norm, norm_fn(1, [(1, "running_mean"), (2, "running_var"),
                                       (3, "weight"), (4, "bias")]))
    register(F.group_norm, _group_norm_fn)
    register(F.instance_norm, norm_fn(1, [(1, "running_mean"), (2, "running_var"),
                                          (3, "weight"), (4, "bias")]))


def _interpolate(ctx: OpContext) -> Layout:
    x = ctx.arg(0, "input")
    return trailing_spatial(len(ctx.shape(x)) - 2)(ctx)


def _producerless(ctx: OpContext, dim: Dim) -> bool:
    """Whether every group in ``dim`` has no producer (it only holds parameter dims)."""
    return all(s.group is None or not ctx.table.producers.get(ctx.table.find(s.group))
               for s in dim)


def _traced_sizes(sizes: Any, n: int) -> list[Dim] | None:
    """The Dims ``n`` sizes follow if each was read directly from a shape, else ``None``."""
    if not isinstance(sizes, tuple) or len(sizes) != n:
        return None
    out: list[Dim] = []
    for item in sizes:
        if not isinstance(item, SizeLayout) or item.derived or len(item) != 1:
            return None
        out.append(item[0])
    return out


def _same_size(ctx: OpContext, size: Dim, dim: Dim) -> bool:
    """Whether a size read from a shape follows ``dim`` exactly."""
    return _same_dim(ctx, size, dim)


def _group_norm_fn(ctx: OpContext) -> Layout:
    """``F.group_norm(x, G, w, b)`` normalises each run of ``C // G`` consecutive channels
    together, as ``nn.GroupNorm`` does: the channels change a whole run at a time
    (:meth:`OpContext.whole_units`) and ``G`` must follow the number of runs kept. It does
    when read from the input's shape (``G`` equal to the channels) or from a module attribute
    (``self.num_groups`` of a GroupNorm subclass traced into), which is then tied to the
    runs: a member of the channels' group set to the runs kept. ``G = 1`` keeps every channel
    order. Any other ``G`` (a number) cannot follow a resize and pins the channels."""
    x = ctx.arg(0, "input")
    lay = list(ctx.tensor_layout(x))
    g_arg = ctx.arg(1, "num_groups")
    groups = int(ctx.val(g_arg))
    if not is_fixed(lay[1]) and groups != 1:
        size = ctx.layout(g_arg)
        traced = _traced_sizes((size,), 1)
        shape_read = groups == ctx.shape(x)[1] and traced and _same_size(ctx, traced[0], lay[1])
        if shape_read:
            size_checked(ctx, size)
        elif ctx.whole_units(lay[1], groups, "group_norm"):
            channels = ctx.table.resolve(lay[1])
            if len(channels) != 1:
                ctx.fix(channels, "group_norm over a concatenation: num_groups is not tied")
            elif not tie_size(ctx, size, (Seg(channels[0].group, groups, 1),)):
                ctx.fix(lay[1], "group_norm's num_groups is a number: it cannot follow the "
                                "channels kept")
    for idx, pname in ((2, "weight"), (3, "bias")):
        p = ctx.arg(idx, pname, None)
        if isinstance(p, torch.fx.Node):
            lay[1] = ctx.unify(lay[1], ctx.tensor_layout(p)[0])
    return TensorLayout(lay)


__all__ = ["register_op_rules"]
