"""The group table: a union-find over groups of tensor-dimension entries.

A group is created for each OUTGOING symbol of a module call (its *producer*), with a count of
*units* (channels, features). Segments of tensor dims refer to a group at any granularity that
is a multiple of its unit count; tying dims that split a group differently (channels against
heads of ``head_dim`` channels) coarsens it to the gcd, so each unit stays whole everywhere.
Ops unify
groups that must keep the same size and order; boundaries make them constant. A group stays
searchable only if no boundary touched it and one of its producers is searchable.

Two refinements serve fused projections (one Linear whose output is cut into q, k, v):

* **Blocks.** :meth:`GroupTable.split` cuts a group's units into consecutive *blocks*, each a
  new group. The split group keeps no entries of its own: every segment that refers to it is
  read as one segment per block (:meth:`GroupTable.resolve`), so all dims stay consistent, and
  the blocks may be tied, fixed or split again independently. A block's name is its
  producer's with ``#i`` appended per split (``qkv.out_features#0``).
* **Same-size classes.** Groups whose numbers of kept units must be equal, while their
  entries are chosen independently (the pieces of ``chunk``, which cuts at equal sizes at run
  time). The groups of a class have equal unit counts (coarsening one coarsens all) and are
  constant together; splitting one splits all alike, block by block.

A group may also be *routed* (:meth:`GroupTable.route`): a router picks its entries by value
(``topk`` over it returns positions that index its members). Permuting its entries is exact;
dropping some changes what the router picks, by design, and the router needs at least ``k``
entries to pick from: the share of its units a resize must keep is recorded with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .layout import Dim, Seg, SizeLayout, TensorLayout


class SplitError(ValueError):
    """A group cannot be cut as asked; the message says why."""


@dataclass
class GroupTable:
    """Union-find with per-root units, constant reasons, producers, blocks and same-size
    classes."""

    parent: list[int] = field(default_factory=list)
    units: list[int] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)
    #: per root: (group_id, module_qualname, symbol_name, searchable) of each producer,
    #: oldest first
    producers: dict[int, list[tuple[int, str, str, bool]]] = field(default_factory=dict)
    #: a split root -> its blocks, in order, each ``(group, units at the split)``
    children: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    #: a block -> (the root it was split from, its position among the blocks)
    blocks: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: same-size classes: group id -> the shared list of the class' group ids
    _same: dict[int, list[int]] = field(default_factory=dict)
    #: per root of a routed group: why (see :meth:`route`)
    routed: dict[int, str] = field(default_factory=dict)
    #: per root: the share of its units every resize must keep (a ``topk`` over it needs k)
    least: dict[int, Fraction] = field(default_factory=dict)
    #: what :meth:`resolve` reads a split group's units as (cleared by a split or a union)
    _blocks: dict[tuple[int, int], tuple[tuple[int, int], ...]] = field(
        default_factory=dict, repr=False, compare=False)

    def new(self, units: int) -> int:
        gid = len(self.parent)
        self.parent.append(gid)
        self.units.append(units)
        return gid

    def find(self, g: int) -> int:
        parent = self.parent
        root = g
        while parent[root] != root:
            root = parent[root]
        while parent[g] != root:
            parent[g], g = root, parent[g]
        return root

    def same_size(self, g: int) -> list[int]:
        """The roots whose unit counts must stay equal to ``g``'s root's, itself first."""
        r = self.find(g)
        members = self._same.get(r)
        if not members:
            return [r]
        return list(dict.fromkeys([r, *map(self.find, members)]))

    def constrain(self, g: int, units: int) -> None:
        """Make ``g``'s unit count divide ``units`` (coarser units: e.g. whole heads, whole
        conv groups). A group coarsened to one unit cannot shrink: it becomes constant."""
        r = self.find(g)
        if r in self.children:  # a stale reference to a split group: stay on the safe side
            self.fix(r, "a split group is tied at another granularity")
            return
        new = math.gcd(self.units[r], units)
        if new == self.units[r]:
            return
        for m in self.same_size(r):
            self.units[m] = math.gcd(self.units[m], new)
        if new == 1:
            self.fix(r, "coarsened to a single unit")

    def union(self, a: int, b: int) -> int:
        """Tie ``a`` and ``b``; the older root stays root. The merged group's unit count is the
        gcd of both (each unit stays a whole number of either group's units)."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return ra
        if ra in self.children or rb in self.children:  # stale: cannot tie blockwise here
            self.fix(ra, "a split group is tied whole")
            self.fix(rb, "a split group is tied whole")
        units = math.gcd(self.units[ra], self.units[rb])
        self.constrain(ra, units)
        self.constrain(rb, units)
        if rb < ra:
            ra, rb = rb, ra
        self.parent[rb] = ra
        self._blocks.clear()
        if rb in self.reasons and ra not in self.reasons:
            self.reasons[ra] = self.reasons[rb]
        self.reasons.pop(rb, None)
        if rb in self.producers:
            self.producers.setdefault(ra, []).extend(self.producers.pop(rb))
            self.producers[ra].sort()
        if ra in self._same or rb in self._same:
            self._merge_same(ra, rb)
        if rb in self.routed:
            self.routed.setdefault(ra, self.routed.pop(rb))
        if rb in self.least:
            self.least[ra] = max(self.least.get(ra, Fraction(0)), self.least.pop(rb))
        return ra

    def route(self, g: int, units: int, why: str) -> None:
        """Record that a router picks ``units`` of ``g``'s current units by value (a ``topk``
        over the group's dim): the group is routed, and every resize keeps at least that
        many (a share of its units, so it survives coarsening)."""
        r = self.find(g)
        if r in self.children:
            self.fix(r, f"{why}, over a group cut into blocks")
            return
        self.routed.setdefault(r, why)
        share = Fraction(units, self.units[r])
        if share > self.least.get(r, Fraction(0)):
            self.least[r] = share

    def min_units(self, g: int) -> int:
        """The fewest units a resize may keep of ``g``'s group (at least one)."""
        r = self.find(g)
        least = self.least
        shares = [least[m] for m in self.same_size(r) if m in least]
        return max(1, math.ceil(max(shares) * self.units[r])) if shares else 1

    def tie_sizes(self, a: int, b: int) -> None:
        """Make ``a`` and ``b`` keep equal numbers of units (their entries stay independent)."""
        self._merge_same(self.find(a), self.find(b))

    def _merge_same(self, a: int, b: int) -> None:
        ca, cb = self._same.get(a), self._same.get(b)
        if ca is not None and ca is cb:
            return
        members = list(dict.fromkeys([*(ca or [a]), *(cb or [b])]))
        for m in members:
            self._same[m] = members
        roots = self.same_size(a)
        if len(roots) < 2:
            return
        units = math.gcd(*(self.units[r] for r in roots))
        for r in roots:
            self.units[r] = units
        reason = next((self.reasons[r] for r in roots if r in self.reasons), None)
        if units == 1 and reason is None:
            reason = "coarsened to a single unit"
        if reason is not None:
            for r in roots:
                self.reasons.setdefault(r, reason)

    def split(self, g: int, pieces: Sequence[int]) -> list[int]:
        """Cut ``g``'s group into consecutive blocks of ``pieces`` units each; returns the
        blocks. Every group of its same-size class is cut alike, and the i-th blocks of them
        form a class. Raises :class:`SplitError` if ``pieces`` do not add up to the group's
        units."""
        r = self.find(g)
        if len(pieces) < 2 or any(p <= 0 for p in pieces) or sum(pieces) != self.units[r]:
            raise SplitError(f"cannot cut a group of {self.units[r]} units into "
                             f"{list(pieces)} units")
        routed = [m for m in self.same_size(r) if m in self.routed]
        cut: list[list[int]] = []
        self._blocks.clear()
        for m in self.same_size(r):
            kids: list[int] = []
            for i, p in enumerate(pieces):
                c = self.new(p)
                self.blocks[c] = (m, i)
                if m in self.reasons:
                    self.reasons[c] = self.reasons[m]
                prods = self.producers.get(m)
                if prods:
                    self.producers[c] = [(c, q, s, ok) for _, q, s, ok in prods]
                kids.append(c)
            self.children[m] = list(zip(kids, pieces))
            self.producers.pop(m, None)
            self._same.pop(m, None)
            cut.append(kids)
        for i in range(len(pieces)):
            for other in cut[1:]:
                self._merge_same(cut[0][i], other[i])
        if routed:  # how many of each block the pick needs is unknown
            self.fix(r, f"{self.routed[routed[0]]}, and the group is cut into blocks")
        return cut[0]

    def fix(self, g: int, reason: str) -> bool:
        """Make ``g``'s group constant (with its blocks and its same-size class); True if it
        was not constant before."""
        changed = False
        for r in self.same_size(g):
            kids = self.children.get(r)
            if kids is not None:
                for c, _ in kids:
                    changed |= self.fix(c, reason)
            elif r not in self.reasons:
                self.reasons[r] = reason
                changed = True
        return changed

    def is_constant(self, g: int) -> bool:
        return self.find(g) in self.reasons

    def reason(self, g: int) -> str | None:
        return self.reasons.get(self.find(g))

    def reword(self, g: int, old: str, new: str) -> None:
        """Give ``g``'s group, its blocks and its same-size class the reason ``new`` where
        :meth:`fix` gave them ``old``."""
        for r in self.same_size(g):
            kids = self.children.get(r)
            if kids is not None:
                for c, _ in kids:
                    self.reword(c, old, new)
            elif self.reasons.get(r) == old:
                self.reasons[r] = new

    def add_producer(self, g: int, qualname: str, symbol: str, searchable: bool) -> None:
        self.producers.setdefault(self.find(g), []).append((g, qualname, symbol, searchable))

    # -- blocks ----------------------------------------------------------------------------
    def block_path(self, g: int) -> str:
        """``#i`` per split that made group id ``g`` a block, outermost first ('' if none)."""
        out = ""
        while g in self.blocks:
            g, i = self.blocks[g]
            out = f"#{i}{out}"
        return out

    def resolve(self, dim: Dim) -> Dim:
        """``dim`` with each segment of a split group read as one segment per block."""
        children = self.children
        if not children:
            return dim
        find = self.find
        for s in dim:
            if s.group is not None and find(s.group) in children:
                break
        else:
            return dim
        out: list[Seg] = []
        self._resolve_into(dim, out)
        return tuple(out)

    def _resolve_into(self, dim: Dim, out: list[Seg]) -> None:
        children, find = self.children, self.find
        for s in dim:
            root = find(s.group) if s.group is not None else None
            if root not in children:
                out.append(s)
                continue
            out.extend(Seg(c, units, s.block) for c, units in self._blocks_of(root, s.units))

    def _blocks_of(self, root: int, units: int) -> tuple[tuple[int, int], ...]:
        """The groups that ``units`` units of split group ``root`` are read as, each with its
        share of them, blocks of blocks included; remembered until a split or a union."""
        key = (root, units)
        found = self._blocks.get(key)
        if found is None:
            kids = self.children[root]
            total = sum(p for _, p in kids)
            out: list[tuple[int, int]] = []
            for c, p in kids:
                share = units * p // total
                r = self.find(c)
                if r in self.children:
                    out.extend(self._blocks_of(r, share))
                else:
                    out.append((c, share))
            found = self._blocks[key] = tuple(out)
        return found

    def resolve_layout(self, layout: Any) -> Any:
        """A layout (see :mod:`fxsym.analysis.layout`) with every dim :meth:`resolve`-d."""
        if not self.children or layout is None:
            return layout
        if isinstance(layout, TensorLayout):
            return TensorLayout(self.resolve(d) for d in layout)
        if isinstance(layout, SizeLayout):
            return layout.with_dims(self.resolve(d) for d in layout)
        if isinstance(layout, tuple) and layout and isinstance(layout[0], Seg):
            return self.resolve(layout)
        if isinstance(layout, (tuple, list)):
            return type(layout)(self.resolve_layout(x) for x in layout)
        if isinstance(layout, dict):
            return {k: self.resolve_layout(v) for k, v in layout.items()}
        return layout
