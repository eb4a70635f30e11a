"""Values that are positions along a dim: what a router's ``topk`` returns, and where it goes.

``topk(scores, k, dim=d)`` and the indices of ``max``/``min``/``argmax`` along ``d`` return
*positions* along ``d``: when ``d`` is a group (the experts of a mixture of experts, whose rows
the router's weight produces), the analysis records them with the value
(:meth:`fxsym.analysis.OpContext.give_positions`) instead of pinning the group. A permutation
of the group moves the entries and their positions alike, so what a position reads is the same
entry: the group stays, *routed* (:meth:`fxsym.analysis.OpContext.pick_by_value`), keeping at
least ``k`` units. What may happen to the positions is then proven op by op:

* **indexing** a tensor by them along one dim — ``w[idx]``, ``w[:, idx]``,
  ``index_select(w, d, idx)``, ``gather(x, d, idx)``, ``take_along_dim(x, idx, d)``,
  ``scatter(x, d, idx, ...)`` — ties that dim of the tensor to the group: it reads (or writes)
  the entry each position names, whatever the group's size (the fused expert tensors'
  ``[E, ...]`` dim, per-expert biases and scales, a score row);
* ``one_hot(idx, n)`` lays a new dim of ``n`` classes along the group; ``n`` must follow the
  group: a module attribute (``self.num_experts``, tied, then updated by ``resize``) or a size
  read from the group's dim;
* ops that move or copy values without changing them pass them on: reshapes, (un)squeeze,
  expand and repeat, permutes and transposes, casts, copies, basic slicing of the position
  tensor itself, ``repeat_interleave``, and concatenation or stacking of positions along one
  group (PhiMoE's two picks); size reads (``idx.shape``, ``idx.size(-1)``) read no values.

Any other use — arithmetic (``idx + 1``), comparisons, sorting, ``bincount``, an output of
the model, a module called with them — pins the group (the analyzer's check, see
:mod:`fxsym.analysis.context`): it would see positions that a resize moved.

Dropping an entry of a routed group changes which entries the router picks (that is what
expert pruning is), so the value oracle does not check such a group; the permutation and
shrink oracles do.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from fxsym.analysis import (
    AttributeSize,
    Dim,
    Layout,
    OpContext,
    SizeLayout,
    TensorLayout,
    dim_size,
    fixed_dim,
    is_fixed,
    size_checked,
    tie_size,
)

from .common import Rule, checked_layout, norm_dim, op_name
from .order import _indices_read, gathered_dims

#: why a pick by value pins a dim it cannot route (a concatenation, heads of several entries)
PICKS = "returns positions of entries it picks by value"
#: ops whose result holds the values of their first operand, moved or copied
PASS_ON = ("view", "reshape", torch.reshape, torch.flatten, "flatten", "unflatten",
           torch.unflatten, torch.unsqueeze, "unsqueeze", torch.squeeze, "squeeze", "expand",
           "expand_as", "repeat", torch.broadcast_to, "broadcast_to", torch.permute, "permute",
           torch.transpose, "transpose", "swapaxes", "t", torch.t, "contiguous", "clone",
           torch.clone, "detach", torch.detach, "to", "long", "int", "type",
           torch.repeat_interleave, "repeat_interleave")
#: reads of a tensor's shape, not of its values
SHAPE_READS = ("size", "dim", "numel", "nelement", torch.numel)
#: attributes of a tensor that are not its values
_SHAPE_ATTRIBUTES = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "layout"})


def _point_at(ctx: OpContext, target: Dim, positions: Dim) -> None:
    """``target``, a dim read or written at ``positions``, is the dim they index: tie them
    (of another length, or structure, both are pinned by :meth:`OpContext.unify`)."""
    if dim_size(target) != dim_size(positions):
        ctx.fix(target, "is indexed by positions along a dim of another size")
        ctx.fix(positions, "index a dim of another size")
        return
    ctx.unify(target, positions)


# -- picks by value ----------------------------------------------------------------------------
def topk(ctx: OpContext) -> Layout:
    """``topk(x, k, dim)``: the values and indices keep ``x``'s other dims; along ``dim``
    both have ``k`` fixed entries, and the indices are positions along ``x``'s dim."""
    x = ctx.arg(0, "input")
    lay = ctx.tensor_layout(x)
    k_arg = ctx.arg(1, "k")
    k = int(ctx.val(k_arg))
    d = norm_dim(int(ctx.val(ctx.arg(2, "dim", -1))), len(lay))
    dims = list(lay)
    dims[d] = fixed_dim(k)
    size = ctx.layout(k_arg)
    if isinstance(size, SizeLayout):  # self.top_k: how many entries are picked stays
        for dim in size:
            ctx.fix(dim, "topk's k, the number of entries picked, stays as it is")
        size_checked(ctx, size)
    routed = not is_fixed(lay[d]) and ctx.pick_by_value(lay[d], k, f"topk {PICKS}")
    value = ctx.value
    out = tuple(checked_layout(ctx, dims, v) for v in value)
    if routed:
        ctx.give_positions(lay[d], item=1)
    return out


