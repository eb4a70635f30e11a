"""``fxsym.analyze``: trace, propagate, and turn the group table into a SymMap."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torch import nn

from ..errors import AnalysisError
from ..plugins.calls import call_hook
from ..plugins.contracts import GroupStep
from ..symbols import (
    ATTRIBUTE_PREFIX,
    GroupAnalysis,
    Symbol,
    SymbolKey,
    SymGroup,
    SymMap,
    combine_step,
)
from ..tracer import trace_deferred
from ..tracer.guard import gc_paused, serialised
from ..tracer.report import ReportEntry, TraceReport
from .alternatives import analyze_graph
from .analyzer import Analyzer
from .derived import settle_derived
from .groups import GroupTable
from .layout import SizeLayout, TensorLayout
from .options import checked_options, options_set
from .outputs import Contract, normalize_contract
from .residual_blocks import find_depth_groups


@serialised
def analyze(
    model: nn.Module,
    *,
    example_inputs: Any = None,
    concrete_args: dict[str, Any] | None = None,
    outputs: Any = None,
    **options: str,
) -> SymMap:
    """Find the searchable cross-layer groups of ``model``; never mutates it.

    ``example_inputs`` (a tuple of positional arguments, a dict of keyword arguments or one
    tensor) are needed unless a plugin supplies defaults for the model's family. The trace
    report (fallback leaves, boundaries) is ``symmap.trace_report``; the traced graph is
    ``symmap.graph_module``.

    ``outputs`` is the output contract (see :mod:`fxsym.analysis.outputs`): names or
    positions of the outputs whose sizes must stay. ``None`` takes a plugin's default for the
    model's family (a Hugging Face task model: ``logits`` and ``loss``), else every output;
    ``"*"`` is every output. The contract used is ``symmap.output_contract``.

    ``options`` are the analysis options the plugins declare (``fxsym_analysis_options``,
    :mod:`fxsym.analysis.options`); a keyword no plugin declares is refused. The nn plugin's:
    ``norm_groups`` says how group norms change: ``"follow"``, channels go a whole norm group
    at a time and ``num_groups`` follows; ``"keep"``, ``num_groups`` stays and every norm group
    loses as many channels. ``routing_groups`` says how a router's routing groups change:
    ``"follow"``, experts go a whole routing group at a time; ``"keep"``, the number of
    routing groups stays and each keeps the experts at the same positions.
    """
    if not isinstance(model, nn.Module):
        raise AnalysisError(f"expected a torch.nn.Module, got {type(model).__name__}")
    options = checked_options(**options)
    with gc_paused(), options_set(options):
        gm = trace_deferred(model, example_inputs=example_inputs, concrete_args=concrete_args)
        if gm.example_inputs is None:
            raise AnalysisError(
                f"analyzing {type(model).__name__} needs example_inputs (a tuple of positional "
                "arguments or a dict of keyword arguments); no plugin supplies defaults for it"
            )
        contract, strict = _contract(model, outputs)
        symmap = SymMap(model)
        symmap.analysis_options = dict(options)
        symmap.graph_module = gm  # the plugins' hooks below read the graph (attributes read)
        report = gm.trace_report
        assert isinstance(report, TraceReport), "fxsym.trace sets a TraceReport on its result"
        analyzer = analyze_graph(gm, symmap, report, contract, strict)
        analyzer.explain_fixed_sizes()
        _finish(symmap, analyzer)
        _find_steps(model, symmap)
        if _pin_untraced_paths(model, symmap, analyzer, gm.example_inputs):
            symmap = SymMap(model)  # the groups again, from the table with those pinned
            symmap.analysis_options = dict(options)
            symmap.graph_module = gm
            _finish(symmap, analyzer)
            _find_steps(model, symmap)
        _mark_details(analyzer)
        _find_depth(model, gm, symmap, report)
        if not symmap.groups():
            analyzer.explain_no_group()
        symmap.trace_report = report
        symmap.derived_state = settle_derived(getattr(gm, "derived_state", {}),
                                              getattr(gm, "derived_writes", {}), analyzer.env,
                                              analyzer.table, analyzer.model_modules)
        symmap.output_contract = analyzer.contract
        return symmap


def _find_depth(model: nn.Module, gm: Any, symmap: SymMap, report: TraceReport) -> None:
    """Attach the depth groups (:mod:`.residual_blocks`) to the analysis ``symmap`` holds."""
    analysis = symmap.analysis
    assert analysis is not None
    depth = find_depth_groups(model, gm.graph, analysis.node_layouts, analysis.table, report,
                              {g.id: g.name for g in analysis.groups})
    if depth:
        symmap.attach_analysis(dataclasses.replace(analysis, depth_groups=depth))


def _find_steps(model: nn.Module, symmap: SymMap) -> None:
    """Give each group the step its sizes take (``fxsym_group_steps``): ``entries`` of its dim
    are ``entries / gcd(entries, unit)`` units; the steps of several plugins combine to their
    least common multiple, their reasons joined."""
    analysis = symmap.analysis
    assert analysis is not None
    steps: dict[str, tuple[int, str]] = {}
    units = {g.name: g.unit for g in analysis.groups}
    answers: list[Mapping[str, GroupStep] | None] = call_hook(
        "fxsym_group_steps", model=model, symmap=symmap)
    for found in answers:
        for name, (entries, reason) in (found or {}).items():
            if name not in units or not isinstance(entries, int) or entries < 1:
                continue
            steps[name] = combine_step(steps.get(name, (1, "")), entries, units[name],
                                       str(reason))
    if any(step > 1 for step, _ in steps.values()):
        groups = tuple(dataclasses.replace(g, step=steps[g.name][0],
                                           step_reason=steps[g.name][1])
                       if steps.get(g.name, (1,))[0] > 1 else g for g in analysis.groups)
        symmap.attach_analysis(dataclasses.replace(analysis, groups=groups))


def _pin_untraced_paths(model: nn.Module, symmap: SymMap, an: Analyzer,
                        example_inputs: Any) -> bool:
    """Pin the groups a path of the model the trace did not run would break
    (``fxsym_untraced_paths``), each with its reason and an ``untraced-path`` report line; a
    key naming no group is a report line only. Whether a group was pinned."""
    groups = {g.name: g for g in symmap.groups()}
    pinned = False
    for found in call_hook("fxsym_untraced_paths", model=model, symmap=symmap,
                           example_inputs=example_inputs) or ():
        for name, reason in (found or {}).items():
            group = groups.get(str(name))
            if group is not None:
                pinned |= an.table.fix(group.id, str(reason))
            an.report.add("untraced-path", str(name) or "<model>", str(reason))
    return pinned


def _contract(model: nn.Module, outputs: Any) -> tuple[Contract | None, bool]:
    """The output contract to analyze with, and whether missing names are errors."""
    if outputs == "*":
        return None, True
    if outputs is not None:
        return normalize_contract(outputs), True
    default = call_hook("fxsym_default_outputs", model=model)
    return normalize_contract(default), False


def _finish(symmap: SymMap, an: Analyzer) -> None:
    """Build the SymGroups, set every symbol's state from the group table and attach the
    result to ``symmap``."""
    table = an.table
    _check_declared(symmap, an)
    members: dict[int, dict[SymbolKey, None]] = {}  # each root's members, in order
    declared = _declared(symmap, an)
    for key, dim in an.symbol_dims.items():
        for seg in dim:
            if seg.group is not None:
                found = members.setdefault(table.find(seg.group), {})
                found[key] = None
                found.update(dict.fromkeys(declared.get(key, ())))
    symbols = dict(symmap.named_sym_dicts())

    def symbol(key: SymbolKey) -> Symbol:
        return symbols[key[0]][key[1]]

    covered = _covered(an, symbols)
    for key, inner in covered.items():
        for seg in an.symbol_dims[key]:
            if seg.group is not None:
                members.setdefault(table.find(seg.group), {}).update(dict.fromkeys(inner))
    not_symbols = an.param_members | {k for attrs in declared.values() for k in attrs}
    _pin_unproduced_ties(an)

    groups: list[SymGroup] = []
    roots: dict[int, SymbolKey] = {}
    for root, producers in sorted(table.producers.items()):
        if table.find(root) != root or root in table.reasons:
            continue
        searchable = [(g, q, s) for g, q, s, ok in producers if ok]
        if not searchable:
            continue
        # a module's symbol names the group before a functional op's parameter
        searchable.sort(key=lambda p: (p[1], p[2]) in an.param_members)
        gid, *hq = searchable[0]
        head = (hq[0], hq[1])
        roots[root] = head
        rest = [m for m in members.get(root, {}) if m != head]
        keys = (head, *rest)
        seg = next(s for s in an.symbol_dims[head]
                   if s.group is not None and table.find(s.group) == root)
        groups.append(SymGroup(
            name=(f"{head[0]}.{head[1]}" if head[0] else head[1]) + table.block_path(gid),
            size=table.units[root],
            unit=seg.length // table.units[root],
            is_sortable=all(k in not_symbols or symbol(k).is_sortable_itself for k in keys),
            members=keys,
            id=root,
            min_size=table.min_units(root),
            routed=root in table.routed,
        ))
    # symbol states: constant unless in a searchable group; the group head is searchable (a
    # symbol inside a leaf lives through the leaf's symbols covering it)
    inside: dict[SymbolKey, list[SymbolKey]] = {}
    for key, inner in covered.items():
        for k in inner:
            inside.setdefault(k, []).append(key)
    for name, syms in symbols.items():
        for sname, sym in syms.items():
            if not sym.is_cross_layer:
                continue
            live = [table.find(s.group) for key in [(name, sname), *inside.get((name, sname), ())]
                    for s in an.symbol_dims.get(key, ())
                    if s.group is not None and table.find(s.group) in roots]
            if not live:
                sym.disable()
    heads: dict[int, tuple[Symbol, list[SymbolKey]]] = {}
    for root, head in roots.items():
        # a parameter member heading its group (a functional op's weight) has no Symbol: the
        # group's first module symbol, if any, stands for it
        symbols_in = [k for k in members.get(root, {}) if k not in not_symbols]
        if head in an.param_members:
            if not symbols_in:
                continue
            head = symbols_in[0]
        heads[root] = (symbol(head), symbols_in)
    # a symbol of a dim made of blocks may head one group and belong to others: every head is
    # searchable, and only symbols heading no group link to a head
    head_ids = {id(h) for h, _ in heads.values()}
    for head_sym, _ in heads.values():
        head_sym.make_searchable()
    for head_sym, symbols_in in heads.values():
        for key in symbols_in:
            sym = symbol(key)
            if id(sym) not in head_ids and (sym.is_free or sym.is_searchable):
                sym.link_to(head_sym)
    names = {g.id: g.name for g in groups}
    groups = [dataclasses.replace(g, same_size=tuple(
        names[r] for r in table.same_size(g.id)[1:] if r in names)) for g in groups]
    symmap.attach_analysis(GroupAnalysis(
        groups=tuple(groups),
        symbol_dims=dict(an.symbol_dims),
        param_members=frozenset(an.param_members),
        table=table,
        producers={r: tuple(dict.fromkeys((q, s) for _, q, s, _ in table.producers.get(r, [])
                                          if _whole(an, table, (q, s), r))) for r in roots},
        param_producers=frozenset((q, s) for found in table.producers.values()
                                  for _, q, s, _ in found if (q, s) in an.param_members),
        node_layouts={n.name: _tensor_layouts(table.resolve_layout(lay))
                      for n, lay in an.env.items()},
    ))


def _pin_unproduced_ties(an: Analyzer) -> None:
    """Pin, with a report line, every same-size class (:meth:`GroupTable.tie_sizes`) that
    holds a searchable group and a group no searchable producer heads.

    A resize changes a group only through its producers; the other group would keep its
    size while its partner's changed, breaking what tied them (``o.reshape(b, n, c)`` with
    ``c`` read from the resized stream and ``o`` from a projection nothing resizes)."""
    table = an.table

    def produced(r: int) -> bool:
        return any(ok for *_, ok in table.producers.get(r, ()))

    for root in sorted(table.producers):
        if table.find(root) != root or root in table.reasons or not produced(root):
            continue
        idle = [r for r in table.same_size(root)[1:] if not produced(r)]
        if idle:
            head = next((q, s) for _, q, s, ok in table.producers[root] if ok)
            reason = ("its size is tied to a dim that no producer resizes (a reshape by a "
                      "size read from another group)")
            an.report.add("boundary", f"{head[0]}.{head[1]}" if head[0] else head[1], reason)
            table.fix(root, reason)


def _mark_details(an: Analyzer) -> None:
    """Mark as details (:class:`~fxsym.tracer.report.ReportEntry`) the boundary lines that
    pinned only sizes that never were elastic candidates: numbers read from module attributes
    that the pinning node takes as no tensor size (:meth:`Analyzer.fix`, a max pool's
    ``kernel_size``) and that no tensor dimension joined (their groups hold module attributes
    only). A line that pinned anything else stays as it is."""
    find = an.table.find
    tensor_roots: set[int] = set()
    attribute_roots: set[int] = set()
    for (_, sname), dim in an.symbol_dims.items():
        roots = attribute_roots if sname.startswith(ATTRIBUTE_PREFIX) else tensor_roots
        roots.update(find(seg.group) for seg in dim if seg.group is not None)
    only_attributes = attribute_roots - tensor_roots
    pinned: dict[tuple[str, str], set[int]] = {}
    for g, where, reason in an.pin_sites:
        pinned.setdefault((where, reason), set()).add(find(g))

    def detail(e: ReportEntry) -> bool:
        key = (e.where, e.message)
        hit = pinned.get(key)
        return (e.kind == "boundary" and an.number_sites.get(key, False) and hit is not None
                and hit <= only_attributes)

    an.report.entries = [dataclasses.replace(e, detail=True) if detail(e) else e
                         for e in an.report.entries]


def _tensor_layouts(layout: Any) -> Any:
    """``layout`` with only its tensors' layouts: a size's layout (which records the nodes
    that used it) becomes ``None``."""
    if isinstance(layout, TensorLayout):
        return layout
    if isinstance(layout, SizeLayout):
        return None
    if isinstance(layout, (tuple, list)):
        return tuple(_tensor_layouts(x) for x in layout)
    if isinstance(layout, dict):
        return {k: _tensor_layouts(v) for k, v in layout.items()}
    return None


def _whole(an: Analyzer, table: GroupTable, key: SymbolKey, root: int) -> bool:
    """Whether the dim ``key`` sizes is group ``root`` alone, in one segment or in copies (a
    group norm that keeps its norm groups), not the fused dim a block of the group came
    from, whose weights do not rank the block's entries alone."""
    dim = an.symbol_dims.get(key, ())
    return bool(dim) and all(s.group is not None and table.find(s.group) == root for s in dim)


