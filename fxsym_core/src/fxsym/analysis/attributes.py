"""Sizes read from module attributes: ``self.hidden_dim`` in ``x.reshape(n, self.hidden_dim, -1)``.

During tracing, an int attribute of a module the tracer traces into is read as a ``get_attr``
node whose value is the int (:mod:`fxsym.tracer.tracer`, ``ATTRIBUTE_META``). The analyzer
gives it an :class:`~fxsym.analysis.layout.AttributeSize`: a group of its own, with the
attribute as its one member ``(owner, "attr:name")``; a tuple of ints
(``self.normalized_shape = (hidden,)``) is read element by element, ``(owner, "attr:name[i]")``.
Three things can happen to it:

* an op rule proves which tensor dim the int sizes and calls :func:`tie_size`: the attribute's
  group is unified with that dim's (a member of G; ``fxsym.resize`` sets the attribute to the
  number of entries kept);
* it feeds size arithmetic (``self.heads * self.head_dim``): the result is a derived size,
  checked where it is used (a reshape pins what a derived size meets);
* anything else — a factory size, an argument of a leaf module, a value asked for at trace
  time (``if self.hidden > 4:``, ``range(self.heads)``) — pins its group
  (:func:`check_uses`): the graph, or the Python code around it, would not follow a resize.
  A number passed to a function that returns no tensor dim of its length (a max pool's
  ``kernel_size``) was never a tensor size: if nothing else joins its group, its report line
  is a detail (:class:`~fxsym.tracer.report.TraceReport`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from ..symbols import ATTRIBUTE_PREFIX
from ..tracer.questions import ATTRIBUTE_META, CONCRETE_META
from .context import OpContext, Unsupported
from .layout import AttributeSize, Dim, SizeLayout, TensorLayout, dim_size


def tie_size(ctx: OpContext, size: Any, dim: Dim) -> bool:
    """Tie ``size``, an int read from a module attribute, to ``dim``, the tensor dim it sizes
    at ``ctx``'s node; returns whether it was tied (``False``: not an attribute read, or of
    another length — the caller pins what it cannot map).

    The dims are unified entry by entry (:meth:`OpContext.unify`): a dim of fixed size pins the
    attribute (``head_dim`` in a split into ``(heads, head_dim)``), a group makes the attribute
    its member.
    """
    if not isinstance(size, AttributeSize) or len(size) != 1:
        return False
    if dim_size(size[0]) != dim_size(dim):
        return False
    try:
        ctx.unify(size[0], dim)
    except Unsupported:
        return False
    size.uses.add(ctx.node)
    return True


def size_checked(ctx: OpContext, size: SizeLayout) -> None:
    """Record that ``ctx``'s rule proved the dim ``size`` (arithmetic on sizes, such as
    ``self.num_heads * self.head_dim``) sizes there follows every resize."""
    size.uses.add(ctx.node)


def check_uses(ctx: OpContext, result: Any) -> None:
    """After a node's rule ran: pin the sizes among its inputs that the rule did not map.

    A rule maps one by tying it (:func:`tie_size`), by recording that it proved the dim it
    sizes (:func:`size_checked`), or by computing a size or a shape tuple from it (its result
    is a :class:`SizeLayout`, or a tuple of them and ints, checked where it is used). An
    attribute read used any other way is pinned; so is a size read from an elastic dim that
    flows into a tensor op as a number (``y + x.shape[1]``, ``torch.tensor(C)``): a guard
    whose value the graph would keep after a resize, reported as such."""
    node = ctx.node
    if not isinstance(ctx.value, torch.Tensor) and (
            isinstance(result, SizeLayout) or _is_shape(result)):
        return
    tensor = isinstance(ctx.value, torch.Tensor)
    for arg in node.all_input_nodes:
        for lay in _sizes(ctx.analyzer.env.get(arg)):
            if node in lay.uses:
                continue
            if _has_attribute(ctx, lay):
                ctx.analyzer.fix(lay, f"a size read from a module attribute is used by "
                                 f"{_op(node)}, which does not say which dim it sizes", node,
                                 sizes_no_tensor=_sizes_no_tensor(ctx, lay))
            elif tensor and _elastic(ctx, lay):
                ctx.analyzer.fix(lay, f"{arg.name}, a size read from an elastic dim, is used "
                                 f"as a number by {_op(node)}, which would keep its value "
                                 "after a resize", node, kind="guard")


def _sizes_no_tensor(ctx: OpContext, lay: SizeLayout) -> bool:
    """Whether the number ``lay`` sizes no dim of the tensors a function or method returns
    (a max pool's ``kernel_size``): no dim of its output is that long. A leaf module's
    argument may size something inside it: never."""
    if ctx.node.op == "call_module":
        return False
    lengths: set[int] = set()

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            lengths.update(int(n) for n in value.shape)
        elif isinstance(value, (tuple, list)):
            for v in value:
                walk(v)

    walk(ctx.value)
    return bool(lengths) and not any(dim_size(d) in lengths for d in lay)


def _is_shape(lay: Any) -> bool:
    """Whether ``lay`` is a shape tuple whose sizes are checked where it is used."""
    return isinstance(lay, tuple) and not isinstance(lay, TensorLayout) and any(
        isinstance(x, SizeLayout) for x in lay) and all(
        isinstance(x, (SizeLayout, int)) for x in lay)


def _sizes(lay: Any) -> list[SizeLayout]:
    """The sizes a value's layout holds: itself, or each entry of a shape tuple."""
    if isinstance(lay, SizeLayout):
        return [lay]
    if isinstance(lay, tuple) and not isinstance(lay, TensorLayout):
        return [x for x in lay if isinstance(x, SizeLayout)]
    return []


def _elastic(ctx: OpContext, lay: SizeLayout) -> bool:
    table = ctx.table
    return any(seg.group is not None and not table.is_constant(seg.group)
               for d in table.resolve_layout(lay) for seg in d)


def _has_attribute(ctx: OpContext, lay: SizeLayout) -> bool:
    groups: set[int] = getattr(ctx.analyzer, "attribute_groups", set())
    return any(seg.group in groups for d in lay for seg in d)


def _op(node: torch.fx.Node) -> str:
    if node.op == "call_module":
        return f"module {node.target}"
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


__all__ = ["ATTRIBUTE_META", "ATTRIBUTE_PREFIX", "CONCRETE_META", "check_uses", "size_checked",
           "tie_size"]
