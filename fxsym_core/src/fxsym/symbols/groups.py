"""What an analysis found, as the SymMap holds it: groups and the analysis behind them.

* :class:`SymGroup`: one searchable cross-layer size (a root symbol and its members);
  :func:`combine_step` merges the steps a group's sizes must keep to.
* :class:`DepthGroup`: a stack of residual blocks, whose units are modules.
* :class:`GroupAnalysis`: the groups, every member's dimension segments, the group table,
  the producers and the traced values' layouts.

The segments and the group table belong to :mod:`fxsym.analysis`, a higher room; what this
room needs of them is spelled as the protocols :class:`Segment` and :class:`GroupIndex`
(read-only), so nothing here imports the analysis.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class SymGroup:
    """One searchable cross-layer size: a root symbol and every symbol tied to it.

    ``size`` counts *units*; ``unit`` is how many entries of the root symbol's dimension one
    unit spans (1 for channels; ``head_dim`` where the group's units are attention heads, the
    channels of a conv group for grouped convs). ``members`` lists
    ``(module_qualname, symbol_name)`` for every symbol that must change with the root, the
    root first; a parameter used directly in the graph appears as ``(owner, "name:dim")``.
    """

    name: str
    size: int
    is_sortable: bool
    members: tuple[tuple[str, str], ...]
    unit: int = 1
    id: int = field(repr=False, compare=False, default=-1)
    #: names of the other groups that must keep as many units as this one (the blocks of a
    #: ``chunk``, cut at equal sizes at run time); their entries are chosen independently
    same_size: tuple[str, ...] = ()
    #: the fewest units a resize may keep (a router's ``topk`` over the group needs ``k``)
    min_size: int = 1
    #: a router picks this group's entries by value: the positions its ``topk`` returns index
    #: the members (the experts of a mixture of experts). Permuting the entries is exact;
    #: dropping some changes what the router picks (that is expert pruning), so dropping is
    #: not zeroing and the value oracle does not check the group
    routed: bool = False
    #: a kept size other than the whole group is a multiple of ``step`` units: what a plugin
    #: says the model's own kernels need (``fxsym_group_steps``: transformers' ``grouped_mm``
    #: experts kernel takes 16-byte strides only); :func:`fxsym.plan` rounds to it,
    #: :func:`fxsym.search.sizes_for` refuses another size and :func:`fxsym.resize` keeps it
    #: with a :class:`~fxsym.ResizeWarning`. ``step_reason`` says why
    step: int = 1
    step_reason: str = ""


def combine_step(now: tuple[int, str], entries: int, unit: int, reason: str
                 ) -> tuple[int, str]:
    """A group's ``(step, reason)`` (:attr:`SymGroup.step`, in units of ``unit`` entries) once
    it must also keep multiples of ``entries`` entries for ``reason``: the least common
    multiple of the two steps, the reasons joined."""
    step = entries // math.gcd(entries, unit)
    return math.lcm(now[0], step), "; ".join(r for r in (now[1], reason) if r)


@dataclass(frozen=True)
class DepthGroup:
    """A model's depth as a group: a ``ModuleList`` (or ``Sequential``) whose blocks the
    analysis proved residual, each unit one block (see :mod:`fxsym.analysis.residual_blocks`).

    Its units are modules, not slices of tensors, so it is not a :class:`SymGroup` and is
    not in :meth:`SymMap.groups`: :meth:`SymMap.depth_groups` lists it. :func:`fxsym.resize`
    takes its ``name`` like a group's: ``{"model.layers.depth": [0, 1, 3]}`` keeps those
    blocks, in that order, and renumbers them.

    ``container`` is the list's qualified name, ``blocks`` its children's, in order.
    ``positions`` are ``(path inside a block, attribute)`` of the int attributes that count
    the blocks (``layer_idx``: block ``i`` holds ``i`` wherever it holds one, in the attention
    of some blocks and the state-space mixer of others), set to each kept block's new
    position. ``feature_dim`` is the dim of the residual stream holding its
    features (the dim the block importance compares along). ``varying_inputs`` describes the
    values, other than the stream, that the blocks read but not all alike (one attention mask
    for some blocks, another for others): which block reads which is chosen by position, and a
    resize needs a plugin that makes the choice follow the kept blocks (the hf plugin's
    per-layer config lists). ``stream_group`` names the :class:`SymGroup` of the stream's
    features (a model's hidden size), if that is searchable.
    """

    name: str
    container: str
    size: int
    blocks: tuple[str, ...]
    positions: tuple[tuple[str, str], ...] = ()
    feature_dim: int = -1
    varying_inputs: tuple[str, ...] = ()
    #: the searchable group of the stream's features (the hidden size), if it is one
    stream_group: str | None = None


#: ``(module_qualname, symbol_name)``; a parameter member is ``(owner, "name:dim")``
SymbolKey = tuple[str, str]


class Segment(Protocol):
    """A run of entries along one tensor dimension (``fxsym.analysis.Seg``): ``units`` units
    of group ``group`` (``None``: of fixed size), each ``block`` consecutive entries long."""

    @property
    def group(self) -> int | None: ...

    @property
    def units(self) -> int: ...

    @property
    def block(self) -> int: ...


class GroupIndex(Protocol):
    """The analysis' union-find of groups (``fxsym.analysis.GroupTable``), read-only.

    A group id from a :class:`Segment` is looked up through its root, :meth:`find`.
    """

    @property
    def units(self) -> Sequence[int]:
        """Per root: how many units the group has."""
        ...

    def find(self, g: int) -> int:
        """The root of group ``g``: the id of the group it was merged into."""
        ...

    def reason(self, g: int) -> str | None:
        """Why group ``g`` is constant (the first boundary it met), or ``None``."""
        ...


@dataclass(frozen=True)
class GroupAnalysis:
    """What :func:`fxsym.analyze` found about a model's groups, as attached to its SymMap.

    ``groups`` are the searchable groups in graph order (``SymGroup.id`` is a root of
    ``table``). ``symbol_dims`` gives, for every symbol the traced graph reached and every
    parameter member, the segments of the tensor dimension it sizes; ``param_members`` says
    which of its keys are parameter members (a parameter used directly in the graph, sliced
    along one dim) rather than symbols. ``producers`` lists, per root of a searchable group,
    the symbols that create the group's values (whose weights rank its entries).
    """

    groups: tuple[SymGroup, ...]
    symbol_dims: Mapping[SymbolKey, Sequence[Segment]]
    param_members: frozenset[SymbolKey]
    table: GroupIndex
    producers: Mapping[int, tuple[SymbolKey, ...]]
    #: the parameter members an op rule made the producer of a dim (the weight of a
    #: functional ``linear``/``conv``/``embedding``/``matmul`` in a module traced into), in
    #: searchable groups or not
    param_producers: frozenset[SymbolKey] = frozenset()
    #: the layout of every tensor value of the traced graph, by node name: a ``TensorLayout``
    #: (see :mod:`fxsym.analysis.layout`; group ids are looked up through ``table``), tuples
    #: and dicts of them for containers, ``None`` for anything else (sizes included): where
    #: each group's entries lie in every tensor, which the value oracle reads to find the ops
    #: that read a group (:func:`fxsym.oracles.check_values`)
    node_layouts: Mapping[str, Any] = field(default_factory=dict)
    #: the depth groups (:class:`DepthGroup`): stacks of blocks proven residual
    depth_groups: tuple[DepthGroup, ...] = ()
