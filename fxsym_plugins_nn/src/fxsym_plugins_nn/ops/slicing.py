"""Indexing and slicing: ``x[...]``, ``narrow``, ``select``, and container and attribute reads.

A slice with step 1 cuts its dim at both ends (:func:`~.pieces.cut_dim`): bounds written as
numbers, or computed from sizes that are pinned, fix the sizes of exactly the parts they fix
(``x[..., :r]`` the part kept, ``x[..., r:]`` the head, ``x[..., :-1]`` the tail), and the rest
can still change; bounds that are linear forms in kept units (:mod:`.linear_sizes`) make the
parts follow them. An int or a tensor index reads a dim by position: pinned, unless it only
picks entries of a fixed part that keep their place under every resize. A value read only for
its shape pins nothing.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from fxsym.analysis import (
    AttributeSize,
    Dim,
    Layout,
    OpContext,
    SizeLayout,
    TensorLayout,
    Unsupported,
    fixed_dim,
    is_fixed,
    size_checked,
    tie_size,
)

from .common import BY_POSITION, checked_layout, norm_dim, of_attributes_only, pin_dims
from .elementwise import same_as_input
from .linear_sizes import (
    LinearSize,
    computed_from_sizes,
    linear_size_of_dim,
    linear_size_of_int,
    tie_part_to_bound,
)
from .pieces import cut_dim
from .views import matrix_transpose


def narrow(ctx: OpContext) -> Layout:
    """``narrow(x, d, start, length)``: a slice; the whole dim passes. A part given by
    numbers is ``x[start:start + length]`` along ``d`` (:func:`slice_dim`), a negative start
    counting from the end as in a slice: ``narrow(x, d, 3, 2)`` pins the head and the part
    kept (the tail may change), ``narrow(x, d, -5, 2)`` is ``x[-5:-3]`` and pins the part kept
    and the tail (the head may change). Other parts pin the dim."""
    x = ctx.arg(0, "input")
    lay = list(ctx.tensor_layout(x))
    d = norm_dim(int(ctx.val(ctx.arg(1, "dim"))), len(lay))
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
            pin_dims(ctx, lay[d], "keeps a part of an elastic dim")
            lay[d] = fixed_dim(out[d])
    return checked_layout(ctx, lay, ctx.value)


def select(ctx: OpContext) -> Layout:
    """``select(x, d, i)``: one entry of dim ``d``, picked by position."""
    x = ctx.arg(0, "input")
    lay = list(ctx.tensor_layout(x))
    d = norm_dim(int(ctx.val(ctx.arg(1, "dim"))), len(lay))
    pin_dims(ctx, lay[d], "picks one entry of an elastic dim by position")
    return checked_layout(ctx, lay[:d] + lay[d + 1:], ctx.value)


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
                if k < len(raw_items) and isinstance(raw_items[k], slice):
                    _whole_slice_stop(ctx, lay[d], raw_items[k].stop, shape[d])
                out.append(lay[d])
            elif is_fixed(lay[d]) or shape_only:
                out.append(fixed_dim(len(range(start, stop, step))))
            else:
                r = raw_items[k] if k < len(raw_items) else None
                traced = None
                if isinstance(r, slice) and step == 1 and 0 <= start < stop:
                    traced = _slice_by_traced_bounds(ctx, lay[d], r, start, stop, shape[d])
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


def _whole_slice_stop(ctx: OpContext, dim: Dim, stop: Any, n: int) -> None:
    """A slice that keeps all ``n`` entries of ``dim`` up to a stop read from module
    attributes (timm's ``out[:, :self.out_chs]`` of a ghost module's ``out_chs`` channels).
    Where ``dim`` is one group and the stop one attribute equal to ``n``, the attribute is tied
    to it (a member, which ``fxsym.resize`` writes: the slice stays whole). Otherwise the
    attributes keep their value, at or past the end of the dim under every resize (a resize
    only drops entries), so the slice stays whole too: they are pinned with a detail line, and
    the dim keeps its groups."""
    lay = ctx.layout(stop) if isinstance(stop, torch.fx.Node) else None
    if not isinstance(lay, SizeLayout):
        return
    table = ctx.table
    single = len(dim) == 1 and dim[0].group is not None and not table.is_constant(dim[0].group)
    if single and isinstance(lay, AttributeSize) and ctx.val(stop) == n and tie_size(
            ctx, lay, dim):
        return
    if of_attributes_only(ctx, lay) and ctx.val(stop) >= n:
        ctx.analyzer.fix(lay, "a slice stop read from a module attribute, at or past the end "
                         "of the dim: it keeps its value and the slice stays whole", ctx.node,
                         sizes_no_tensor=True)
        size_checked(ctx, lay)


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
        pin_dims(ctx, lay[d], BY_POSITION)
    return checked_layout(ctx, [*lay[:d], *index_dims, *lay[d + 1:]], ctx.value)


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


def _slice_by_traced_bounds(ctx: OpContext, dim: Dim, raw: slice, start: int, stop: int,
                            n: int) -> Dim | None:
    """``x[..., a:b]`` of an elastic dim, ``a`` and ``b`` computed from sizes that follow a
    resize (``qkv[..., q:q + self.num_key_value_heads * self.head_dim]``): the dim is cut at
    both ends, and the part before ``a`` and the parts before ``b`` are made to keep the
    bounds' sizes (:func:`tie_part_to_bound`). ``None`` where a bound is constant, or not
    linear in the kept units, or a part cannot be made to follow it (the caller then pins)."""
    bounds = [v for v in (raw.start, raw.stop) if v is not None]
    if not bounds or not all(isinstance(v, torch.fx.Node) or type(v) is int for v in bounds):
        return None
    if not all(type(v) is int or computed_from_sizes(v) for v in bounds):
        return None
    forms = [linear_size_of_int(ctx, v) for v in bounds]
    if any(f is None for f in forms) or not any(f[1] for f in forms if f is not None):
        return None
    try:
        head, mid, _tail = cut_dim(ctx, dim, [start, stop - start, n - stop])
    except Unsupported:
        return None
    zero: LinearSize = (0, {})
    if raw.start is not None and not tie_part_to_bound(ctx, head, raw.start, zero):
        return None
    if raw.stop is not None:
        base = linear_size_of_dim(ctx, head) if raw.start is not None else zero
        if not tie_part_to_bound(ctx, ctx.table.resolve(mid), raw.stop, base):
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
    if not computed_from_sizes(bound):
        return False
    lay = ctx.layout(bound)
    if isinstance(lay, SizeLayout):
        for d in lay:
            if not is_fixed(d):
                ctx.fix(d, "a slice bound is computed from this size")
    return True


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

