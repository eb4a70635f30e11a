"""Subgraph patterns: a small Python function that computes what to look for.

``SubgraphPattern("silu", lambda x: x * torch.sigmoid(x), lambda x: F.silu(x))`` traces the
pattern (and the replacement) once, on first use, with :func:`torch.fx.symbolic_trace`, and
caches the graphs. The pattern's returned value is the anchor; matching walks back from a
candidate anchor through the pattern graph:

* a pattern input (placeholder) binds to any value; a second use must bind the same value;
* an operation must have one of the node's kinds (aliases resolved, so ``x * y``,
  ``torch.mul(x, y)`` and ``x.mul(y)`` all match) and matching arguments; the two arguments
  of ``+`` and ``*`` may come in either order;
* literal arguments compare equal (floats within a relative 1e-6); keyword arguments the
  pattern does not name must be ``None`` in the graph;
* interior nodes must not be used outside the match.

Several variants (a list of functions) may share one replacement; each variant is indexed
by its own anchor kind. The replacement is either a function with the same parameters
(``replacement=``, traced once and inlined, inputs bound by position) or
``rewrite=fn`` with ``fn(match, ctx) -> Node | None`` (inputs bound by parameter name).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import fx
from torch.fx.node import Target

from .ops import COMMUTATIVE, Key, OpTable, literal_equal
from .pattern import Match, Pattern, RewriteContext, walk_args

MatchPredicate = Callable[[Match, RewriteContext], bool]


@dataclass
class _Variant:
    graph: fx.Graph
    inputs: tuple[fx.Node, ...]
    anchor: fx.Node
    size: int
    positions: dict[fx.Node, int]
    names: tuple[tuple[str, str], ...]  # per input: (parameter name, "#i")


class _Slot:
    """In an inlined replacement's arguments: the value at ``index`` (inputs first, then the
    nodes created so far)."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


@dataclass
class _Inline:
    """A traced replacement ready to inline: its operations in order, arguments as templates
    (pattern nodes replaced by :class:`_Slot`); ``flat`` says an operation's arguments are a
    tuple of slots and literals and its keyword arguments hold no slot."""

    n_inputs: int
    ops: list[tuple[str, Target, Any, dict[str, Any], str, dict[str, Any], bool]]
    result: Any


@dataclass
class _Keyed:
    """A pattern's variants prepared for one op table."""

    table: OpTable
    by_anchor: dict[Key, list[_Variant]]
    pkeys: dict[fx.Node, Key]
    probes: dict[int, tuple[tuple[int, Key], ...]]  # id(variant) -> (arg index, kind) checks


class _State:
    __slots__ = ("bind", "pkeys", "pmap", "used")

    def __init__(self, pkeys: dict[fx.Node, Key]) -> None:
        self.pkeys = pkeys
        self.pmap: dict[fx.Node, fx.Node] = {}
        self.used: set[fx.Node] = set()
        self.bind: dict[fx.Node, Any] = {}

    def save(self) -> tuple[dict[fx.Node, fx.Node], set[fx.Node], dict[fx.Node, Any]]:
        return dict(self.pmap), set(self.used), dict(self.bind)

    def load(self, saved: tuple[dict[fx.Node, fx.Node], set[fx.Node], dict[fx.Node, Any]]) -> None:
        self.pmap, self.used, self.bind = dict(saved[0]), set(saved[1]), dict(saved[2])


def _trace(fn: Callable[..., Any]) -> fx.Graph:
    return fx.symbolic_trace(fn).graph


