"""Coverage: the share of producing modules whose output belongs to a searchable group.

Not an oracle (nothing is run): a measure of how much of a model the analysis can resize,
read off the SymMap alone. See :func:`coverage` for what counts as producing and as covered.
"""

from __future__ import annotations

from ..symbols import SymMap


def coverage(symmap: SymMap) -> float:
    """The share of *producing* modules whose output belongs to a searchable group.

    A module produces a dimension when it creates that dimension's entries from its own
    weights: it has an OUTGOING symbol in its SymInfo (a conv's ``out_channels``), or it is
    traced into and owns a parameter that an op rule made the producer of a dim
    (``GroupAnalysis.param_producers``: the weight of a functional ``linear``, ``conv``,
    ``embedding`` or ``matmul``, as in a ``Linear`` subclass with its own ``forward``). It
    counts as covered when one of those symbols or parameters is a member of a searchable
    group. Parameters that only follow a dimension something else produces (a class token
    concatenated to it, a position embedding or a layer scale applied to it) are members of
    its groups but not producers, so they count neither way. For a CNN this is the share of
    convs and linears that can be pruned; the head (whose output is the model's output)
    always counts against it. A module the traced graph reached only through its parameters
    (transformers' Mamba mixers run ``self.conv1d`` as ``F.conv1d(x, self.conv1d.weight,
    ...)``, so its symbols have no dim) counts as covered when one of its parameters' dims is
    a member of a searchable group, against it otherwise.
    """
    producers = {(name, s) for name, syms in symmap.named_sym_dicts()
                 for s, sym in syms.items() if sym.is_outgoing}
    analysis = symmap.analysis
    if analysis is not None:
        producers |= analysis.param_producers
    if not producers:
        return 0.0
    modules = {name for name, _ in producers}
    # a module the graph reached through its parameters only (a conv whose weight a
    # functional conv1d reads): its symbols have no dim, its weight's dims say where its
    # output channels went
    by_params: set[str] = set() if analysis is None else {
        name for name in modules
        if not any((name, s) in analysis.symbol_dims for n, s in producers if n == name)}
    params = frozenset() if analysis is None else analysis.param_members
    live = {name for g in symmap.groups() for name, s in g.members
            if (name, s) in producers or (name in by_params and (name, s) in params)}
    return len(live) / len(modules)
