"""Which parameters are embedding tables, as the trace shows them.

An embedding table is a parameter the traced program reads with integer input (token ids,
positions): a call to a module holding it fed integer input (``nn.Embedding``), or a call
taking the parameter (or a view of it: ``t()``, ``to()``) beside an integer tensor and no
floating one (``table[ids]``, ``F.embedding(ids, table)``, ``index_select``), the integers
not computed from floating values (token ids and positions are not; a router's picks of
experts are, and an expert's weights indexed by them are not a table). It is found by what
the program does, never by a module class or a name. A parameter a call takes beside a
floating tensor is *computed with* (``F.linear(h, table)``, a tied head): with
``only_looked_up``, tables also computed with are left out (what a token spends no compute on:
:func:`fxsym.search.active_params`).

"Non-embedding parameters", the count papers and model cards quote, are every parameter but
the tables (:func:`fxsym.plan` records them before and after).

Imports from fxsym: symbols (types only).
"""

from __future__ import annotations

import torch
from torch import fx, nn

from ..symbols import SymMap


def embedding_tables(model: nn.Module, symmap: SymMap, *, only_looked_up: bool = False
                     ) -> frozenset[str]:
    """The names of ``model``'s parameters read by integer inputs in ``symmap``'s trace;
    with ``only_looked_up``, those never computed with (a tied head's table left out)."""
    graph = symmap.graph
    modules = dict(model.named_modules())
    params = {n: p for n, p in model.named_parameters(remove_duplicate=False)}
    derived: dict[fx.Node, set[int]] = {}  # a node -> the parameters it is a view of
    lookup: set[int] = set()
    computing: set[int] = set()
    from_floats: dict[fx.Node, bool] = {}  # the nodes computed from a floating tensor
    for node in [] if graph is None else graph.nodes:  # in the order they run
        value = _value(node)
        from_floats[node] = (isinstance(value, torch.Tensor) and value.is_floating_point()
                             ) or any(from_floats.get(a, False) for a in node.all_input_nodes)
        if node.op == "get_attr" and str(node.target) in params:
            derived[node] = {id(params[str(node.target)])}
            continue
        if node.op == "call_module":
            mod = modules.get(str(node.target))
            held = set() if mod is None else {id(p) for p in mod.parameters()}
        else:
            held = {i for a in node.all_input_nodes for i in derived.get(a, ())}
        if not held:
            continue
        others = [_value(a) for a in node.all_input_nodes if a not in derived]
        tensors = [v for v in others if isinstance(v, torch.Tensor)]
        if not tensors and node.op != "call_module":
            derived[node] = held  # a view or copy of the parameters: follow it
        elif any(t.is_floating_point() or t.is_complex() for t in tensors):
            computing |= held
        elif any(t.dtype != torch.bool for t in tensors) and not any(
                from_floats[a] for a in node.all_input_nodes if a not in derived):
            lookup |= held
    return frozenset(n for n, p in model.named_parameters()
                     if id(p) in lookup and not (only_looked_up and id(p) in computing))


def _value(node: fx.Node) -> object:
    return node.meta.get("val")

