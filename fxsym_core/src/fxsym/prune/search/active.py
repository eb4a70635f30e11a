"""*Active* parameters (:func:`active_params`): those a token uses.

Every parameter but those only looked up (an embedding table whose rows one token reads one
of; tied to an output head, it counts), and of a MoE layer's expert tensors only the share a
router picks (:func:`picked_shares`). The experts of a MoE layer are a *routed* group
(:attr:`SymGroup.routed`); a token reads the ``k`` experts a ``topk`` over all of them picks
(its ``min_size`` where no such ``topk`` is found; DeepSeek picks ``topk_group`` routing
groups first, then ``top_k`` experts): a parameter sliced by that group counts ``k / E`` of
its entries (``E`` the experts kept), unless it computes the scores the pick reads (the
router's weight, upstream of the integer positions in the trace), which every token uses
whole.

Imports from fxsym: embeddings, paramlayout, plugins, symbols.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx, nn

from ...paramlayout import Slices, layout
from ...plugins.analysis_options import keeps_picked_blocks
from ...symbols import SymMap
from ..embeddings import embedding_tables
from ..roles import reachable


def active_params(model: nn.Module, symmap: SymMap) -> tuple[int, frozenset[str]]:
    """The parameters a token uses (see the module docstring), and the names of those it does
    not use at all (looked up only)."""
    skipped = embedding_tables(model, symmap, only_looked_up=True)
    shares = picked_shares(model, symmap)
    routed = {g.name: g.size for g in symmap.groups() if g.routed}
    total = 0.0
    for name, p in model.named_parameters():
        if name in skipped:
            continue
        k, group = shares.get(name, (1, ""))
        total += p.numel() * k / routed.get(group, 1)
    return round(total), skipped


def picked_shares(model: nn.Module, symmap: SymMap) -> dict[str, tuple[float, str]]:
    """``{parameter name: (k, routed group)}`` for every parameter sliced by a routed group
    that a token reads only at the positions its router picks, ``k`` of the group's units
    (a fraction where a unit holds several entries): the ``k`` of a ``topk`` over every entry
    of the group (DeepSeek's ``top_k`` experts, after it picked ``topk_group`` routing
    groups), else the group's ``min_size``. The group's pick is the first node of the trace,
    downstream of its parameters, that makes integer positions out of floating values
    (``topk``/``argmax`` over scores); a parameter upstream of it (the router's weight and
    bias, computing the scores) is used whole."""
    routed = [g for g in symmap.groups() if g.routed]
    graph = symmap.graph
    if not routed or graph is None:
        return {}
    lay = layout(model, symmap)
    order = {n: i for i, n in enumerate(graph.nodes)}
    picks = {n for n in graph.nodes if _is_pick(n)}
    uses = _param_nodes(model, graph)
    out: dict[str, tuple[float, str]] = {}
    for g in routed:
        params = {sl.param for sl in lay.slices.get(g.name, ())}
        starts = [n for p in params for n in uses.get(p, ())]
        downstream = [n for n in reachable(starts, lambda n: list(n.users)) if n in picks]
        pick = min(downstream, key=order.__getitem__, default=None)
        upstream = set() if pick is None else reachable([pick], lambda n: n.all_input_nodes)
        copies = _copies(lay.slices.get(g.name, ()), symmap)
        entries = next((k for k in (_entries_picked(n, g.size * g.unit * copies) for n in sorted(
            downstream, key=order.__getitem__)) if k is not None), None)
        share = g.min_size if entries is None else entries / (g.unit * copies)
        for p in params:
            if not upstream.intersection(uses.get(p, ())):
                out[p] = (share, g.name)
    return out


def _copies(slices: Sequence[Slices], symmap: SymMap) -> int:
    """How many times a parameter dim holds each unit of a routed group: the number of blocks
    where the analysis kept the blocks of picked groups (:func:`keeps_picked_blocks`: the
    expert positions of ``n_group`` routing groups, ``routing_groups="keep"``), else 1."""
    if keeps_picked_blocks(symmap.analysis_options) is None:
        return 1
    return max((sl.index.numel() // max(1, len(set(sl.unit.tolist()))) for sl in slices),
               default=1)


def _entries_picked(node: fx.Node, length: int) -> int | None:
    """``k`` of ``node`` if it is a ``topk`` along a dim of ``length`` entries, else
    ``None``."""
    if node.target not in (torch.topk, "topk"):
        return None
    out, inputs = node.meta.get("val"), node.all_input_nodes
    x = inputs[0].meta.get("val") if inputs else None
    if not isinstance(out, tuple) or not isinstance(x, torch.Tensor):
        return None
    d = node.kwargs.get("dim", node.args[2] if len(node.args) > 2 else -1)
    if not isinstance(d, int) or not -x.dim() <= d < x.dim():
        return None
    return int(out[1].shape[d]) if int(x.shape[d]) == length else None


def _tensors(v: Any) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    return [t for x in v for t in _tensors(x)] if isinstance(v, (tuple, list)) else []


def _is_pick(node: fx.Node) -> bool:
    """Whether ``node`` makes integer positions out of floating values."""
    return any(not t.is_floating_point() and t.dtype != torch.bool
               for t in _tensors(node.meta.get("val"))) and any(
        t.is_floating_point() for a in node.all_input_nodes
        for t in _tensors(a.meta.get("val")))


def _param_nodes(model: nn.Module, graph: fx.Graph) -> dict[str, list[fx.Node]]:
    """The nodes reading each parameter: its ``get_attr``, its module's calls."""
    params = dict(model.named_parameters())
    names = {id(p): name for name, p in params.items()}
    modules = dict(model.named_modules())
    out: dict[str, list[fx.Node]] = {}
    for n in graph.nodes:
        if n.op == "get_attr" and str(n.target) in params:
            out.setdefault(str(n.target), []).append(n)
        elif n.op == "call_module" and str(n.target) in modules:
            for p in modules[str(n.target)].parameters():
                if id(p) in names:
                    out.setdefault(names[id(p)], []).append(n)
    return out