def _check_declared(symmap: SymMap, an: Analyzer) -> None:
    """Pin the groups of the symbols a declared attribute reads where the declaration does
    not describe the module (:meth:`SymInfo.attribute_mismatches`), with a report line: a
    resize could not keep it right."""
    for name, mod in symmap.named_modules():
        info = symmap.sym_info(mod)
        if not info.attributes:
            continue
        entries = {s: sum(seg.units * seg.block for seg in an.symbol_dims[(name, s)])
                   for s in info.symbols if (name, s) in an.symbol_dims}
        for attr, problem in info.attribute_mismatches(mod, info.sizes(entries)).items():
            reason = f"declared attribute {name}.{attr} = {info.attributes[attr]} is wrong: " \
                     f"{problem}"
            an.report.add("declared", name, reason)
            for sname in info.attributes[attr].symbols:
                for seg in an.symbol_dims.get((name, sname), ()):
                    if seg.group is not None:
                        an.table.fix(seg.group, reason)


def _declared(symmap: SymMap, an: Analyzer) -> dict[SymbolKey, list[SymbolKey]]:
    """For each symbol the analysis reached: the attribute members ``(module, "attr:name")``
    its module's SymInfo declares from it (:meth:`SymInfo.declare`)."""
    out: dict[SymbolKey, list[SymbolKey]] = {}
    for name, mod in symmap.named_modules():
        info = symmap.sym_info(mod)
        for attr, expr in info.attributes.items():
            for sname in expr.symbols:
                if (name, sname) in an.symbol_dims:
                    out.setdefault((name, sname), []).append((name, f"{ATTRIBUTE_PREFIX}{attr}"))
    return out


def _covered(an: Analyzer, symbols: dict[str, dict[str, Symbol]]
             ) -> dict[SymbolKey, list[SymbolKey]]:
    """For each symbol the analysis reached that covers symbols inside its (leaf) module
    (:attr:`Symbol.covers`): the qualified keys of those that have a SymInfo."""
    out: dict[SymbolKey, list[SymbolKey]] = {}
    for key in an.symbol_dims:
        sym = None if key in an.param_members else symbols.get(key[0], {}).get(key[1])
        if sym is None or not sym.covers:
            continue
        inner = [(f"{key[0]}.{path}" if key[0] else path, sname) for path, sname in sym.covers]
        inner = [k for k in inner if k[1] in symbols.get(k[0], {}) and k not in an.symbol_dims]
        if inner:
            out[key] = inner
    return out


__all__ = ["analyze"]
