"""The pattern engine: indexed matching, deterministic overlap resolution, batched rewriting.

One round:

1. **index** — patterns are grouped by the canonical kind of their anchor, so each graph node
   is offered only the patterns that could end at it (one dictionary look-up per node);
2. **match** — every candidate anchor is tried against its patterns (largest first), giving
   a list of matches over the whole graph;
3. **resolve overlaps** — matches are sorted by (size descending, anchor position, pattern
   order) and accepted greedily when they share no node with an accepted one: the largest
   match wins and ties go to the earliest anchor, then to the earliest pattern;
4. **rewrite** — accepted matches are applied in graph order; a binding that pointed at an
   anchor replaced earlier in the round follows its replacement. Dead matched nodes are
   erased.

Rounds repeat until one makes no change (a rewrite may expose a new match), at most
``max_rounds`` times. A new match must contain a node the previous round touched — a node it
inserted, or an input of a node it erased (which lost a user) — and ends at most ``depth``
edges downstream of it (``depth`` = the largest pattern size), so later rounds only offer
those nodes as anchors. The engine never recompiles: callers recompile once at the end.

The cyclic garbage collector is paused while the engine runs: matching allocates many
short-lived objects, and on a graph of 100k nodes the collections they trigger would scan the
whole graph again and again (time per node doubled at 100k nodes in
``benchmarks/rewrite_speed.py``). Collection resumes, and catches up, when the run ends.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence

from torch import fx

from .ops import Key, OpTable, default_table
from .pattern import Match, Pattern, RewriteContext
from .table import op_table

_CALLS = ("call_function", "call_method", "call_module")
_META_KEYS = ("val", "tensor_meta", "example_value")


class PatternEngine:
    """Apply a fixed set of patterns to GraphModules."""

    def __init__(
        self, patterns: Sequence[Pattern], table: OpTable | None = None, max_rounds: int = 8
    ) -> None:
        self.table = table if table is not None else default_table()
        self.max_rounds = max_rounds
        self.patterns = list(patterns)
        order = {id(p): i for i, p in enumerate(self.patterns)}
        ranked = sorted(self.patterns, key=lambda p: (-p.size, p.priority, order[id(p)]))
        self._rank = {id(p): i for i, p in enumerate(ranked)}
        self.index: dict[Key, list[Pattern]] = {}
        for p in ranked:
            for key in p.anchor_keys(self.table):
                self.index.setdefault(key, []).append(p)
        self.depth = max((p.size for p in self.patterns), default=0)
        self.stats: dict[str, int] = {}

    def run(self, gm: fx.GraphModule) -> int:
        """Rewrite ``gm.graph`` in place; return the number of rewrites."""
        ctx = RewriteContext(gm, self.table)
        total = 0
        self.stats = {}
        candidates: set[fx.Node] | None = None
        with _gc_paused():
            for _ in range(self.max_rounds):
                changed, touched = self._round(ctx, candidates)
                total += changed
                if not changed:
                    break
                candidates = _downstream(touched, self.depth)
        return total

    def find(self, gm: fx.GraphModule) -> list[Match]:
        """The matches one round would apply (overlaps resolved), without rewriting."""
        return self._accepted(RewriteContext(gm, self.table), None)[0]

    def _accepted(
        self, ctx: RewriteContext, only: set[fx.Node] | None
    ) -> tuple[list[Match], dict[fx.Node, int]]:
        index = self.index
        candidates: list[tuple[int, int, int, Match]] = []
        position: dict[fx.Node, int] = {}
        keys_of = ctx.keys
        for pos, node in enumerate(ctx.graph.nodes):
            position[node] = pos
            if node.op not in _CALLS or (only is not None and node not in only):
                continue
            keys = keys_of(node)
            if len(keys) == 1:
                pats = index.get(keys[0])
                if not pats:
                    continue
            else:
                pats = _merge(index, keys, self._rank)
                if not pats:
                    continue
            for p in pats:
                m = p.match(node, ctx)
                if m is not None:
                    candidates.append((-len(m.nodes), pos, self._rank[id(p)], m))
        if not candidates:
            return [], position
        candidates.sort(key=lambda c: c[:3])
        claimed: set[fx.Node] = set()
        accepted: list[Match] = []
        for _, _, _, m in candidates:
            if claimed.isdisjoint(m.nodes):
                claimed.update(m.nodes)
                accepted.append(m)
        accepted.sort(key=lambda m: position[m.anchor])
        return accepted, position

    def _round(
        self, ctx: RewriteContext, only: set[fx.Node] | None
    ) -> tuple[int, list[fx.Node]]:
        ctx.start_round()
        accepted, _ = self._accepted(ctx, only)
        replaced: dict[fx.Node, fx.Node] = {}
        graph = ctx.graph
        changes = 0
        touched: list[fx.Node] = []
        for m in accepted:
            m.resolve(replaced)
            anchor = m.anchor
            marker = anchor.prev
            with graph.inserting_before(anchor):
                new = m.pattern.rewrite(m, ctx)
            if new is None or new is anchor:
                continue
            inserted = marker.next
            while inserted is not anchor:
                touched.append(inserted)
                inserted = inserted.next
            touched.append(new)
            for k in _META_KEYS:
                if k in anchor.meta and k not in new.meta:
                    new.meta[k] = anchor.meta[k]
            anchor.replace_all_uses_with(new, delete_user_cb=lambda user, new=new: user is not new)
            replaced[anchor] = new
            for n in reversed(m.nodes):
                if not n.users:
                    touched.extend(n.all_input_nodes)
                    graph.erase_node(n)
            changes += 1
            self.stats[m.pattern.name] = self.stats.get(m.pattern.name, 0) + 1
        return changes, touched


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _downstream(start: Sequence[fx.Node], depth: int) -> set[fx.Node]:
    """``start`` and every node at most ``depth`` edges downstream of it."""
    seen: set[fx.Node] = set(start)
    frontier = list(seen)
    for _ in range(depth):
        nxt = []
        for node in frontier:
            for user in node.users:
                if user not in seen:
                    seen.add(user)
                    nxt.append(user)
        if not nxt:
            break
        frontier = nxt
    return seen


def _merge(
    index: dict[Key, list[Pattern]], keys: Sequence[Key], rank: dict[int, int]
) -> list[Pattern]:
    """Patterns anchored at any of ``keys`` (a module's class chain), in rank order."""
    found = {id(p): p for k in keys for p in index.get(k, ())}
    return sorted(found.values(), key=lambda p: rank[id(p)])


def apply_patterns(
    gm: fx.GraphModule,
    patterns: Sequence[Pattern],
    *,
    table: OpTable | None = None,
    recompile: bool = True,
) -> int:
    """Apply ``patterns`` to ``gm`` in place (then recompile once); return the rewrite count.

    ``table`` defaults to the built-in aliases plus everything the loaded plugins contribute.
    """
    if table is None:
        table = op_table()
    changes = PatternEngine(patterns, table).run(gm)
    if changes and recompile:
        gm.recompile()
    return changes
