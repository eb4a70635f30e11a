"""Chain patterns: a sequence of node kinds, walked back from the last one (the anchor).

``ChainPattern("fold", [Step(nn.Conv2d, name="conv"), Step(nn.BatchNorm2d, name="bn")],
rewrite)`` matches a BatchNorm node whose input (argument ``Step.input``, 0 by default) is a
Conv2d node. Each step lists the kinds it accepts — module classes, functions, method names —
and may add predicates, each a value to compare or a callable to test: ``args`` on the node's
arguments (key ``i`` for positional argument ``i``, ``"name"`` for a keyword, ``(i, "name")``
for either), ``attrs`` on the called module's attributes; and ``where(node, ctx)`` on
anything else. Every step but the anchor must
feed only the next step (its value must not escape the chain), unless ``escape=True``.

The matched nodes are bound by step name; the chain's input (the value entering the first
step) is bound as ``"input"``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import fx

from .ops import Key, OpKind, OpTable, kind_key
from .pattern import Match, Pattern, RewriteContext

StepPredicate = Callable[[fx.Node, RewriteContext], bool]
RewriteFn = Callable[[Match, RewriteContext], "fx.Node | None"]
MatchPredicate = Callable[[Match, RewriteContext], bool]


class Step:
    """One node of a chain: the kinds it accepts and the predicates it must satisfy."""

    def __init__(
        self,
        *kinds: OpKind,
        name: str | None = None,
        input: int = 0,
        args: dict[Any, Any] | None = None,
        attrs: dict[str, Any] | None = None,
        where: StepPredicate | None = None,
        escape: bool = False,
    ) -> None:
        if not kinds:
            raise ValueError("a Step needs at least one kind")
        self.kinds = kinds
        self.name = name
        self.input = input
        self.args = dict(args or {})
        self.attrs = dict(attrs or {})
        self.where = where
        self.escape = escape
        self._raw = tuple(kind_key(k) for k in kinds)

    def keys(self, table: OpTable) -> frozenset[Key]:
        return frozenset(table.canonical(k) for k in self._raw)

    def accepts(self, node: fx.Node, keys: frozenset[Key], ctx: RewriteContext) -> bool:
        if node.op not in ("call_function", "call_method", "call_module"):
            return False
        if keys.isdisjoint(ctx.keys(node)):
            return False
        for key, expected in self.args.items():
            value = _argument(node, key)
            if value is _MISSING or not _check(expected, value):
                return False
        if self.attrs:
            if node.op != "call_module":
                return False
            module = ctx.module(node)
            for attr, expected in self.attrs.items():
                if not hasattr(module, attr):
                    return False
                if not _check(expected, getattr(module, attr)):
                    return False
        return self.where is None or bool(self.where(node, ctx))

    def __repr__(self) -> str:
        return f"Step({self.label()}, name={self.name!r})"

    def label(self) -> str:
        return "|".join(_kind_label(k) for k in self.kinds)


_MISSING = object()


def _argument(node: fx.Node, key: Any) -> Any:
    if isinstance(key, int):
        return node.args[key] if key < len(node.args) else _MISSING
    if isinstance(key, str):
        return node.kwargs.get(key, _MISSING)
    index, name = key
    if index < len(node.args):
        return node.args[index]
    return node.kwargs.get(name, _MISSING)


def _check(expected: Any, value: Any) -> bool:
    if callable(expected) and not isinstance(expected, type):
        return bool(expected(value))
    try:
        return bool(value == expected)
    except Exception:
        return False


def _kind_label(kind: OpKind) -> str:
    if isinstance(kind, str):
        return f".{kind}"
    return getattr(kind, "__name__", None) or repr(kind)


class ChainPattern(Pattern):
    """A chain of steps in data-flow order; the last step is the anchor."""

    def __init__(
        self,
        name: str,
        steps: Sequence[Step],
        rewrite: RewriteFn,
        *,
        where: MatchPredicate | None = None,
        stage: str = "patterns",
        priority: int = 0,
        description: str = "",
    ) -> None:
        if not steps:
            raise ValueError(f"chain pattern {name!r} has no steps")
        self.name = name
        self.steps = tuple(steps)
        self._rewrite = rewrite
        self.where = where
        self.stage = stage
        self.priority = priority
        self.description = description or (getattr(rewrite, "__doc__", None) or "").strip()
        self._keys: tuple[OpTable, list[frozenset[Key]]] | None = None

    @property
    def size(self) -> int:
        return len(self.steps)

    def _step_keys(self, table: OpTable) -> list[frozenset[Key]]:
        if self._keys is None or self._keys[0] is not table:
            self._keys = (table, [s.keys(table) for s in self.steps])
        return self._keys[1]

    def anchor_keys(self, table: OpTable) -> tuple[Key, ...]:
        return tuple(self._step_keys(table)[-1])

    def input_filter(self, table: OpTable, key: Key) -> tuple[int, frozenset[Key]] | None:
        if len(self.steps) < 2:
            return None
        return self.steps[-1].input, self._step_keys(table)[-2]

    def describe_anchor(self) -> str:
        return " -> ".join(s.label() for s in self.steps)

    def match(self, node: fx.Node, ctx: RewriteContext) -> Match | None:
        keys = self._step_keys(ctx.table)
        last = len(self.steps) - 1
        if not self.steps[last].accepts(node, keys[last], ctx):
            return None
        chain = [node]
        current = node
        for i in range(last - 1, -1, -1):
            step, succ_step = self.steps[i], self.steps[i + 1]
            prev = _input_of(current, succ_step.input)
            if not isinstance(prev, fx.Node) or not step.accepts(prev, keys[i], ctx):
                return None
            if not step.escape and any(u is not current for u in prev.users):
                return None
            chain.append(prev)
            current = prev
        chain.reverse()
        bindings: dict[str, Any] = {"input": _input_of(chain[0], self.steps[0].input)}
        for step, n in zip(self.steps, chain):
            if step.name:
                bindings[step.name] = n
        m = Match(self, node, tuple(chain), bindings)
        if self.where is not None and not self.where(m, ctx):
            return None
        return m

    def rewrite(self, match: Match, ctx: RewriteContext) -> fx.Node | None:
        return self._rewrite(match, ctx)


def _input_of(node: fx.Node, index: int) -> Any:
    if index < len(node.args):
        return node.args[index]
    if index == 0:  # a first argument given by keyword (input=..., x=...)
        for key in ("input", "x", "self"):
            if key in node.kwargs:
                return node.kwargs[key]
    return None
