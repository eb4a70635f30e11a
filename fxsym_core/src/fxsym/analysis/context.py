"""What an op rule sees: :class:`OpContext`.

An op rule is ``rule(ctx) -> Layout``: it reads the layouts of the node's inputs, ties groups
that must change together (:meth:`OpContext.unify`), ends or fixes others, and returns the
layout of the node's value. A rule that cannot prove a mapping calls
:meth:`OpContext.unsupported`; the node then becomes a boundary (every group it touches
becomes constant) and the reason goes to the trace report. Never guess.

Besides its layout, a value may hold *positions*: its entries are indices into a dim (the
expert ids a router's ``topk`` returns index the experts). A rule that maps them — indexing a
tensor whose dim it ties to theirs, ``one_hot`` over it, passing them on unchanged — reads
them with :meth:`OpContext.take_positions` and gives its result positions with
:meth:`OpContext.give_positions`; every other use pins the dim they index (the analyzer
checks each node's inputs after its rule ran), since a resize would leave them pointing
elsewhere.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, NoReturn, Protocol

import torch
import torch.fx

from .groups import GroupTable
from .input_sizes import FIXED_DIM
from .layout import Dim, Layout, Seg, TensorLayout, dim_size, fixed_dim, fixed_layout
from .options import picked_blocks_kept

_NO_DEFAULT = object()


class AnalysisState(Protocol):
    """What an :class:`OpContext` reads and writes of the analyzer running it
    (:class:`fxsym.analysis.analyzer.Analyzer`, which imports this module)."""

    table: GroupTable
    env: dict[torch.fx.Node, Layout]
    #: per node whose values are positions: the dim they index (for a tuple value, a dict
    #: from item index or attribute name to that item's dim)
    positions: dict[torch.fx.Node, Any]
    #: nodes taking their alternative mapping in this run, and the offers made so far
    alternatives: frozenset[str]
    offers: list[tuple[str, Dim]]
    #: the groups of ints read from module attributes (:class:`~fxsym.analysis.AttributeSize`)
    attribute_groups: set[int]
    #: ``(node, group, size)`` where :meth:`OpContext.unify` pinned a group that met a dim of
    #: fixed size (explained by :mod:`fxsym.analysis.input_sizes`)
    fixed_meets: list[tuple[torch.fx.Node, int, int]]

    def fix(self, layout: Any, reason: str, node: torch.fx.Node | None = None, *,
            sizes_no_tensor: bool = False, kind: str = "boundary") -> bool: ...

    def produce_from_parameter(self, dim: Dim, source: torch.fx.Node,
                               node: torch.fx.Node) -> bool: ...


def _aligned_cut(start: int, length: int, run: int, per: int) -> tuple[int, int] | None:
    """Where a segment of ``length`` entries, laid at ``start`` in a dim cut in runs of
    ``run`` entries, in units of ``per`` entries of its group, can change by whole runs: the
    entries to keep constant at its head and at its tail, so that the free part between them
    starts and ends both at a run boundary and at a unit boundary (``None``: no free part)."""
    bounds = [p for p in range(0, length + 1, per) if (start + p) % run == 0]
    if len(bounds) < 2:
        return None
    return bounds[0], length - bounds[-1]


def _holds_copies(table: GroupTable, dim: Dim) -> bool:
    """Whether ``dim`` holds one group in several segments."""
    roots = [table.find(s.group) for s in dim if s.group is not None]
    return len(set(roots)) < len(roots)


def _bounds(dim: Dim) -> set[int]:
    return set(itertools.accumulate(s.length for s in dim))


class Unsupported(Exception):
    """Raised by an op rule that cannot prove how its node maps dimensions."""


class OpContext:
    """The node under analysis, its input layouts and the group table."""

    def __init__(self, analyzer: AnalysisState, node: torch.fx.Node) -> None:
        self.analyzer = analyzer
        self.node = node
        self.table = analyzer.table
        #: the inputs whose positions this rule mapped, and the positions of its result
        self.positions_taken: set[torch.fx.Node] = set()
        self.positions_given: Any = None

    # -- reading ---------------------------------------------------------------------------
    @property
    def value(self) -> Any:
        """The node's own value (a meta tensor for tensor ops)."""
        return self.node.meta.get("val")

    def arg(self, index: int, name: str | None = None, default: Any = _NO_DEFAULT) -> Any:
        """Positional argument ``index`` or keyword ``name`` of the node (a Node or a value)."""
        if index < len(self.node.args):
            return self.node.args[index]
        if name is not None and name in self.node.kwargs:
            return self.node.kwargs[name]
        if default is _NO_DEFAULT:
            raise Unsupported(f"argument {name or index} not found")
        return default

    def val(self, a: Any) -> Any:
        """The trace-time value of an argument (Nodes replaced by their values)."""
        return torch.fx.node.map_aggregate(
            a, lambda x: x.meta.get("val") if isinstance(x, torch.fx.Node) else x
        )

    def layout(self, a: Any) -> Layout:
        """The layout of an argument (``None`` for a non-tensor)."""
        if isinstance(a, torch.fx.Node):  # blocks of groups split since: see GroupTable
            return self.table.resolve_layout(self.analyzer.env.get(a))
        if isinstance(a, (tuple, list)):
            return tuple(self.layout(x) for x in a)
        return None

    def tensor_layout(self, a: Any) -> TensorLayout:
        """The layout of an argument that must be a tensor."""
        lay = self.layout(a)
        if not isinstance(lay, TensorLayout):
            raise Unsupported(f"expected a tensor for {getattr(a, 'name', a)!r}")
        return lay

    def shape(self, a: Any) -> tuple[int, ...]:
        v = a.meta.get("val") if isinstance(a, torch.fx.Node) else self.val(a)
        if not isinstance(v, torch.Tensor):
            raise Unsupported(f"no shape known for {getattr(a, 'name', a)!r}")
        return tuple(v.shape)

    def out_shape(self) -> tuple[int, ...]:
        value = self.node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            raise Unsupported("the node's value is not a tensor")
        return tuple(value.shape)

    # -- writing ---------------------------------------------------------------------------
    def fixed(self, value: Any = _NO_DEFAULT) -> Layout:
        """A fully fixed layout for ``value`` (default: the node's value)."""
        return fixed_layout(self.value if value is _NO_DEFAULT else value)

    def fix(self, layout: Any, reason: str) -> bool:
        """Make every group in ``layout`` (a layout or a Dim) constant; whether that changed
        a group."""
        return self.analyzer.fix(layout, reason, self.node)

    def unify(self, *dims: Dim) -> Dim:
        """Tie dims that must change together, entry by entry; returns the tied dim.

        Dims must have the same size. Where their segment structures differ (a concat against
        a plain dim) or a group meets a fixed segment, the groups involved become constant.
        """
        dims = tuple(d for d in dims if d is not None)
        if not dims:
            raise Unsupported("nothing to unify")
        first = dims[0]
        if len(dims) == 1:
            return first
        size = dim_size(first)
        if any(dim_size(d) != size for d in dims):
            raise Unsupported("dims of different sizes")
        lengths = [s.length for s in first]
        if any([s.length for s in d] != lengths for d in dims):
            aligned = self._aligned_to_copies(dims)
            if aligned is None:
                for d in dims:
                    self.fix(d, "dimensions with different group structure meet")
                return fixed_dim(size)
            dims = aligned
        out: list[Any] = []
        for segs in zip(*dims):
            groups = [s.group for s in segs if s.group is not None]
            if not groups:
                out.append(segs[0])
                continue
            if len(groups) < len(segs):
                for g in groups:
                    if self.fix((Seg(g, segs[0].units, segs[0].block),), FIXED_DIM):
                        self.analyzer.fixed_meets.append((self.node, g, size))
            for seg in segs:  # a unit of the tied group must be whole in every segment
                if seg.group is not None:
                    self.table.constrain(seg.group, seg.units)
            root = groups[0]
            for g in groups[1:]:
                root = self.table.union(root, g)
            out.append(next(s for s in segs if s.group is not None))
        return tuple(out)

    def _aligned_to_copies(self, dims: tuple[Dim, ...]) -> tuple[Dim, ...] | None:
        """Where one of ``dims`` holds a group several times (a group norm that keeps its
        norm groups, :meth:`runs_alike`; heads merged under fixed outer dims), the others cut
        at its segment boundaries (:meth:`GroupTable.split`: every dim holding a cut group
        sees its blocks; fixed entries are cut in place), so they tie segment by segment: a
        guard comparing a module attribute with a norm's channels ties the attribute block by
        block. ``None`` where no dim holds a copy, or a cut falls inside a unit."""
        table = self.table
        dims = tuple(table.resolve(d) for d in dims)
        if not any(_holds_copies(table, d) for d in dims):
            return None
        for _ in range(8):
            bounds = set().union(*(_bounds(d) for d in dims))
            if all(_bounds(d) == bounds for d in dims):
                return dims
            out: list[Dim] = []
            for d in dims:
                cut: list[Seg] = []
                offset = 0
                for seg in d:
                    inside = sorted(b - offset for b in bounds if offset < b < offset + seg.length)
                    offset += seg.length
                    if not inside:
                        cut.append(seg)
                    elif seg.group is None:
                        edges = [0, *inside, seg.length]
                        cut.extend(Seg(None, hi - lo) for lo, hi in itertools.pairwise(edges))
                    else:
                        root = table.find(seg.group)
                        per = seg.length // table.units[root]
                        if any(b % per for b in inside):
                            return None
                        if root in table.children:  # cut in this pass: read next pass
                            cut.append(seg)
                            continue
                        edges = [0, *(b // per for b in inside), table.units[root]]
                        try:
                            table.split(root, [hi - lo for lo, hi in itertools.pairwise(edges)])
                        except ValueError:
                            return None
                        cut.append(seg)
                out.append(table.resolve(tuple(cut)))
            dims = tuple(out)
        return None

    def runs_alike(self, dim: Dim, runs: int, what: str) -> bool:
        """Let ``dim`` change only alike inside each of its ``runs`` equal runs of
        consecutive entries (a group norm that keeps its number of norm groups: every norm
        group must lose as many channels).

        Each group's segments are cut into blocks, each inside one run
        (:meth:`GroupTable.split`), and the blocks are tied entry by entry: a unit of the
        group is then one entry at the same place in every block, so every block, and every
        run, keeps the same share of it. The groups of different segments (a concatenation)
        keep as many units as each other (a same-size class), so a run holding blocks of
        several groups keeps the same share of each. Entries of fixed size, a constant group
        or a unit longer than a block pin the dim: its runs could not shrink alike. Returns
        whether the dim could be laid out so (else it is pinned, with a reason naming
        ``what``)."""
        size = dim_size(dim)
        if runs <= 0 or size % runs:
            self.fix(dim, f"{what}: {size} entries do not make {runs} equal groups")
            return False
        if runs == 1:
            return True
        run = size // runs
        table = self.table
        dim = table.resolve(dim)
        if any(s.group is None or table.is_constant(s.group) for s in dim):
            self.fix(dim, f"{what} keeps its {runs} groups, so each must lose as many "
                          "entries, and some of its entries cannot change")
            return False
        per_block: dict[int, int] = {}  # per root: its units in one block
        offset = 0
        for seg in dim:
            root = table.find(seg.group)  # type: ignore[arg-type]
            per = seg.length // table.units[root]
            block = math.gcd(run, offset % run, seg.length)
            offset += seg.length
            if block % per:
                self.fix(dim, f"{what} keeps its {runs} groups of {run} entries, and a unit of "
                              f"{per} entries would have to lose some")
                return False
            per_block[root] = math.gcd(per_block.get(root, 0), block // per)
        units = math.gcd(*per_block.values())  # the groups will keep as many units
        for root in per_block:
            if root not in table.children and table.units[root] > units:
                try:
                    table.split(root, [units] * (table.units[root] // units))
                except ValueError as exc:
                    table.fix(root, f"{what} keeps its {runs} groups: {exc}")
                    continue
            blocks = [c for c, _ in table.children.get(root, [(root, units)])]
            for b in blocks[1:]:
                table.union(blocks[0], b)
        roots = list(dict.fromkeys(table.find(s.group) for s in table.resolve(dim)
                                   if s.group is not None))
        for other in roots[1:]:
            table.tie_sizes(roots[0], other)
        for root in roots:
            if table.units[root] == 1:
                table.fix(root, f"{what} keeps its {runs} groups, and one of its entries "
                                "per group cannot shrink alike")
        return True

    def whole_units(self, dim: Dim, units: int, what: str) -> bool:
        """Let ``dim`` change only ``units`` equal runs of consecutive entries at a time (the
        groups of a grouped convolution, of a group norm): every group is coarsened so that
        each of its units is whole runs. Where a run straddles two segments (a concatenation
        whose parts are not whole runs), the entries of each group inside that run are cut
        off as a constant block (:meth:`GroupTable.split`): the straddling run is always kept
        whole, and every other run stays where a resize puts it, since the free blocks
        around it change by whole runs. Where the run's boundary falls inside a unit of the
        group (a branch of 64 channels whose own norm groups are 8, under norm groups of 12),
        the constant block reaches the nearest position that is a boundary of both (48): its
        free block starts and ends on both. A group with no such free block is pinned.
        Returns whether the dim could be cut in runs (else it is pinned, with a reason naming
        ``what``)."""
        size = dim_size(dim)
        if units <= 0 or size % units:
            self.fix(dim, f"{what}: {size} entries do not make {units} equal groups")
            return False
        run = size // units
        table = self.table
        why = f"{what}: a group of {run} entries straddles concatenated inputs"
        while True:
            dim = table.resolve(dim)
            offset, todo = 0, None
            for seg in dim:
                head, tail = -offset % run, (offset + seg.length) % run
                offset += seg.length
                if (head or tail) and seg.group is not None and not table.is_constant(
                        seg.group):
                    todo = seg, head, tail
                    break
            if todo is None:
                break
            seg, head, tail = todo
            root = table.find(seg.group)  # type: ignore[arg-type]
            per = seg.length // table.units[root]
            cut = _aligned_cut(offset - seg.length, seg.length, run, per)
            if cut is None:
                table.fix(root, why)
                continue
            head, tail = cut
            parts = [p // per for p in (head, seg.length - head - tail, tail) if p]
            try:
                blocks = table.split(root, parts)
            except ValueError:
                table.fix(root, why)
                continue
            if head:
                table.fix(blocks[0], why)
            if tail:
                table.fix(blocks[-1], why)
        for seg in dim:
            if seg.group is not None and not table.is_constant(seg.group):
                table.constrain(seg.group, seg.length // run)
        return True

    def produce(self, dim: Dim, source: Any) -> bool:
        """Declare ``dim`` of the tensor ``source`` (an argument of the node) a *producer*.

        For an op whose output entries along one dim are made one each by the entries of a
        parameter's dim (the rows of ``F.linear``'s weight, the output channels of
        ``F.conv2d``'s, the columns of ``F.embedding``'s), possibly after arithmetic on the
        parameter that keeps those entries independent (``self.weight * gain``, weight
        standardisation per output channel). The parameter nearest ``source`` among its graph
        ancestors that has a dim in ``dim``'s group becomes a searchable producer of that
        group, so a group can start there as it does at a module's OUTGOING symbol. Returns
        whether a producer was declared: not for a fixed or concatenated ``dim``, nor where no
        parameter read with ``get_attr`` sizes it.
        """
        if not isinstance(source, torch.fx.Node):
            return False
        return self.analyzer.produce_from_parameter(dim, source, self.node)

    # -- positions ------------------------------------------------------------------------
    def positions(self, a: Any) -> Dim | None:
        """The dim whose positions the values of argument ``a`` are, or ``None``."""
        found = self.analyzer.positions.get(a) if isinstance(a, torch.fx.Node) else None
        return self.table.resolve(found) if isinstance(found, tuple) else None

    def take_positions(self, a: Any) -> Dim | None:
        """:meth:`positions`, recording that this rule maps them (see the module docstring)."""
        found = self.positions(a)
        if found is not None:
            self.positions_taken.add(a)
        return found

    def give_positions(self, dim: Dim, item: int | None = None) -> None:
        """The node's value holds positions along ``dim`` (``item``: only that item of a
        tuple value, also read as its ``indices`` attribute)."""
        if item is None:
            self.positions_given = dim
        else:
            self.positions_given = {item: dim, "indices": dim}

    def pick_by_value(self, dim: Dim, k: int, why: str) -> bool:
        """Say that the node picks ``k`` entries of ``dim`` by their values and returns their
        positions (``topk``): ``dim``'s group is *routed* (see
        :meth:`GroupTable.route`) and keeps at least ``k`` units. Returns whether ``dim`` is
        one elastic group of single entries (anything else is pinned with ``why``).

        A dim of equal copies of one group (blocks that each keep the same positions, in an
        analysis keeping the blocks of picked groups:
        :func:`~fxsym.analysis.options.picked_blocks_kept`) is picked from too: every copy
        keeps at least ``k / copies`` units, so the dim keeps at least ``k`` entries."""
        copies = len(dim)
        if copies > 1 and picked_blocks_kept() and dim[0].group is not None and all(
                s.group is not None and self.table.find(s.group) == self.table.find(
                    dim[0].group) and s == Seg(s.group, dim[0].units, dim[0].block)
                for s in dim):
            k, dim = -(-k // copies), dim[:1]
        if len(dim) != 1 or dim[0].group is None or dim[0].block != 1 or (
                k > dim[0].units):
            self.fix(dim, why)
            return False
        if self.table.is_constant(dim[0].group):
            return False
        units = self.table.units[self.table.find(dim[0].group)]
        self.table.route(dim[0].group, -(-k * units // dim[0].units), why)
        return True

    # -- alternatives ----------------------------------------------------------------------
    @property
    def alternative(self) -> bool:
        """Whether this node takes its alternative mapping in this run (see
        :meth:`offer_alternative`)."""
        return self.node.name in self.analyzer.alternatives

    def offer_alternative(self, dim: Dim) -> None:
        """Say that the rule chose one of two sound mappings of this node, the one that keeps
        ``dim``'s groups (heads, where a split into ``(heads, 3, head_dim)`` could instead keep
        ``head_dim``). If every group of ``dim`` ends constant, the analysis runs again with
        :attr:`alternative` true for this node and keeps the run that leaves more symbols in
        searchable groups."""
        if not self.alternative:
            self.analyzer.offers.append((self.node.name, dim))

    def unsupported(self, reason: str) -> NoReturn:
        raise Unsupported(reason)
