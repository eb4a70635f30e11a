"""The value oracle's plan: a walk of the traced graph that finds, for every searchable group,
where its entries are read and where an op mixes them.

A read is an input of a module call that carries the group (a conv's or linear's input:
zeroing a unit there is zeroing its columns) or a parameter operand of a functional linear op
where the group's dim is contracted (``_LINEAR_READS``). An op that mixes the group's entries
(a normalisation over its dim, a softmax along it) or reads them any other way leaves the
group not checked by value, with the reason. Ops that only pass some entries on
(``_DISCARDING``) neither read nor mix. The layouts are the analysis' own
(``GroupAnalysis.node_layouts``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import fx

from ..analysis import TensorLayout
from ..symbols import SymMap

#: ops that only pass some entries of their input on: a group's entries they leave out are
#: discarded, not read (which the comparison checks: a wrong layout moves what they keep)
_DISCARDING = frozenset({"getitem", "narrow", "split", "chunk", "tensor_split", "unbind",
                         "split_with_sizes", "select", "index_select", "hsplit", "vsplit"})
#: ops whose every output entry is a sum of products with the entries of the dims they
#: contract: dropping an entry equals zeroing it in a parameter operand
_LINEAR_READS = frozenset({"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addmv", "mv",
                           "einsum", "tensordot", "conv1d", "conv2d", "conv3d",
                           "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"})


@dataclass
class _Read:
    """Where the value oracle zeroes a group's dropped entries in the reference: the
    ``arg``-th input (a position or a keyword) of the ``call``-th call of module ``target``,
    or (``arg is None``) the parameter or buffer ``target`` itself; ``dims`` are the tensor
    dims carrying the group, with their layouts."""

    target: str
    arg: int | str | None
    dims: tuple[tuple[int, Sequence[Any]], ...]
    call: int = 0


@dataclass
class _Call:
    """The ``call``-th call of module ``target`` in the graph: the layouts of its tensor
    arguments (by position or keyword) and of its output, and the groups it meets."""

    target: str
    call: int
    args: dict[int | str, Any]
    output: Any
    roots: set[int]


@dataclass
class _ValuePlan:
    """Per group root: the reads to zero, or the reason it is not checked by value; and the
    module calls, which :func:`_mixing_modules` probes."""

    reads: dict[int, list[_Read]] = field(default_factory=dict)
    unchecked: dict[int, str] = field(default_factory=dict)
    calls: list[_Call] = field(default_factory=list)


def _value_plan(symmap: SymMap, graph: Any) -> _ValuePlan:
    """Walk the traced graph: for every searchable group, the reads to zero and the ops that
    mix its entries (see :func:`check_values`)."""
    analysis = symmap.analysis
    assert analysis is not None
    table = analysis.table
    layouts = analysis.node_layouts
    roots = {g.id for g in symmap.groups()}
    plan = _ValuePlan()
    calls: dict[str, int] = {}

    def carried(layout: Any) -> dict[int, list[tuple[int, Sequence[Any]]]]:
        out: dict[int, list[tuple[int, Sequence[Any]]]] = {}
        if not isinstance(layout, TensorLayout):
            return out
        for d, dim in enumerate(layout):
            for seg in dim:
                root = table.find(seg.group) if seg.group is not None else None
                if root in roots and (d, dim) not in out.get(root, []):
                    out.setdefault(root, []).append((d, dim))
        return out

    def unchecked(root: int, why: str) -> None:
        plan.unchecked.setdefault(root, why)

    for node in graph.nodes:
        if node.op not in ("call_module", "call_function", "call_method"):
            continue
        outputs = _tensor_layouts(layouts.get(node.name))
        out_roots = {r for lay in outputs for r in carried(lay)}
        name = _node_op(node)
        if node.op == "call_module":
            call = calls.get(node.target, 0)
            calls[node.target] = call + 1
            args = [*enumerate(node.args), *node.kwargs.items()]
            inputs = {key: carried(layouts.get(a.name)) for key, a in args
                      if isinstance(a, fx.Node)}
            for key, found in inputs.items():
                for root, dims in found.items():
                    plan.reads.setdefault(root, []).append(
                        _Read(node.target, key, tuple(dims), call))
            met = {r for found in inputs.values() for r in found} | out_roots
            if met:  # a producer too: a recurrent one reads its own units
                plan.calls.append(_Call(
                    node.target, call,
                    {key: layouts.get(a.name) for key, a in args if isinstance(a, fx.Node)},
                    layouts.get(node.name), met))
            continue
        if not outputs or not any(carried(layouts.get(a.name)) for a in node.all_input_nodes):
            continue  # no group read; or a size, a dtype: a guard, which the comparison sees
        first = node.args[0] if node.args else None
        mixed = _function_mixes(node, name, _ndim(layouts, node))
        exits: set[int] = set()
        for source in node.all_input_nodes:
            for root, dims in carried(layouts.get(source.name)).items():
                if source is first and any(d in mixed for d, _ in dims):
                    unchecked(root, f"{name} at {node.name} mixes its entries")
                elif root not in out_roots and name not in _DISCARDING:
                    exits.add(root)
        for root in exits:
            params = [a for a in node.all_input_nodes if a.op == "get_attr"
                      and root in carried(layouts.get(a.name))]
            if name not in _LINEAR_READS or not params:
                unchecked(root, f"{name} at {node.name} reads it")
                continue
            for p in params:
                plan.reads.setdefault(root, []).append(
                    _Read(p.target, None, tuple(carried(layouts.get(p.name))[root])))
    return plan


def _ndim(layouts: Any, node: Any) -> int:
    """The number of dims of the node's first input (0 if it is not a traced tensor)."""
    first = node.args[0] if node.args else None
    layout = layouts.get(first.name) if isinstance(first, fx.Node) else None
    return len(layout) if isinstance(layout, TensorLayout) else 0


def _tensor_layouts(layout: Any) -> list[Any]:
    if isinstance(layout, TensorLayout):
        return [layout]
    if isinstance(layout, (tuple, list)):
        return [t for item in layout for t in _tensor_layouts(item)]
    if isinstance(layout, dict):
        return [t for item in layout.values() for t in _tensor_layouts(item)]
    return []


def _node_op(node: Any) -> str:
    if node.op == "call_method":
        return str(node.target)
    return str(getattr(node.target, "__name__", node.target)).lstrip("_")


def _arg(node: Any, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _function_mixes(node: Any, name: str, ndim: int) -> set[int]:
    """The dims of its first input whose entries a normalising op mixes (``softmax`` along
    a dim, ``layer_norm`` over its last dims, ``normalize``, ``group_norm`` over channels,
    attention over the features of its heads)."""
    every = set(range(ndim))

    def dims(value: Any) -> set[int]:
        if isinstance(value, int) and ndim:
            return {value % ndim}
        return every

    if name in ("softmax", "log_softmax", "softmin", "normalize"):
        default = 1 if name == "normalize" else None
        at = 2 if name == "normalize" else 1
        return dims(_arg(node, at, "dim", default))
    if name in ("layer_norm", "rms_norm"):
        shape = _arg(node, 1, "normalized_shape")
        k = len(shape) if isinstance(shape, (tuple, list)) else 1
        return set(range(ndim - k, ndim))
    if name in ("group_norm", "local_response_norm"):
        return {1} if ndim > 1 else every
    if name == "instance_norm":
        return set(range(2, ndim))
    if name == "scaled_dot_product_attention":
        return {ndim - 1} if ndim else every
    return set()
