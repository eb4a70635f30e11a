"""The group table: a union-find over groups of tensor-dimension entries.

A group is created for each OUTGOING symbol of a module call (its *producer*), with a count of
*units* (channels, features). Segments of tensor dims refer to a group at any granularity that
is a multiple of its unit count; tying dims that split a group differently (channels against
heads of ``head_dim`` channels) coarsens it to the gcd, so each unit stays whole everywhere.
Ops unify
groups that must keep the same size and order; boundaries make them constant. A group stays
searchable only if no boundary touched it and one of its producers is searchable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class GroupTable:
    """Union-find with per-root units, constant reasons and producers."""

    parent: list[int] = field(default_factory=list)
    units: list[int] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)
    #: per root: (group_id, module_qualname, symbol_name, searchable) of each producer,
    #: oldest first
    producers: dict[int, list[tuple[int, str, str, bool]]] = field(default_factory=dict)

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

    def constrain(self, g: int, units: int) -> None:
        """Make ``g``'s unit count divide ``units`` (coarser units: e.g. whole heads, whole
        conv groups). A group coarsened to one unit cannot shrink: it becomes constant."""
        r = self.find(g)
        new = math.gcd(self.units[r], units)
        if new != self.units[r]:
            self.units[r] = new
            if new == 1:
                self.fix(r, "coarsened to a single unit")

    def union(self, a: int, b: int) -> int:
        """Tie ``a`` and ``b``; the older root stays root. The merged group's unit count is the
        gcd of both (each unit stays a whole number of either group's units)."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return ra
        units = math.gcd(self.units[ra], self.units[rb])
        self.constrain(ra, units)
        self.constrain(rb, units)
        if rb < ra:
            ra, rb = rb, ra
        self.parent[rb] = ra
        if rb in self.reasons and ra not in self.reasons:
            self.reasons[ra] = self.reasons[rb]
        self.reasons.pop(rb, None)
        if rb in self.producers:
            self.producers.setdefault(ra, []).extend(self.producers.pop(rb))
            self.producers[ra].sort()
        return ra

    def fix(self, g: int, reason: str) -> bool:
        """Make ``g``'s group constant; True if it was not constant before."""
        r = self.find(g)
        if r in self.reasons:
            return False
        self.reasons[r] = reason
        return True

    def is_constant(self, g: int) -> bool:
        return self.find(g) in self.reasons

    def reason(self, g: int) -> str | None:
        return self.reasons.get(self.find(g))

    def add_producer(self, g: int, qualname: str, symbol: str, searchable: bool) -> None:
        self.producers.setdefault(self.find(g), []).append((g, qualname, symbol, searchable))
