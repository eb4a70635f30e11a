"""What one analysis run holds, and how it pins groups.

:class:`AnalyzerBase` is the base of :class:`~fxsym.analysis.analyzer.Analyzer`: it holds the
state every part of one run shares (the group table, each value's layout, the symbol dims
found, the parameters and attributes read, the positions, the pins and where they were made)
and the one way a group becomes constant during the run: :meth:`~AnalyzerBase.fix` (every
group of a layout pinned, a report line naming where, the pin site kept for the explanations),
:meth:`~AnalyzerBase.boundary` (a node the analysis cannot follow: all it touches pinned, its
value fixed) and :meth:`~AnalyzerBase.reword_pin` (a pin's reason said better once known).
The op rules reach these through their :class:`~fxsym.analysis.context.OpContext`.

The analyzer is one object whose parts share this state; each part is a class of its own
module, combined by inheritance: the walk over the graph, the op rules and the modules with a
SymInfo (:mod:`.analyzer`), tensors read with ``get_attr`` (:mod:`.parameter_reads`), ints
read as sizes (:mod:`.attribute_reads`), and the report lines that explain pins after the run
(:mod:`.explain`). :func:`~fxsym.analysis.alternatives.analyze_graph` runs it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx

from ..symbols import SymMap
from ..tracer.report import TraceReport
from .groups import GroupTable
from .layout import Dim, Layout, Seg, fixed_layout, iter_dims
from .outputs import Contract
from .submodules import Submodules


class AnalyzerBase:
    """The state one analysis run shares across the parts of the analyzer, and its pins."""

    def __init__(self, gm: torch.fx.GraphModule, symmap: SymMap, report: TraceReport,
                 contract: Contract | None = None, strict_contract: bool = True,
                 alternatives: frozenset[str] = frozenset()) -> None:
        self.gm = gm
        #: nodes taking their alternative mapping (:meth:`OpContext.offer_alternative`), and
        #: the alternatives offered in this run: (node name, the dim the first mapping keeps)
        self.alternatives = alternatives
        self.offers: list[tuple[str, Dim]] = []
        #: the outputs whose sizes must stay (``None``: every output), and whether a name
        #: missing from the output is an error (a user's contract) or skipped (a plugin's)
        self.contract = contract
        self.strict_contract = strict_contract
        self.symmap = symmap
        self.report = report
        self.table = GroupTable()
        self.env: dict[torch.fx.Node, Layout] = {}
        #: values that are positions along a dim (see :mod:`fxsym.analysis.context`), and
        #: the op that returned them first
        self.positions: dict[torch.fx.Node, Any] = {}
        self.position_origins: dict[torch.fx.Node, str] = {}
        #: the nodes made boundaries
        self.boundaries: set[torch.fx.Node] = set()
        #: (module_qualname, symbol_name) -> the Dim that symbol sizes
        self.symbol_dims: dict[tuple[str, str], Dim] = {}
        self._out_groups: dict[tuple[str, str], int] = {}
        #: keys of ``symbol_dims`` that are parameter members, not symbols
        self.param_members: set[tuple[str, str]] = set()
        #: layout of each parameter or buffer read with ``get_attr``, by target
        self.param_reads: dict[str, Layout] = {}
        self._member_keys: dict[str, list[tuple[str, str]]] = {}
        #: layout of each int attribute read as a size, by target, and the groups they start
        self.attribute_reads: dict[str, Layout] = {}
        self.attribute_groups: set[int] = set()
        #: layout of each config field read as a size, by ``(id(config), field)``
        self.config_reads: dict[tuple[int, str], Layout] = {}
        #: the modules that read each config field, by ``(id(config), field)``
        self.config_readers: dict[tuple[int, str], set[str]] = {}
        #: (group id, where, reason) of every fix that made a group constant, in order
        self.pin_sites: list[tuple[int, str, str]] = []
        #: (node, group, size) of every group pinned where it met a dim of fixed size
        self.fixed_meets: list[tuple[torch.fx.Node, int, int]] = []
        #: per (where, reason) of a boundary line: whether it pinned only numbers that size no
        #: tensor (see :meth:`fix`)
        self.number_sites: dict[tuple[str, str], bool] = {}
        self.registry = symmap.registry
        #: the submodules of the traced GraphModule and of the model, by path
        self.modules = Submodules(gm)
        self.model_modules = Submodules(symmap.model)

    def boundary(self, node: torch.fx.Node, reason: str) -> Layout:
        """Make every group the node touches constant; its value gets a fixed layout."""
        self.boundaries.add(node)
        self.fix(self._input_layouts(node), reason, node)
        return fixed_layout(node.meta.get("val"))

    def fix(self, layout: Any, reason: str, node: torch.fx.Node | None = None, *,
            sizes_no_tensor: bool = False, kind: str = "boundary") -> bool:
        """Make every group in ``layout`` constant; where that changed one and ``node`` is
        given, a report line of ``kind`` names it. ``sizes_no_tensor``: ``layout`` is a number
        read from a module attribute that the node takes as something other than a tensor size
        (a pooling's ``kernel_size``); a line only about such numbers is a detail of the report
        (:func:`fxsym.analysis.api.analyze`). Returns whether a group changed."""
        changed = False
        dims = [layout] if _is_dim(layout) else list(iter_dims(layout))
        for dim in dims:
            for seg in dim:
                if seg.group is not None:
                    changed |= self.table.fix(seg.group, reason)
        if changed and node is not None:
            where = _where(node)
            self.report.add(kind, where, reason)
            self.pin_sites.extend((seg.group, where, reason) for dim in dims for seg in dim
                                  if seg.group is not None)
            self.number_sites[(where, reason)] = sizes_no_tensor and self.number_sites.get(
                (where, reason), True)
        return changed

    def reword_pin(self, node: torch.fx.Node, g: int, old: str, new: str) -> None:
        """Say ``new`` instead of ``old`` for the pin of ``g``'s group at ``node``: in the group
        table, the report line and the pin sites."""
        self.table.reword(g, old, new)
        where = _where(node)
        self.report.entries = [
            dataclasses.replace(e, message=new)
            if (e.kind, e.where, e.message) == ("boundary", where, old) else e
            for e in self.report.entries]
        self.pin_sites = [(pg, w, new if (w, r) == (where, old) else r)
                          for pg, w, r in self.pin_sites]
        if (where, old) in self.number_sites:
            self.number_sites[(where, new)] = self.number_sites.pop((where, old))

    def _input_layouts(self, node: torch.fx.Node) -> tuple[Layout, ...]:
        return tuple(self.env.get(n) for n in node.all_input_nodes)


def _is_dim(obj: Any) -> bool:
    return isinstance(obj, tuple) and bool(obj) and isinstance(obj[0], Seg)


def _where(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if node.op == "call_module":
        return f"{node.target} (node {node.name})"
    if stack:
        path = list(stack.values())[-1][0]
        return f"{path} (node {node.name})"
    return f"node {node.name}"