class SubgraphPattern(Pattern):
    """A pattern written as Python function(s), traced once and cached."""

    def __init__(
        self,
        name: str,
        pattern: Callable[..., Any] | Sequence[Callable[..., Any]],
        replacement: Callable[..., Any] | None = None,
        *,
        rewrite: Callable[[Match, RewriteContext], fx.Node | None] | None = None,
        where: MatchPredicate | None = None,
        stage: str = "patterns",
        priority: int = 0,
        description: str = "",
    ) -> None:
        self.name = name
        self._fns = tuple(pattern) if isinstance(pattern, (list, tuple)) else (pattern,)
        if (replacement is None) == (rewrite is None):
            raise ValueError(f"pattern {name!r}: give either a replacement or a rewrite function")
        self._replacement = replacement
        self._rewrite_fn = rewrite
        self.where = where
        self.stage = stage
        self.priority = priority
        self.description = description
        self._variants: list[_Variant] | None = None
        self._repl: _Inline | None = None
        self._keyed: _Keyed | None = None

    # -- compilation (once) -----------------------------------------------------------------
    @property
    def variants(self) -> list[_Variant]:
        if self._variants is None:
            variants = []
            for fn in self._fns:
                g = _trace(fn)
                inputs = tuple(n for n in g.nodes if n.op == "placeholder")
                out = next(n for n in g.nodes if n.op == "output")
                anchor = out.args[0]
                if not isinstance(anchor, fx.Node) or anchor.op == "placeholder":
                    raise ValueError(
                        f"pattern {self.name!r}: the pattern function must return one value "
                        "computed by an operation"
                    )
                size = sum(
                    1 for n in g.nodes if n.op in ("call_function", "call_method", "call_module")
                )
                positions = {n: i for i, n in enumerate(g.nodes)}
                names = tuple((str(p.target), f"#{i}") for i, p in enumerate(inputs))
                variants.append(_Variant(g, inputs, anchor, size, positions, names))
            self._variants = variants
        return self._variants

    @property
    def size(self) -> int:
        return max(v.size for v in self.variants)

    def _prepared(self, table: OpTable) -> _Keyed:
        if self._keyed is None or self._keyed.table is not table:
            by_anchor: dict[Key, list[_Variant]] = {}
            pkeys: dict[fx.Node, Key] = {}
            probes: dict[int, tuple[tuple[int, Key], ...]] = {}
            for v in sorted(self.variants, key=lambda v: -v.size):
                for n in v.graph.nodes:
                    if n.op in ("call_function", "call_method", "call_module"):
                        pkeys[n] = _pkey(n, table)
                key = pkeys[v.anchor]
                by_anchor.setdefault(key, []).append(v)
                # cheap first check: the kinds of the anchor's operation arguments
                probes[id(v)] = (
                    ()
                    if key in COMMUTATIVE
                    else tuple(
                        (i, pkeys[a])
                        for i, a in enumerate(v.anchor.args)
                        if isinstance(a, fx.Node) and a in pkeys
                    )
                )
            self._keyed = _Keyed(table, by_anchor, pkeys, probes)
        return self._keyed

    def anchor_keys(self, table: OpTable) -> tuple[Key, ...]:
        return tuple(self._prepared(table).by_anchor)

    def input_filter(self, table: OpTable, key: Key) -> tuple[int, frozenset[Key]] | None:
        prepared = self._prepared(table)
        firsts: list[tuple[int, Key]] = []  # each variant's first argument probe
        for v in prepared.by_anchor.get(key, ()):
            probes = prepared.probes[id(v)]
            if not probes:
                return None
            firsts.append(probes[0])
        if not firsts or len({i for i, _ in firsts}) != 1:
            return None
        return firsts[0][0], frozenset(kind for _, kind in firsts)

    def describe_anchor(self) -> str:
        names = sorted({_target_label(v.anchor) for v in self.variants})
        return f"{'|'.join(names)} ({len(self.variants)} variant(s), {self.size} nodes)"

    # -- matching ---------------------------------------------------------------------------
    def match(self, node: fx.Node, ctx: RewriteContext) -> Match | None:
        prepared = self._prepared(ctx.table)
        for key in ctx.keys(node):
            for variant in prepared.by_anchor.get(key, ()):
                m = self._match_variant(variant, node, ctx, prepared)
                if m is not None:
                    return m
        return None

    def _match_variant(
        self, v: _Variant, node: fx.Node, ctx: RewriteContext, prepared: _Keyed
    ) -> Match | None:
        args = node.args
        for i, key in prepared.probes[id(v)]:
            arg = args[i] if i < len(args) else None
            if not isinstance(arg, fx.Node) or key not in ctx.keys(arg):
                return None
        st = _State(prepared.pkeys)
        if not _match_value(v.anchor, node, st, ctx):
            return None
        matched = st.used
        for gn in st.pmap.values():
            if gn is not node and any(u not in matched for u in gn.users):
                return None
        for value in st.bind.values():
            if isinstance(value, fx.Node) and value in matched:
                return None
        positions = v.positions
        ordered = tuple(
            gn for _, gn in sorted(st.pmap.items(), key=lambda item: positions[item[0]])
        )
        bindings: dict[str, Any] = {"#n": len(v.inputs)}
        for p, (name, index) in zip(v.inputs, v.names):
            bindings[name] = bindings[index] = st.bind.get(p)
        m = Match(self, node, ordered, bindings)
        if self.where is not None and not self.where(m, ctx):
            return None
        return m

    # -- rewriting --------------------------------------------------------------------------
    def rewrite(self, match: Match, ctx: RewriteContext) -> fx.Node | None:
        if self._rewrite_fn is not None:
            return self._rewrite_fn(match, ctx)
        inline = self._inline()
        bindings = match.bindings
        if bindings["#n"] != inline.n_inputs:
            raise ValueError(
                f"pattern {self.name!r}: the replacement takes {inline.n_inputs} inputs, "
                f"the pattern binds {bindings['#n']}"
            )
        env: list[Any] = [bindings[f"#{i}"] for i in range(inline.n_inputs)]
        create = ctx.graph.create_node
        for op, target, args, kwargs, name, meta, flat in inline.ops:
            if flat:
                args = tuple(env[a.index] if type(a) is _Slot else a for a in args)
            else:
                args, kwargs = _fill(args, env), _fill(kwargs, env)
            node = create(op, target, args, kwargs, name)
            if meta:
                node.meta = copy.copy(meta)
            env.append(node)
        result = _fill(inline.result, env)
        return result if isinstance(result, fx.Node) else None

    def _inline(self) -> _Inline:
        """The replacement function, traced once and prepared for inlining."""
        if self._repl is None:
            assert self._replacement is not None
            graph = _trace(self._replacement)
            slots: dict[fx.Node, _Slot] = {}

            def slot(value: Any) -> Any:
                return slots[value] if isinstance(value, fx.Node) else value

            ops: list[tuple[str, Target, Any, dict[str, Any], str, dict[str, Any], bool]] = []
            for n in graph.nodes:
                if n.op == "placeholder":
                    slots[n] = _Slot(len(slots))
            n_inputs = len(slots)
            result: Any = None
            for n in graph.nodes:
                if n.op == "placeholder":
                    continue
                args: Any = _map_leaves(n.args, slot)
                kwargs: Any = _map_leaves(n.kwargs, slot)
                if n.op == "output":
                    result = args[0]
                    break
                flat = all(
                    type(a) is _Slot or not isinstance(a, (tuple, list, dict, slice))
                    for a in args
                ) and not any(isinstance(v, _Slot) for v in walk_args(kwargs))
                ops.append((n.op, n.target, args, dict(kwargs), n.name, dict(n.meta), flat))
                slots[n] = _Slot(len(slots))
            self._repl = _Inline(n_inputs, ops, result)
        return self._repl


