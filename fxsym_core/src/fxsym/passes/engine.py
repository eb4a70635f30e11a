"""The pattern engine: indexed matching, deterministic overlap resolution, batched rewriting.

One round:

1. **index** — patterns are grouped by the canonical kind of their anchor, and within it by
   the kind their anchor's input must have (:meth:`Pattern.input_filter`), so each graph node
   is offered only the patterns that could end at it (a dictionary look-up for the node, one
   for its input);
2. **match** — every candidate anchor is tried against the patterns offered to it, giving
   a list of matches over the whole graph (in later rounds: over the nodes near a change);
3. **resolve overlaps** — matches are sorted by (size descending, anchor position, pattern
   order) and accepted greedily when they share no node with an accepted one: the largest
   match wins and ties go to the earliest anchor, then to the earliest pattern;
4. **rewrite** — accepted matches are applied in graph order; a binding that pointed at an
   anchor replaced earlier in the round follows its replacement. Dead matched nodes are
   erased.

Rounds repeat until one makes no change (a rewrite may expose a new match), at most
``max_rounds`` times. A new match must contain a node the previous round touched — a node it
inserted, or an input of a node it erased (which lost a user) — and ends at most ``depth``
edges downstream of it (``depth`` = the largest pattern size minus one), so later rounds only
visit those nodes as anchors, not the whole graph. The engine never recompiles: callers
recompile once at the end (:func:`recompile` does it with the collector paused too).

The cyclic garbage collector is paused while the engine runs: matching allocates many
short-lived objects, and on a graph of 100k nodes the collections they trigger would scan the
whole graph again and again (time per node doubled at 100k nodes in
``benchmarks/rewrite_speed.py``). Collection resumes, and catches up, when the run ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from torch import fx

from .ops import Key, OpTable, default_table
from .pattern import Match, Pattern, RewriteContext
from .table import op_table

_CALLS = frozenset({"call_function", "call_method", "call_module"})
_META_KEYS = ("val", "tensor_meta", "example_value")


class _Offer:
    """The patterns anchored at one kind: tried at every such node (``always``), or only when
    positional argument ``i`` has one of the kinds ``by_input[i]`` maps to them."""

    __slots__ = ("always", "by_input")

    def __init__(self) -> None:
        self.always: list[Pattern] = []
        self.by_input: dict[int, dict[Key, list[Pattern]]] = {}


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
        self._offers: dict[Key, _Offer] = {}
        for p in ranked:
            for key in p.anchor_keys(self.table):
                self.index.setdefault(key, []).append(p)
                offer = self._offers.setdefault(key, _Offer())
                condition = p.input_filter(self.table, key)
                if condition is None:
                    offer.always.append(p)
                else:
                    i, kinds = condition
                    by_kind = offer.by_input.setdefault(i, {})
                    for kind in kinds:
                        by_kind.setdefault(kind, []).append(p)
        self.depth = max((p.size for p in self.patterns), default=1) - 1
        self.stats: dict[str, int] = {}

    def run(self, gm: fx.GraphModule) -> int:
        """Rewrite ``gm.graph`` in place; return the number of rewrites."""
        ctx = RewriteContext(gm, self.table)
        total = 0
        self.stats = {}
        anchors: Iterable[fx.Node] | None = None
        from ..tracer.guard import gc_paused  # the tracer room: only once optimize runs

        with gc_paused():
            for _ in range(self.max_rounds):
                changed, touched = self._round(ctx, anchors)
                total += changed
                if not changed:
                    break
                anchors = _downstream(touched, self.depth)
        return total

    def find(self, gm: fx.GraphModule) -> list[Match]:
        """The matches one round would apply (overlaps resolved), without rewriting."""
        return self._accepted(RewriteContext(gm, self.table), None)

    def _offered(self, node: fx.Node, keys: tuple[Key, ...], ctx: RewriteContext) -> list[Pattern]:
        """The patterns worth trying with ``node`` (of kinds ``keys``) as the anchor."""
        found: list[Pattern] = []
        several = len(keys) > 1
        args = node.args
        for key in keys:
            offer = self._offers.get(key)
            if offer is None:
                continue
            found += offer.always
            for i, by_kind in offer.by_input.items():
                if i >= len(args):  # the input may come by keyword: let the pattern decide
                    for pats in by_kind.values():
                        found += pats
                    several = True
                    continue
                arg = args[i]
                if not isinstance(arg, fx.Node):
                    continue
                arg_keys = ctx.keys(arg)
                several = several or len(arg_keys) > 1
                for arg_key in arg_keys:
                    found += by_kind.get(arg_key, ())
        return list(dict.fromkeys(found)) if several else found

    def _accepted(self, ctx: RewriteContext, anchors: Iterable[fx.Node] | None) -> list[Match]:
        """Matches at ``anchors`` (every node when ``None``) with overlaps resolved, in graph
        order."""
        offers = self._offers
        rank = self._rank
        keys_of = ctx.keys
        found: list[tuple[Match, int]] = []
        for node in ctx.graph.nodes if anchors is None else anchors:
            if node.op not in _CALLS:
                continue
            keys = keys_of(node)
            if len(keys) == 1 and keys[0] not in offers:
                continue
            for p in self._offered(node, keys, ctx):
                m = p.match(node, ctx)
                if m is not None:
                    found.append((m, rank[id(p)]))
        if not found:
            return []
        position = {node: i for i, node in enumerate(ctx.graph.nodes)}
        found.sort(key=lambda c: (-len(c[0].nodes), position[c[0].anchor], c[1]))
        claimed: set[fx.Node] = set()
        accepted: list[Match] = []
        for m, _ in found:
            if claimed.isdisjoint(m.nodes):
                claimed.update(m.nodes)
                accepted.append(m)
        accepted.sort(key=lambda m: position[m.anchor])
        return accepted

    def _round(
        self, ctx: RewriteContext, anchors: Iterable[fx.Node] | None
    ) -> tuple[int, list[fx.Node]]:
        ctx.start_round()
        accepted = self._accepted(ctx, anchors)
        replaced: dict[fx.Node, fx.Node] = {}
        graph = ctx.graph
        changes = 0
        touched: list[fx.Node] = []
        erased: set[fx.Node] = set()
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
            if anchor in new.users:  # a rewrite function built ``new`` from the anchor itself
                anchor.replace_all_uses_with(new, delete_user_cb=_not(new))
            else:
                anchor.replace_all_uses_with(new)
            replaced[anchor] = new
            for n in reversed(m.nodes):
                if not n.users:
                    touched += n.all_input_nodes
                    graph.erase_node(n)
                    erased.add(n)
            changes += 1
            self.stats[m.pattern.name] = self.stats.get(m.pattern.name, 0) + 1
        return changes, [n for n in touched if n not in erased] if erased else touched


def _not(node: fx.Node) -> Callable[[fx.Node], bool]:
    """``user is not node`` as a callback."""

    def other(user: fx.Node) -> bool:
        return user is not node

    return other


def _downstream(start: Sequence[fx.Node], depth: int) -> list[fx.Node]:
    """``start`` and every node at most ``depth`` edges downstream of it, each once, in the
    order reached (so rounds are deterministic)."""
    seen: dict[fx.Node, None] = dict.fromkeys(start)
    frontier = list(seen)
    for _ in range(depth):
        nxt = []
        for node in frontier:
            for user in node.users:
                if user not in seen:
                    seen[user] = None
                    nxt.append(user)
        if not nxt:
            break
        frontier = nxt
    return list(seen)


def recompile(gm: fx.GraphModule) -> None:
    """``gm.recompile()`` with the cyclic garbage collector paused.

    torch.fx's code generation allocates several objects per node while the whole graph is
    alive, so the collections it triggers traverse the graph again and again: at 100k nodes
    pausing them saves about a quarter of the recompile (``benchmarks/rewrite_speed.py``).
    """
    from ..tracer.guard import gc_paused

    with gc_paused():
        gm.recompile()


_recompile = recompile  # for ``apply_patterns``, whose parameter ``recompile`` hides it


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
        _recompile(gm)
    return changes