def pick_along(original: Rule | None) -> Rule:
    """``max``/``min`` with a dim whose indices are read, and ``argmax``/``argmin`` with a
    dim: one entry picked by value, its position along a routed group. Other forms (no dim,
    the elementwise ``max(a, b)``, the values alone: a value reduction) and fixed dims follow
    ``original``."""

    def rule(ctx: OpContext) -> Layout:
        x = ctx.arg(0, "input")
        lay = ctx.layout(x)
        raw = ctx.val(ctx.arg(1, "dim", None))
        if not isinstance(lay, TensorLayout) or not isinstance(raw, int) or isinstance(
                raw, bool):
            return _fallback(ctx, original)
        d = norm_dim(raw, len(lay))
        if is_fixed(lay[d]) or (isinstance(ctx.value, tuple) and not _indices_read(ctx.node)):
            return _fallback(ctx, original)
        keepdim = bool(ctx.val(ctx.arg(2, "keepdim", False)))
        dims = [fixed_dim(1) if i == d else x for i, x in enumerate(lay) if i != d or keepdim]
        routed = ctx.pick_by_value(lay[d], 1, f"{op_name(ctx)} {PICKS}")
        value = ctx.value
        if isinstance(value, tuple):  # (values, indices)
            out: Layout = tuple(checked_layout(ctx, dims, v) for v in value)
            if routed:
                ctx.give_positions(lay[d], item=1)
        else:
            out = checked_layout(ctx, dims, value)
            if routed:
                ctx.give_positions(lay[d])
        return out

    return rule


# -- positions used to index -------------------------------------------------------------------
def index_by_positions(original: Rule | None) -> Rule:
    """``x[..., idx, ...]`` with one tensor index holding positions, every other dim whole:
    that dim of ``x`` is the positions' dim; ``idx``'s own dims take its place. Indexing a
    tensor of positions (by anything but positions) passes them on. Everything else follows
    ``original``."""

    def rule(ctx: OpContext) -> Layout:
        container = ctx.arg(0)
        lay = ctx.layout(container)
        raw = ctx.arg(1)
        items = raw if isinstance(raw, tuple) else (raw,)
        if isinstance(lay, TensorLayout):
            held = ctx.positions(container)
            if held is not None and not any(ctx.positions(i) is not None for i in items):
                out = _fallback(ctx, original)  # some of the positions, moved
                ctx.take_positions(container)
                ctx.give_positions(held)
                return out
            found = [(k, i) for k, i in enumerate(items) if ctx.positions(i) is not None]
            if len(found) == 1:
                return _take(ctx, lay, items, *found[0])
        return _fallback(ctx, original)

    return rule


def _take(ctx: OpContext, lay: TensorLayout, items: tuple[Any, ...], k: int,
          index: torch.fx.Node) -> Layout:
    if sum(i is Ellipsis for i in items) > 1 or not all(
            i is Ellipsis or i == slice(None) for j, i in enumerate(items) if j != k):
        ctx.unsupported("advanced indexing by positions mixed with other indices")
    d = len(lay) - (len(items) - k) if Ellipsis in items[:k] else k
    positions = ctx.take_positions(index)
    assert positions is not None
    _point_at(ctx, lay[d], positions)
    lay = ctx.table.resolve_layout(lay)
    index_lay = ctx.tensor_layout(index)
    return checked_layout(ctx, [*lay[:d], *index_lay, *lay[d + 1:]], ctx.value)


