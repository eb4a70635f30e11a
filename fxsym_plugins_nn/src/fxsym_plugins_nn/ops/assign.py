"""Item assignment: ``x[index] = v`` (an ``operator.setitem`` node, which the tracer records
for a write into a traced tensor).

The written part of ``x`` is a view of it: a dim taken whole (``:``) is ``x``'s dim, a dim
indexed by a number or cut by a slice is read by position (pinned where it is elastic, as a
read by position is). ``v`` is broadcast into that view as an operand of an elementwise op is
(:func:`.elementwise.broadcast_layouts`): its dims of the view's sizes join the view's groups,
a size-1 elastic dim broadcast against a larger one is pinned. So ``out[:, :, i] =
attn[:, :, i] @ v`` over a chunk dim ties the heads and features of what is written to those
of ``out``, which every later read of ``out`` sees. Indexing by tensors, ``None`` or a slice
bound computed from a size is not mapped (a boundary: what it touches is pinned).
"""

from __future__ import annotations

import torch

from fxsym.analysis import Dim, Layout, OpContext, TensorLayout, fixed_dim, is_fixed

from .common import pin_dims
from .elementwise import broadcast_layouts


def setitem(ctx: OpContext) -> Layout:
    """``operator.setitem(x, index, v)``; its value is ``None``."""
    x, raw, v = ctx.arg(0), ctx.arg(1), ctx.arg(2)
    lay = ctx.tensor_layout(x)
    shape = ctx.shape(x)
    index = ctx.val(raw)
    items = index if isinstance(index, tuple) else (index,)
    raws = raw if isinstance(raw, tuple) else (raw,)
    if any(i is None or isinstance(i, (torch.Tensor, list)) for i in items) or sum(
            i is Ellipsis for i in items) > 1 or len(raws) != len(items):
        ctx.unsupported("item assignment by tensors, lists or None")
    consumed = sum(i is not Ellipsis for i in items)
    view: list[Dim] = []
    sizes: list[int] = []
    d = 0
    for item, r in zip(items, raws):
        if item is Ellipsis:
            take = len(lay) - consumed
            view.extend(lay[d:d + take])
            sizes.extend(shape[d:d + take])
            d += take
            continue
        if d >= len(lay):
            ctx.unsupported("too many indices")
        if isinstance(item, slice) and isinstance(r, slice) and all(
                type(b) is int or b is None for b in (r.start, r.stop, r.step)):
            start, stop, step = item.indices(shape[d])
            n = len(range(start, stop, step))
            if n == shape[d] and step == 1:
                view.append(lay[d])
            else:
                if not is_fixed(lay[d]):
                    pin_dims(ctx, lay[d], "writes a part of an elastic dim by position")
                view.append(fixed_dim(n))
            sizes.append(n)
        elif type(item) is int:
            if not is_fixed(lay[d]):
                pin_dims(ctx, lay[d], "writes one entry of an elastic dim by position")
        else:
            ctx.unsupported(f"item assignment index {item!r}")
        d += 1
    view.extend(lay[d:])
    sizes.extend(shape[d:])
    if isinstance(ctx.val(v), torch.Tensor):
        broadcast_layouts(ctx, [TensorLayout(view), ctx.tensor_layout(v)],
                          [tuple(sizes), ctx.shape(v)], tuple(sizes))
    return ctx.fixed()
