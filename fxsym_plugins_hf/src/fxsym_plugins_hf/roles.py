"""A transformer's roles (the ``fxsym_roles`` hook): which groups are the hidden size, the FFN
widths, the attention heads and the experts.

Found by what the groups hold, not by config field names, so on any model with these
mechanisms (a depth group's residual stream, an attention module's ``heads`` symbol, routed
groups, products of two batched tensors), not only on transformers' classes:

* *hidden* (stream): the group of a depth group's residual stream
  (:attr:`fxsym.symbols.DepthGroup.stream_group`);
* inside the blocks of a depth group (every member in one block), a group rooted at an
  attention module's ``heads`` symbol is a *heads* group (key/value heads where queries are
  grouped over them), one rooted at its ``queries_per_kv`` symbol a *queries* group (query
  heads per key/value head); one an attention's products hold (:func:`_products`: the heads
  or channels of a head of an attention traced through, such as OLMoE's, which normalises
  queries and keys over every head) an *attention* group, which no size names. Of the
  others, a group whose modules hold no other group but the hidden size and the experts is
  an FFN-like width of one of three roles: *expert_ffn* where it shares a module with a
  routed group (a fused expert tensor) or lies in the matrices of a stack of weights a
  batched product multiplies (Llama 4's experts, ``bmm(act, gate_up_proj)``: every token
  through every expert, none routed in the trace), *shared_ffn* where its block holds
  experts it does not share (a shared expert, used by every token), *ffn* in a block without
  experts (a dense MLP). Any other (a rank between two sized groups, such as MLA's
  ``q_lora_rank``) is *other*: no size names it, and so is a group read from where the
  residual stream is read (its source, :func:`fxsym.prune.roles.group_sources`) and as long as it:
  the hidden size again, not a width of its own (LFM2's short convolution);
* *experts* (a count): the routed groups (:attr:`fxsym.SymGroup.routed`), the experts of
  each MoE layer, sized only when asked.

The three FFN-like roles are widths the search sizes; heads, queries and experts are counts.
A request's ``heads`` and ``kv_heads`` (:func:`head_sizes`) become the heads and queries
roles' sizes: with grouped queries, ``heads`` counts query heads, kept as ``heads //
kv_heads`` queries per key/value head.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

import torch
from torch import fx, nn

from fxsym.analysis import TensorLayout
from fxsym.errors import PlanError
from fxsym.plugins.contracts import Role, RoleKind, RoleMap, RoleSize
from fxsym.prune.planning import MATMULS
from fxsym.prune.roles import group_sources, reachable
from fxsym.symbols import SymMap

#: the roles, in the order requests are read and the search's table shows them:
#: ``(name, what, kind)``
ROLES = (("hidden", "the hidden size (a residual stream)", RoleKind.STREAM),
         ("ffn", "a dense FFN width", RoleKind.WIDTH),
         ("expert_ffn", "an expert FFN width", RoleKind.WIDTH),
         ("shared_ffn", "a shared-expert FFN width", RoleKind.WIDTH),
         ("experts", "experts per layer", RoleKind.COUNT),
         ("heads", "attention heads", RoleKind.COUNT),
         ("queries", "queries per key/value head", RoleKind.COUNT),
         ("attention", "a width of an attention traced through", RoleKind.FIXED),
         ("other", "a width inside a block that no size names", RoleKind.FIXED))

#: a product of two batched tensors added to a first operand (BLOOM's ALiBi scores)
_ADDED_PRODUCTS = frozenset({torch.baddbmm, "baddbmm"})


def transformer_roles(symmap: SymMap) -> RoleMap:
    """The roles of the groups of ``symmap`` (see the module docstring)."""
    depth = symmap.depth_groups()
    hidden = tuple(dict.fromkeys(d.stream_group for d in depth if d.stream_group))
    blocks = [b for d in depth for b in d.blocks]
    found: dict[str, list[str]] = {k: [] for k, _, _ in ROLES}
    found["hidden"] = list(hidden)
    batched, stacked = _products(symmap)
    groups = symmap.groups()
    by_name = {g.name: g for g in groups}
    sources = group_sources(symmap)
    stream = {(sources[h], by_name[h].size * by_name[h].unit) for h in hidden if h in sources}
    routed = {g.name for g in groups if g.routed}
    held: dict[str, set[str]] = {}  # module -> the groups holding one of its symbols
    for g in groups:
        for q, _ in g.members:
            held.setdefault(q, set()).add(g.name)

    def home(g: Any) -> str | None:
        homes = {next((b for b in blocks if q == b or q.startswith(b + ".")), None)
                 for q, _ in g.members}
        return next(iter(homes)) if len(homes) == 1 else None

    expert_homes = {home(g) for g in groups if g.routed}
    dense: list[Any] = []
    for g in groups:
        if g.name in hidden:
            continue
        if g.routed:
            found["experts"].append(g.name)
            continue
        block = home(g)
        if block is None:
            continue
        root = g.members[0][1]
        beside = set().union(*(held[q] for q, _ in g.members)) - {g.name}
        again = (sources.get(g.name), g.size * g.unit) in stream  # the hidden size, read again
        ffn_like = not beside - routed - set(hidden) and not again
        role = ("heads" if root == "heads" else "queries" if root == "queries_per_kv"
                else "expert_ffn" if ffn_like and (beside & routed or g.id in stacked)
                else "attention" if g.id in batched
                else "other" if not ffn_like else "ffn")
        if role == "expert_ffn":
            expert_homes.add(block)
        if role == "ffn":
            dense.append((g, block))
        else:
            found[role].append(g.name)
    for g, block in dense:  # beside experts: a shared expert
        found["shared_ffn" if block in expert_homes else "ffn"].append(g.name)
    order = {g.name: i for i, g in enumerate(groups)}
    for k in ("ffn", "shared_ffn"):
        found[k].sort(key=order.__getitem__)
    kv_now = by_name[found["heads"][0]].size if found["heads"] else None
    return RoleMap(tuple(Role(name, what, kind, tuple(found[name]))
                         for name, what, kind in ROLES),
                   names=("heads", "kv_heads"),
                   sizes=partial(head_sizes, bool(found["queries"]), kv_now))


def head_sizes(grouped: bool, kv_now: int | None, given: Mapping[str, int]
               ) -> list[RoleSize]:
    """The heads and queries roles' sizes for a request's ``heads`` and ``kv_heads``
    (``given``); ``grouped``: queries are grouped over key/value heads (a ``queries`` role
    holds groups), ``kv_now`` the key/value heads now."""
    heads, kv_heads = given.get("heads"), given.get("kv_heads")
    out: list[RoleSize] = []
    if grouped:  # grouped queries: heads groups count key/value heads
        kv = kv_heads
        if heads is not None:
            kv = kv if kv is not None else kv_now
            if not kv or heads % kv:
                raise PlanError(f"--heads {heads} is not a multiple of the key/value heads {kv}")
            out.append(RoleSize("queries", heads // kv, "queries per key/value head"))
        if kv is not None:
            out.append(RoleSize("heads", kv, "key/value heads"))
        return out
    if kv_heads is not None and heads is not None and kv_heads != heads:
        raise PlanError("the attention has as many key/value heads as heads here; give one "
                        "count")
    count = heads if heads is not None else kv_heads
    if count is not None:
        out.append(RoleSize("heads", count, "attention heads"))
    return out


def _products(symmap: SymMap) -> tuple[set[int], set[int]]:
    """The groups (roots) an attention's products of two tensors hold, and those in the
    matrix dims of a stack of weights a batched product multiplies (Llama 4's experts:
    ``bmm(act, gate_up_proj)``, one matrix per expert, each token through all of them).

    An attention's: those in a dim of the queries, keys or values of
    ``scaled_dot_product_attention``, and, of a product of two batched tensors computed from
    the inputs (``q @ k.transpose(-1, -2)``, ``baddbmm``), those in a batch dim of either
    operand (heads, also where the other operand broadcasts one head over them: a
    multi-query attention's single key) or in the dim the product sums over (the channels of
    a head). An MLP's width is not there: a projection's weight is a matrix whose width the
    product keeps (fused experts picked per token, whose width the sum runs over in
    ``bmm(down[picked], act)``, are expert FFN widths, found first by
    :func:`transformer_roles`), and a product with a weight (an operand no input reaches) is
    no attention."""
    analysis, graph = symmap.analysis, symmap.graph
    if analysis is None or graph is None:
        return set(), set()
    computed = reachable([n for n in graph.nodes if n.op == "placeholder"],
                        lambda n: list(n.users))
    out: set[int] = set()
    stacked: set[int] = set()
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        if node.target is nn.functional.scaled_dot_product_attention:
            for a in node.args[:3]:
                lay = analysis.node_layouts.get(a.name) if isinstance(a, fx.Node) else None
                out |= _roots(analysis, lay, range(len(lay) if lay else 0))
            continue
        if node.target in MATMULS:
            args = node.args[:2]
        elif node.target in _ADDED_PRODUCTS:  # baddbmm(bias, q, k): the product of the last two
            args = (*node.args[1:3], *(node.kwargs[k] for k in ("batch1", "batch2")
                                       if k in node.kwargs))
        else:
            continue
        nodes = [a for a in args if isinstance(a, fx.Node)]
        layouts = [x for a in nodes
                   if isinstance(x := analysis.node_layouts.get(a.name), TensorLayout)]
        if len(layouts) != 2 or not all(len(x) > 2 for x in layouts):
            continue
        weights = [x for a, x in zip(nodes, layouts, strict=True) if a not in computed]
        if weights:
            stacked |= set().union(*(_roots(analysis, x, (len(x) - 2, len(x) - 1))
                                     for x in weights))
            continue
        left, right = layouts
        out |= (_roots(analysis, left, [*range(len(left) - 2), len(left) - 1])
                | _roots(analysis, right, range(len(right) - 1)))
    return out, stacked


def _roots(analysis: Any, layout: Any, dims: Iterable[int]) -> set[int]:
    """The groups (roots) in those dims of ``layout``."""
    if not isinstance(layout, TensorLayout):
        return set()
    table = analysis.table
    return {r for d in dims for seg in layout[d] if seg.group is not None
            for r in table.same_size(seg.group)}  # a block of a fused chunk: all of them


