"""Which derived state a resize cannot make stale.

The trace finds the attributes a forward sets to traced values
(:meth:`~fxsym.tracer.shadow.ShadowTree.written`): state the model derives, such as
ultralytics' ``Detect.anchors``, filled by the forward and reused while the input size stays.
A resize must not leave such state computed from the model as it was. But a value computed
from nothing a resize changes is the same before and after it, whatever the resize keeps:
that state is :data:`~fxsym.modstate.INVARIANT`, and a resize leaves it alone.

A written value *depends on a resize* when its backward slice in the graph, followed along
the edges that carry values, reaches

* a node whose layout holds a group a resize may still change (not pinned): a tensor with a
  resizable dim, a size read from one, an int attribute that is a member of a group;
* a parameter or buffer of the model (``get_attr``; its entries are what a resize keeps or
  reorders), or any ``call_module`` (a module computes from its weights);
* a node the analysis has no layout for (it was erased or never analyzed).

The slice stops at what cannot change: a placeholder (the inputs), a constant tensor that is
no parameter or buffer (fx's ``_tensor_constant``), and a size whose layout holds no
resizable group (``x.shape[2]`` of a fixed spatial dim: its value follows that dim only).
Edges that carry only a tensor's dtype, device or shape are not followed — ``y.type_as(x)``,
``x.new_full(size, v)``, ``torch.zeros_like(x)``, ``x.shape`` — since a resize changes none
of them except the shape, which the reading node's own layout holds.

Imports from fxsym: modstate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch.fx
from torch import nn

from ..modstate import DERIVED, INVARIANT
from .groups import GroupTable
from .layout import Layout, SizeLayout, TensorLayout, iter_dims
from .shared import own_tensor

#: tensor attributes that carry no entry of the tensor (``x.shape`` is a size layout)
_METADATA = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "layout",
                       "requires_grad", "is_sparse", "is_quantized"})
#: methods reading only their tensor's metadata
_METADATA_METHODS = frozenset({"size", "dim", "numel", "nelement", "element_size",
                               "is_floating_point", "is_contiguous", "get_device"})
#: methods whose tensor arguments after ``self`` give only a dtype and device
_LIKE_OTHER = frozenset({"type_as", "to"})
#: methods whose ``self`` gives only a dtype and device
_NEW = frozenset({"new_full", "new_zeros", "new_ones", "new_empty", "new_tensor"})
#: functions whose first argument gives only a shape, dtype and device
_LIKE = frozenset({torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like,
                   torch.rand_like, torch.randn_like, torch.randint_like})


@dataclass(frozen=True)
class _Analysis:
    """What the slice reads of the analysis: each node's layout, the groups, and the model's
    submodule at a path (``AttributeError`` where there is none)."""

    env: Mapping[torch.fx.Node, Layout]
    table: GroupTable
    model_modules: Callable[[str], nn.Module]


def settle_derived(derived: Mapping[str, Mapping[str, str]],
                   written: Mapping[str, Mapping[str, Sequence[str]]],
                   env: Mapping[torch.fx.Node, Layout], table: GroupTable,
                   model_modules: Callable[[str], nn.Module]) -> dict[str, dict[str, str]]:
    """``derived`` (the trace's :attr:`SymMap.derived_state`) with each attribute the
    forward set to values (``written``: the names of their nodes) that depend on no resize
    (see the module docstring) marked :data:`INVARIANT`; read from the finished analysis
    (``env``: each node's layout, ``table``: its groups, ``model_modules``: the model's
    submodule at a path), which nothing here changes."""
    settled = {name: dict(attrs) for name, attrs in derived.items()}
    if not written:
        return settled
    an = _Analysis(env, table, model_modules)
    nodes = {n.name: n for n in an.env}
    for name, attrs in written.items():
        for attr, names in attrs.items():
            if settled.get(name, {}).get(attr) == DERIVED and not any(
                    n not in nodes or _depends(an, nodes[n]) for n in names):
                settled[name][attr] = INVARIANT
    return settled


def _depends(an: _Analysis, start: torch.fx.Node) -> bool:
    """Whether the value of ``start`` may differ after some resize of the analyzed groups."""
    seen: set[torch.fx.Node] = set()
    todo = [start]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if node not in an.env:  # erased, or never analyzed
            return True
        layout = an.env[node]
        if any(seg.group is not None and not an.table.is_constant(seg.group)
               for dim in iter_dims(layout) for seg in dim):
            return True
        if _is_size(layout) or node.op == "placeholder":
            continue
        if node.op == "call_module":
            return True
        if node.op == "get_attr":
            if _registered(an, str(node.target)):
                return True
            continue
        todo.extend(_value_inputs(node))
    return False


def _is_size(layout: Any) -> bool:
    """A size read from a shape or an attribute, or a tuple of such sizes."""
    if isinstance(layout, SizeLayout):
        return True
    return (isinstance(layout, tuple) and not isinstance(layout, TensorLayout)
            and bool(layout) and all(map(_is_size, layout)))


def _registered(an: _Analysis, target: str) -> bool:
    """Whether ``target`` names a parameter or buffer of the model (a tensor the GraphModule
    holds for a constant, ``_tensor_constant0``, or a plain tensor attribute is not)."""
    owner, _, name = target.rpartition(".")
    try:
        mod = an.model_modules(owner)
    except AttributeError:
        return False
    return own_tensor(mod, name) is not None


def _value_inputs(node: torch.fx.Node) -> Iterator[torch.fx.Node]:
    """The inputs of ``node`` whose entries its value is computed from."""
    target, args = node.target, node.args
    skip: set[torch.fx.Node] = set()
    if node.op == "call_function" and target is getattr:
        if len(args) > 1 and args[1] in _METADATA:
            return
    elif node.op == "call_method":
        if target in _METADATA_METHODS:
            return
        if target in _NEW and args:
            skip.add(args[0])  # type: ignore[arg-type]
        elif target in _LIKE_OTHER:
            skip.update(a for a in args[1:] if isinstance(a, torch.fx.Node))
    elif node.op == "call_function" and target in _LIKE and args:
        skip.add(args[0])  # type: ignore[arg-type]
    for inp in node.all_input_nodes:
        if inp not in skip:
            yield inp


__all__ = ["settle_derived"]