def _map_leaves(value: Any, fn: Callable[[Any], Any]) -> Any:
    """``value`` with ``fn`` applied to each leaf of its tuples, lists, dicts and slices."""
    if isinstance(value, tuple):
        values = [_map_leaves(v, fn) for v in value]
        return type(value)(*values) if hasattr(value, "_fields") else tuple(values)
    if isinstance(value, list):
        return [_map_leaves(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _map_leaves(v, fn) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(fn(value.start), fn(value.stop), fn(value.step))
    return fn(value)


def _fill(template: Any, env: list[Any]) -> Any:
    """``template`` with each :class:`_Slot` replaced by its value in ``env``."""
    return _map_leaves(template, lambda v: env[v.index] if type(v) is _Slot else v)


def _pkey(pn: fx.Node, table: OpTable) -> Key:
    return table.canonical((pn.op, pn.target))


def _target_label(pn: fx.Node) -> str:
    t = pn.target
    return f".{t}" if isinstance(t, str) else getattr(t, "__name__", repr(t))


def _match_value(p: Any, g: Any, st: _State, ctx: RewriteContext) -> bool:
    if isinstance(p, fx.Node):
        if p.op == "placeholder":
            if p in st.bind:
                bound = st.bind[p]
                return bound is g if isinstance(bound, fx.Node) else literal_equal(bound, g)
            st.bind[p] = g
            return True
        if not isinstance(g, fx.Node):
            return False
        if p in st.pmap:
            return st.pmap[p] is g
        if g in st.used or g.op not in ("call_function", "call_method", "call_module"):
            return False
        key = st.pkeys[p]
        if key not in ctx.keys(g):
            return False
        st.pmap[p] = g
        st.used.add(g)
        g_args = g.args
        if key in COMMUTATIVE and len(p.args) == 2 and len(g_args) == 2:
            saved = st.save()
            if _match_args(p.args, g_args, st, ctx) and _match_kwargs(p, g, st, ctx):
                return True
            st.load(saved)
            return _match_args(p.args, (g_args[1], g_args[0]), st, ctx) and _match_kwargs(
                p, g, st, ctx
            )
        return _match_args(p.args, g_args, st, ctx) and _match_kwargs(p, g, st, ctx)
    if isinstance(p, (tuple, list)):
        return (
            isinstance(g, (tuple, list))
            and len(p) == len(g)
            and all(_match_value(a, b, st, ctx) for a, b in zip(p, g))
        )
    if isinstance(g, fx.Node):
        return False
    return literal_equal(p, g)


def _match_args(pa: Sequence[Any], ga: Sequence[Any], st: _State, ctx: RewriteContext) -> bool:
    return len(pa) == len(ga) and all(_match_value(a, b, st, ctx) for a, b in zip(pa, ga))


def _match_kwargs(p: fx.Node, g: fx.Node, st: _State, ctx: RewriteContext) -> bool:
    for k, pv in p.kwargs.items():
        if k in g.kwargs:
            if not _match_value(pv, g.kwargs[k], st, ctx):
                return False
        elif pv is not None:
            return False
    return all(v is None for k, v in g.kwargs.items() if k not in p.kwargs)
