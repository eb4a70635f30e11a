"""Rewrite in-place operations out-of-place when that is provably safe.

``y = x.add_(1)`` becomes ``y = x.add(1)`` and every later use of ``x`` reads ``y``. This is
only equivalent when nothing else can observe the write, so the pass refuses (and says why,
in one :class:`~fxsym.passes.PassWarning` per run) when the written value:

* is a graph input (the caller sees the write) or a module attribute (state);
* comes from an operation not known to return a fresh tensor — a view (``x[0]``,
  ``x.view(...)``), an unknown function or module, anything that may alias another value;
* had a view taken of it, or was passed to an operation that may keep an alias, before the
  write (that alias would see the new data).

Handled forms: in-place methods (``add_`` → ``add``; ``zero_`` → ``zeros_like``;
``fill_`` → ``full_like``), in-place operators (``operator.iadd`` → ``operator.add``),
in-place torch functions (``torch.relu_`` → ``torch.relu``), calls with ``inplace=True``
(→ ``inplace=False``) and modules whose ``inplace`` attribute is true (replaced by a copy
with ``inplace=False``). Random fills (``normal_``...) and ``copy_`` have no out-of-place
twin here and are refused.
"""

from __future__ import annotations

import copy
import inspect
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from ...errors import PassWarning
from ..ops import INPLACE_OPERATORS, Modules, OpTable, is_fresh, mutated_arg
from ..pattern import RewriteContext
from ..table import op_table

_RANDOM_FILLS = frozenset(
    {
        "normal_", "uniform_", "bernoulli_", "random_", "exponential_", "geometric_",
        "cauchy_", "log_normal_",
    }
)
_NO_TWIN = frozenset({"copy_", "set_", "resize_", "resize_as_", "put_", "index_put_"})


def _label(node: fx.Node) -> str:
    if node.op == "call_method":
        return f".{node.target}()"
    if node.op == "call_module":
        return f"module {node.target!r}"
    return getattr(node.target, "__name__", str(node.target))


def _unsafe(
    node: fx.Node, written: Any, position: dict[fx.Node, int], table: OpTable, modules: Modules
) -> str | None:
    if not isinstance(written, fx.Node):
        return None if written is not None else "cannot tell which value it writes"
    if written.op == "placeholder":
        return f"it writes into the graph input {written.target!r}, which the caller sees"
    if written.op == "get_attr":
        return f"it writes into the attribute {written.target!r} (module state)"
    if not is_fresh(written, table, modules):
        return (
            f"its target {written.name!r} comes from {_label(written)}, which may alias "
            "another value"
        )
    here = position[node]
    for user in written.users:
        if user is node or position.get(user, here + 1) > here:
            continue
        if not is_fresh(user, table, modules) and mutated_arg(user, modules, table) is not written:
            return f"{user.name!r} ({_label(user)}) may alias {written.name!r} before the write"
    return None


def _inplace_param_index(fn: Any) -> int | None:
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return params.index("inplace") if "inplace" in params else None


def _out_of_place(node: fx.Node, ctx: RewriteContext) -> fx.Node | str:
    """Build the out-of-place twin of ``node`` before it; or say why there is none."""
    graph = ctx.graph
    args, kwargs = node.args, dict(node.kwargs)
    if node.op == "call_method":
        name = str(node.target)
        if name in _RANDOM_FILLS:
            return f".{name}() is a random fill"
        if name in _NO_TWIN:
            return f".{name}() has no out-of-place form"
        if name == "zero_":
            return graph.call_function(torch.zeros_like, (args[0],))
        if name == "fill_" and len(args) == 2 and not kwargs and isinstance(args[1], (int, float)):
            return graph.call_function(torch.full_like, (args[0], args[1]))
        twin = name[:-1]
        if not hasattr(torch.Tensor, twin):
            return f".{name}() has no out-of-place method .{twin}()"
        return graph.call_method(twin, args, kwargs)
    if node.op == "call_function":
        target = node.target
        if not callable(target):
            return f"{target!r} is not callable"
        if target in INPLACE_OPERATORS:
            return graph.call_function(INPLACE_OPERATORS[target], args, kwargs)
        name = getattr(target, "__name__", "")
        if name.endswith("_"):
            for space in (torch, F, torch.special):
                function = getattr(space, name[:-1], None)
                if callable(function) and getattr(space, name, None) is target:
                    return graph.call_function(function, args, kwargs)
            return f"{name} has no out-of-place twin"
        if "inplace" in kwargs:
            kwargs["inplace"] = False
            return graph.call_function(target, args, kwargs)
        index = _inplace_param_index(target)
        if index is not None and index < len(args):
            params = list(inspect.signature(target).parameters)
            new_args = args[:index]
            for i, value in enumerate(args[index:], start=index):
                kwargs[params[i]] = value
            kwargs["inplace"] = False
            return graph.call_function(target, new_args, kwargs)
        return f"{name} writes in place and has no inplace switch"
    if node.op == "call_module":
        module = ctx.module(node)
        twin_module = copy.copy(module)
        twin_module.inplace = False  # type: ignore[assignment]  # torch: any attribute is allowed
        target = str(node.target)
        if ctx.call_sites(target) == 1:
            ctx.replace_module(target, twin_module)
            new_target = target
        else:
            new_target = ctx.add_module(f"{target}_out_of_place", twin_module)
        return graph.call_module(new_target, args, kwargs)
    return "unknown node kind"


def remove_inplace(gm: fx.GraphModule) -> int:
    """Rewrite in-place ops out-of-place when provably safe; warn about the others."""
    table = op_table()
    ctx = RewriteContext(gm, table)
    graph = gm.graph
    nodes = list(graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    refused: list[str] = []
    changes = 0
    for node in nodes:
        written = mutated_arg(node, ctx.modules, table)  # eval Dropout(inplace=True): None
        if written is None:
            continue
        reason = _unsafe(node, written, position, table, ctx.modules)
        if reason is None:
            with graph.inserting_before(node):
                new = _out_of_place(node, ctx)
            if isinstance(new, str):
                reason = new
        if reason is not None:
            refused.append(f"{node.name} ({_label(node)}): {reason}")
            continue
        assert isinstance(new, fx.Node)
        new.meta.update({k: v for k, v in node.meta.items() if k not in new.meta})
        position[new] = position[node]
        here = position[node]
        for user in list(written.users):
            if user is not new and user is not node and position.get(user, -1) > here:
                user.replace_input_with(written, new)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        changes += 1
    if refused:
        warnings.warn(
            f"remove_inplace kept {len(refused)} in-place operation(s) it cannot prove safe "
            "to rewrite: " + "; ".join(refused),
            PassWarning,
            stacklevel=2,
        )
    return changes