def select_by_positions(original: Rule | None) -> Rule:
    """``index_select(x, d, idx)`` with ``idx`` positions along ``x``'s dim ``d``."""

    def rule(ctx: OpContext) -> Layout:
        x, index = ctx.arg(0, "input"), ctx.arg(2, "index")
        positions = ctx.take_positions(index)
        if positions is None:
            return _fallback(ctx, original)
        lay = ctx.tensor_layout(x)
        d = norm_dim(int(ctx.val(ctx.arg(1, "dim"))), len(lay))
        _point_at(ctx, lay[d], positions)
        dims = list(ctx.table.resolve_layout(lay))
        dims[d] = ctx.tensor_layout(index)[0]
        return checked_layout(ctx, dims, ctx.value)

    return rule


def gather_by_positions(original: Rule | None, *, index_at: int, dim_at: int) -> Rule:
    """``gather(x, d, idx)`` and ``take_along_dim(x, idx, d)`` with ``idx`` positions along
    ``x``'s dim ``d``: the result has ``idx``'s shape; its dim ``d`` is ``idx``'s, its other
    dims tie with both operands' (equal sizes; a part of a dim is pinned)."""

    def rule(ctx: OpContext) -> Layout:
        x, index = ctx.arg(0, "input"), ctx.arg(index_at, "index")
        raw = ctx.val(ctx.arg(dim_at, "dim", None))
        positions = ctx.positions(index)
        if positions is None or not isinstance(raw, int):
            return _fallback(ctx, original)
        ctx.take_positions(index)
        lx, li = ctx.tensor_layout(x), ctx.tensor_layout(index)
        sx, si = ctx.shape(x), ctx.shape(index)
        if len(lx) != len(li):
            ctx.unsupported("gather by positions of another rank")
        d = norm_dim(raw, len(lx))
        _point_at(ctx, lx[d], positions)
        lx, li = ctx.table.resolve_layout(lx), ctx.table.resolve_layout(li)
        return checked_layout(ctx, gathered_dims(ctx, lx, li, sx, si, d), ctx.value)

    return rule


def scatter_by_positions(original: Rule | None) -> Rule:
    """``scatter(x, d, idx, src | value)`` (and ``scatter_add``/``scatter_reduce``, in place
    or not) with ``idx`` positions along ``x``'s dim ``d``: the result is ``x``'s layout;
    ``idx``'s and a ``src``'s other dims tie with ``x``'s (equal sizes), their dim ``d`` is
    the picks."""

    def rule(ctx: OpContext) -> Layout:
        x, index = ctx.arg(0, "input"), ctx.arg(2, "index")
        positions = ctx.positions(index)
        if positions is None:
            return _fallback(ctx, original)
        ctx.take_positions(index)
        lx = ctx.tensor_layout(x)
        sx = ctx.shape(x)
        d = norm_dim(int(ctx.val(ctx.arg(1, "dim"))), len(lx))
        operands = [index]
        src = ctx.arg(3, "src", None)
        if isinstance(src, torch.fx.Node) and isinstance(ctx.layout(src), TensorLayout):
            if ctx.positions(src) is not None:
                ctx.unsupported("scatters positions as values")
            operands.append(src)
        _point_at(ctx, lx[d], positions)
        for a in operands:
            la, sa = ctx.tensor_layout(a), ctx.shape(a)
            if len(la) != len(lx):
                ctx.unsupported("scatter of another rank")
            for k in range(len(lx)):
                if k == d:
                    continue
                if sa[k] != sx[k]:
                    ctx.fix(la[k], "writes a part of an elastic dim")
                    ctx.fix(lx[k], "writes a part of an elastic dim")
                else:
                    ctx.unify(ctx.table.resolve(lx[k]), ctx.table.resolve(la[k]))
        return checked_layout(ctx, list(ctx.table.resolve_layout(lx)), ctx.value)

    return rule


def one_hot(original: Rule | None) -> Rule:
    """``one_hot(idx, n)``: a new last dim of ``n`` classes laid along the positions' dim;
    ``n`` must follow it (a module attribute, tied; a size read from that dim)."""

    def rule(ctx: OpContext) -> Layout:
        index = ctx.arg(0, "input")
        positions = ctx.take_positions(index)
        if positions is None:
            return _fallback(ctx, original)
        lay = ctx.tensor_layout(index)
        n_arg = ctx.arg(1, "num_classes", -1)
        n = ctx.layout(n_arg)
        if dim_size(positions) != ctx.out_shape()[-1]:
            ctx.fix(positions, "one_hot over more classes than the dim its positions index")
        elif isinstance(n, AttributeSize):
            if not tie_size(ctx, n, positions):
                ctx.fix(positions, "one_hot's num_classes cannot follow the dim")
        elif isinstance(n, SizeLayout) and not n.derived and len(n) == 1 and (
                ctx.table.resolve(n[0]) == ctx.table.resolve(positions)):
            size_checked(ctx, n)
        else:
            ctx.fix(positions, "one_hot's num_classes is a number: it cannot follow the dim "
                               "its positions index")
        return checked_layout(ctx, [*lay, ctx.table.resolve(positions)], ctx.value)

    return rule


