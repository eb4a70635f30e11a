"""Contractions and attention: ``matmul``, ``addmm``, ``einsum``, scaled dot-product attention.

The contracted dims of both operands are one dim (a permutation of one must permute the
other alike); batch dims broadcast; the free dims pass through. Where an operand is computed
from the model's own tensors alone (``x @ self.weight.T``), its free matrix dim is declared a
producer, as a Linear's rows are. Attention ties heads and batch across query, key, value and
mask, and the query's and key's feature dims.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from fxsym.analysis import (
    Dim,
    Layout,
    OpContext,
    TensorLayout,
    fixed_dim,
)

from .elementwise import broadcast_layouts


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
    batch = broadcast_layouts(ctx, [TensorLayout(la[:-2]), TensorLayout(lb[:-2])],
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
    return broadcast_layouts(ctx, [prod, ctx.tensor_layout(c)], [out_shape, ctx.shape(c)],
                             out_shape)


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
    batch = broadcast_layouts(ctx, layouts, shapes, tuple(out_shape[:-2]))
    return TensorLayout([*batch, lq[-2], lv[-1]])



def solve_triangular(ctx: OpContext) -> Layout:
    """``torch.linalg.solve_triangular(A, B, upper=..., left=True)``: ``X = A⁻¹ B`` (``left=
    False``: ``X = B A⁻¹``). Each column of ``B`` (each row, ``left=False``) is solved on its
    own, so that dim passes through with its groups; the system's dims (both of ``A``'s and
    the one of ``B`` they meet) mix every entry with every other: pinned. Batch dims
    broadcast, as in :func:`_matmul_layout`."""
    a, b = ctx.arg(0, "A"), ctx.arg(1, "B")
    la, lb = ctx.tensor_layout(a), ctx.tensor_layout(b)
    sa, sb = ctx.shape(a), ctx.shape(b)
    left = bool(ctx.val(ctx.node.kwargs.get("left", True)))
    for dim in (la[-2], la[-1], lb[-2 if left else -1]):
        ctx.fix(dim, "a triangular solve mixes the entries of its system's dims")
    out_shape = ctx.out_shape()
    batch = broadcast_layouts(ctx, [TensorLayout(la[:-2]), TensorLayout(lb[:-2])],
                              [tuple(sa[:-2]), tuple(sb[:-2])], tuple(out_shape[:-2]))
    matrix = [fixed_dim(out_shape[-2]), lb[-1]] if left else [lb[-2], fixed_dim(out_shape[-1])]
    return TensorLayout([*batch, *matrix])
