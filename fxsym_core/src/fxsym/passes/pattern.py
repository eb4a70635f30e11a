"""The pattern protocol shared by chain and subgraph patterns, and the rewrite context.

A pattern is anchored: it names the kinds its *anchor* node (the node whose value the
pattern computes) may have, and given one candidate anchor it walks *backwards* through the
anchor's inputs to decide whether it matches. The engine only offers a pattern the nodes
whose kind is one of its anchor kinds, so matching costs grow with candidate anchors.

A :class:`Match` holds the matched nodes (interior nodes plus the anchor, in graph order)
and the named values bound while matching. Interior nodes have no user outside the match,
so replacing the anchor makes them dead. ``rewrite(match, ctx)`` builds the replacement in
front of the anchor and returns the node that takes the anchor's place, or ``None`` to
decline.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from .ops import Key, Modules, OpTable, node_keys, tensor_shape


@dataclass
class Match:
    """One occurrence of a pattern in a graph."""

    pattern: Pattern
    anchor: fx.Node
    nodes: tuple[fx.Node, ...]
    bindings: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.bindings[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.bindings.get(name, default)

    def resolve(self, replaced: dict[fx.Node, fx.Node]) -> None:
        """Point bindings at the nodes that replaced them earlier in the same round."""
        if not replaced:
            return

        def follow(v: fx.Node) -> fx.Node:
            while v in replaced:
                v = replaced[v]
            return v

        for k, v in self.bindings.items():
            if isinstance(v, fx.Node):
                if v in replaced:
                    self.bindings[k] = follow(v)
            elif isinstance(v, (tuple, list, dict, slice)):
                self.bindings[k] = fx.map_arg(v, follow)


class Pattern:
    """Base class of graph patterns (see :class:`ChainPattern`, :class:`SubgraphPattern`).

    ``stage`` names the pattern pass that applies it (``"patterns"`` by default);
    ``priority`` breaks ties between patterns of equal size (lower first); ``exact`` says
    the rewrite never changes the values computed (see :class:`~fxsym.passes.Pass`).
    """

    name: str = ""
    exact: bool = False
    stage: str = "patterns"
    priority: int = 0

    @property
    def size(self) -> int:
        """Number of nodes a match replaces; larger matches win overlaps."""
        raise NotImplementedError

    def anchor_keys(self, table: OpTable) -> tuple[Key, ...]:
        """Canonical kinds the anchor node may have."""
        raise NotImplementedError

    def input_filter(self, table: OpTable, key: Key) -> tuple[int, frozenset[Key]] | None:
        """A necessary condition on an anchor of kind ``key``, checked before :meth:`match`.

        ``(i, kinds)``: when the anchor has a positional argument ``i``, it is a node with one
        of ``kinds`` (a node with fewer positional arguments is always offered). ``None``: no
        such condition. The engine indexes patterns by it, so a node is only offered the
        patterns whose condition its argument meets.
        """
        return None

    def match(self, node: fx.Node, ctx: RewriteContext) -> Match | None:
        raise NotImplementedError

    def rewrite(self, match: Match, ctx: RewriteContext) -> fx.Node | None:
        raise NotImplementedError

    def describe_anchor(self) -> str:
        return ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


_NAME_RE = re.compile(r"[^0-9a-zA-Z_]")


class RewriteContext:
    """The GraphModule under rewrite, with helpers for patterns' rewrite functions."""

    def __init__(self, gm: fx.GraphModule, table: OpTable) -> None:
        self.gm = gm
        self.graph = gm.graph
        self.table = table
        self.modules = Modules(gm)
        self._keys: dict[fx.Node, tuple[Key, ...]] = {}

    def start_round(self) -> None:
        """Forget cached node kinds (a rewrite may have changed a node's target)."""
        self._keys.clear()

    # -- reading ----------------------------------------------------------------------------
    def keys(self, node: fx.Node) -> tuple[Key, ...]:
        """The canonical kinds of ``node`` (cached for the current round)."""
        keys = self._keys.get(node)
        if keys is None:
            if node.op == "call_module":
                keys = node_keys(node, self.table, self.modules)
            else:
                keys = (self.table.canonical((node.op, node.target)),)
            self._keys[node] = keys
        return keys

    def module(self, node: fx.Node) -> nn.Module:
        """The module a ``call_module`` node calls."""
        return self.modules.get(node.target)

    def shape(self, value: Any) -> tuple[int, ...] | None:
        return tensor_shape(value)

    def call_sites(self, target: str) -> int:
        """How many ``call_module`` nodes call the module at ``target``."""
        return sum(1 for n in self.graph.nodes if n.op == "call_module" and n.target == target)

    # -- writing ----------------------------------------------------------------------------
    def fresh_name(self, base: str) -> str:
        """An attribute path under ``gm`` not used yet, derived from ``base``."""
        parts = [(_NAME_RE.sub("_", p) or "_") for p in base.split(".")]
        candidate = ".".join(parts)
        i = 0
        while _has_attr_path(self.gm, candidate):
            i += 1
            candidate = ".".join([*parts[:-1], f"{parts[-1]}_{i}"])
        return candidate

    def add_module(self, base: str, module: nn.Module) -> str:
        """Attach ``module`` to ``gm`` under a fresh name; return the target."""
        target = self.fresh_name(base)
        self.gm.add_submodule(target, module)
        return target

    def replace_module(self, target: str, module: nn.Module) -> None:
        """Put ``module`` at ``target`` (a container of ``gm``, never the user's model)."""
        parent_path, _, leaf = target.rpartition(".")
        parent = self.gm.get_submodule(parent_path) if parent_path else self.gm
        setattr(parent, leaf, module)
        self.modules.forget(target)
        self._keys.clear()

    def add_tensor(self, base: str, value: torch.Tensor) -> fx.Node:
        """Register ``value`` on ``gm`` (as a buffer) and return a ``get_attr`` node for it."""
        target = self.fresh_name(base)
        parent_path, _, leaf = target.rpartition(".")
        parent = self.gm.get_submodule(parent_path) if parent_path else self.gm
        if isinstance(value, nn.Parameter):
            parent.register_parameter(leaf, value)
        else:
            parent.register_buffer(leaf, value)
        return self.graph.get_attr(target)


def _has_attr_path(root: nn.Module, path: str) -> bool:
    obj: Any = root
    for part in path.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def walk_args(value: Any) -> Iterator[Any]:
    """Leaves of a (possibly nested) node argument."""
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from walk_args(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from walk_args(v)
    elif isinstance(value, slice):
        yield from (value.start, value.stop, value.step)
    else:
        yield value
