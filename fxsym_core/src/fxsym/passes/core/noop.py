"""Remove operations that return their input unchanged.

Removed:

* calls of modules a plugin declares identities (:class:`~fxsym.passes.ModuleSemantics`:
  ``nn.Identity``, dropout in eval mode) and ``F.dropout*`` with ``training=False``;
* full slices: ``x[:]``, ``x[:, :]``, ``x[...]``;
* ``x * 1``, ``1 * x``, ``x + 0``, ``0 + x``, ``x - 0``, ``x / 1`` — only when the node's
  metadata shows the same dtype and shape as ``x`` (``bool * 1`` is an integer tensor), so
  these need example inputs;
* chained reshapes: ``x.view(a).reshape(b)`` becomes ``x.reshape(b)`` when the inner value
  has no other use (the outer shape is absolute, so the inner one never matters).

A node is kept when something writes into its value or into its input in place: replacing a
copy by its source would let that write reach the other readers.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from ..ops import Modules, OpTable, get_arg, may_be_mutated, tensor_shape
from ..pattern import RewriteContext
from ..table import op_table

_DROPOUTS = frozenset(
    {
        F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout,
        F.feature_alpha_dropout,
    }
)
_RESHAPES = frozenset(
    {("call_method", "reshape"), ("call_method", "view"), ("call_function", torch.reshape)}
)
_INNER_RESHAPES = _RESHAPES | {("call_method", "flatten"), ("call_function", torch.flatten)}


def _dtype(value: Any) -> Any:
    if not isinstance(value, fx.Node):
        return None
    for key in ("val", "tensor_meta", "example_value"):
        dtype = getattr(value.meta.get(key), "dtype", None)
        if dtype is not None:
            return dtype
    return None


def _same_meta(node: fx.Node, src: Any) -> bool:
    if not isinstance(src, fx.Node):
        return False
    shape_n, shape_s = tensor_shape(node), tensor_shape(src)
    dtype_n, dtype_s = _dtype(node), _dtype(src)
    return (
        shape_n is not None and shape_n == shape_s and dtype_n is not None and dtype_n == dtype_s
    )


def _is_number(value: Any, number: int) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == number


def _full_index(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    if not items:
        return False
    for item in items:
        if item is Ellipsis:
            continue
        if not (
            isinstance(item, slice)
            and item.start in (None, 0)
            and item.stop is None
            and item.step in (None, 1)
        ):
            return False
    return True


def _arith_source(node: fx.Node, key: tuple[str, Any]) -> Any:
    args = node.args
    if len(args) != 2 or node.kwargs:
        return None
    a, b = args
    op = key[1] if key[0] == "call_function" else None
    src = None
    if op is operator.mul:
        src = a if _is_number(b, 1) else b if _is_number(a, 1) else None
    elif op is operator.add:
        src = a if _is_number(b, 0) else b if _is_number(a, 0) else None
    elif op is operator.sub:
        src = a if _is_number(b, 0) else None
    elif op is operator.truediv:
        src = a if _is_number(b, 1) else None
    return src if src is not None and _same_meta(node, src) else None


def _noop_source(node: fx.Node, table: OpTable, modules: Modules) -> Any:
    """The value ``node`` equals, when it is a no-op; else ``None``."""
    if node.op == "call_module":
        if node.args and table.is_identity_module(modules.get(node.target)):
            return node.args[0]
        return None
    if node.op == "call_function" and node.target in _DROPOUTS:
        if get_arg(node, 2, "training", True) is False:
            return get_arg(node, 0, "input")
        return None
    if node.op == "call_function" and node.target is operator.getitem:
        if len(node.args) == 2 and _full_index(node.args[1]):
            src = node.args[0]
            shape = tensor_shape(src)
            index = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
            slices = sum(1 for i in index if i is not Ellipsis)
            if shape is not None and slices > len(shape):
                return None
            return src
        return None
    key = table.canonical((node.op, node.target))
    return _arith_source(node, key)


def _collapse_reshape(node: fx.Node, ctx: RewriteContext) -> fx.Node | None:
    key = (node.op, node.target)
    if key not in _RESHAPES or not node.args:
        return None
    inner = node.args[0]
    if not isinstance(inner, fx.Node) or (inner.op, inner.target) not in _INNER_RESHAPES:
        return None
    if len(inner.users) != 1 or not inner.args or may_be_mutated(inner, ctx.modules, ctx.table):
        return None
    shape = node.args[1:] if node.op == "call_method" else (get_arg(node, 1, "shape"),)
    if not shape or node.kwargs or any(isinstance(s, torch.dtype) for s in shape):
        return None
    if inner.op == "call_method" and inner.target == "view" and any(
        isinstance(s, torch.dtype) for s in inner.args[1:]
    ):
        return None
    with ctx.graph.inserting_before(node):
        new = ctx.graph.call_method("reshape", (inner.args[0], *shape))
    new.meta.update(node.meta)
    return new


def remove_noops(gm: fx.GraphModule) -> int:
    """Remove identity modules, eval dropout, full slices, x*1, x+0 and chained reshapes."""
    table = op_table()
    ctx = RewriteContext(gm, table)
    graph = gm.graph
    changes = 0
    for node in list(graph.nodes):
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        src = _noop_source(node, table, ctx.modules)
        if src is not None:
            if not isinstance(src, fx.Node) or may_be_mutated(node, ctx.modules, table):
                continue
            if may_be_mutated(src, ctx.modules, table):
                continue
            node.replace_all_uses_with(src)
            graph.erase_node(node)
            changes += 1
            continue
        new = _collapse_reshape(node, ctx)
        if new is not None:
            inner = node.args[0]
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            if isinstance(inner, fx.Node) and not inner.users:
                graph.erase_node(inner)
            changes += 1
    return changes