# -- positions passed on -------------------------------------------------------------------------
def passes_on(original: Rule) -> Rule:
    """``original``'s layout; the positions of the first operand, if any, pass on."""

    def rule(ctx: OpContext) -> Layout:
        out = original(ctx)
        held = ctx.take_positions(ctx.arg(0, "input"))
        if held is not None:
            ctx.give_positions(held)
        return out

    return rule


def joins(original: Rule) -> Rule:
    """``cat``/``stack`` of tensors of positions along one dim: they index the same dim (their
    dims tied), and so does the result. A mix with other values is not mapped."""

    def rule(ctx: OpContext) -> Layout:
        out = original(ctx)
        parts = ctx.arg(0, "tensors")
        if not isinstance(parts, (tuple, list)):
            return out
        held = [ctx.positions(p) for p in parts]
        if any(h is not None for h in held):
            if any(h is None for h in held):
                return out  # the analyzer pins the dims they index
            for p in parts:
                ctx.take_positions(p)
            first = held[0]
            assert first is not None
            for other in held[1:]:
                assert other is not None
                _point_at(ctx, ctx.table.resolve(first), other)
            ctx.give_positions(ctx.table.resolve(first))
        return out

    return rule


def reads_shape(original: Rule) -> Rule:
    """``idx.size()``, ``idx.dim()``, ``idx.numel()``: the shape, not the positions."""

    def rule(ctx: OpContext) -> Layout:
        ctx.take_positions(ctx.arg(0))
        return original(ctx)

    return rule


def attribute(original: Rule) -> Rule:
    """``getattr(idx, "shape")`` (and dtype, device...) reads no values; other attributes
    (``.T``, ``.indices`` of a pair) follow ``original`` and the analyzer."""

    def rule(ctx: OpContext) -> Layout:
        if ctx.arg(1) in _SHAPE_ATTRIBUTES:
            ctx.take_positions(ctx.arg(0))
        return original(ctx)

    return rule


def _fallback(ctx: OpContext, original: Rule | None) -> Layout:
    if original is None:
        ctx.unsupported(f"no rule for {op_name(ctx)}")
    return original(ctx)


def register_position_rules(register: Callable[[Any, Rule], None],
                            rules: Mapping[Any, Rule]) -> None:
    """Register the rules of this module over ``rules``, the plugin's rules by target (each
    falls back to, or wraps, the rule registered before for its target)."""
    def over(targets: tuple[Any, ...], make: Callable[[Rule | None], Rule]) -> None:
        for t in targets:
            register(t, make(rules.get(t)))

    def wrap(targets: tuple[Any, ...], make: Callable[[Rule], Rule]) -> None:
        for t in targets:
            if t in rules:
                register(t, make(rules[t]))

    over((torch.topk, "topk"), lambda _: topk)
    over((torch.max, "max", torch.min, "min", torch.argmax, "argmax", torch.argmin, "argmin"),
         pick_along)
    over((operator.getitem,), index_by_positions)
    over((torch.index_select, "index_select"), select_by_positions)
    over((torch.gather, "gather"),
         lambda r: gather_by_positions(r, index_at=2, dim_at=1))
    over((torch.take_along_dim, "take_along_dim"),
         lambda r: gather_by_positions(r, index_at=1, dim_at=2))
    over((torch.scatter, torch.scatter_add, torch.scatter_reduce, "scatter", "scatter_",
          "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_"),
         scatter_by_positions)
    over((F.one_hot,), one_hot)
    wrap(PASS_ON, passes_on)
    wrap((torch.cat, torch.concat, torch.concatenate, torch.stack), joins)
    wrap(SHAPE_READS, reads_shape)
    wrap((getattr,), attribute)


__all__ = ["register_position_rules"]
