""":func:`analyze_graph`: the analyzer run, and run again where a rule offered another mapping.

An op rule that can map a node in two sound ways offers the second
(:meth:`~fxsym.analysis.context.OpContext.offer_alternative`); the first run takes the first.
Where that run ended with the first choice's groups constant (or, in an analysis keeping the
blocks of picked groups, :func:`~fxsym.analysis.options.picked_blocks_kept`, keeping a group
picked by value), the analyzer runs once more with those
nodes taking their alternative, and the run leaving more symbols in searchable groups is kept
(each is sound on its own), with its report entries.
"""

from __future__ import annotations

import torch
import torch.fx

from ..symbols import SymMap
from ..tracer.report import TraceReport
from .analyzer import Analyzer
from .options import picked_blocks_keeper, picked_blocks_kept
from .outputs import Contract


def analyze_graph(gm: torch.fx.GraphModule, symmap: SymMap, report: TraceReport,
                  contract: Contract | None = None, strict_contract: bool = True) -> Analyzer:
    """Run the analyzer; where a rule offered an alternative mapping whose first choice
    ended constant (:meth:`OpContext.offer_alternative`), run it once more with those nodes
    taking their alternative, and keep the run leaving more symbols in searchable groups
    (each run is sound on its own). In an analysis keeping the blocks of picked groups
    (:func:`~fxsym.analysis.options.picked_blocks_kept`, the nn plugin's
    ``routing_groups="keep"``) an offer whose first choice keeps a routed group takes its
    alternative too, and that run is kept. ``report`` receives the kept run's entries."""
    start = list(report.entries)
    analyzer = Analyzer(gm, symmap, report, contract, strict_contract)
    analyzer.run()
    table = analyzer.table
    why: dict[str, str] = {}
    # the blocks of picked groups kept: a split whose first reading keeps a routed group (its
    # blocks) takes its blocks reading (one position of every block) instead
    forced = picked_blocks_kept() and any(
        s.group is not None and table.find(s.group) in table.routed
        for _, dim in analyzer.offers for s in table.resolve(dim))
    for name, dim in analyzer.offers:
        reasons = [table.reason(s.group) for s in table.resolve(dim) if s.group is not None]
        if reasons and all(reasons):
            why[name] = str(reasons[0])
        elif forced and any(s.group is not None and table.find(s.group) in table.routed
                            for s in table.resolve(dim)):
            why[name] = (f"{picked_blocks_keeper()} keeps the number of blocks of a group "
                         "picked by value")
    if not why:
        return analyzer
    first = list(report.entries)
    report.entries[:] = start
    second = Analyzer(gm, symmap, report, contract, strict_contract, frozenset(why))
    second.run()
    if forced or _searchable_symbols(second) > _searchable_symbols(analyzer):
        for name, reason in why.items():
            report.add("alternative", f"node {name}", "its alternative mapping is used, since "
                       f"the groups of the first ended constant or are routed ({reason})")
        return second
    report.entries[:] = first
    return analyzer


def _searchable_symbols(an: Analyzer) -> int:
    """How many symbols and members lie (at least in part) in groups that are not constant."""
    table = an.table
    return sum(any(s.group is not None and not table.is_constant(s.group) for s in dim)
               for dim in an.symbol_dims.values())


__all__ = ["analyze_graph"]
