"""Sizes read from int attributes: ``self.hidden_dim`` as a graph value, made when used.

While the forward of a module the tracer traces into runs, each public ``int`` attribute (not
a ``bool``) of the module, and each short tuple of ints (``normalized_shape``), reads as the
proxy of a ``get_attr`` node carrying the int (``node.meta[ATTRIBUTE_META] = (path, name)``;
a tuple element by element through ``getitem`` nodes), so ``x.reshape(n, self.hidden_dim,
-1)`` records where the size came from and the analysis ties the attribute to the dim it
sizes. The ints are put back when the forward returns or raises.

Most modules hold ints their forward never reads (strides, flags, counts): the node is
*deferred* (:meth:`ShapeProxy.deferred <fxsym.tracer.proxy.ShapeProxy.deferred>`), made when
the forward first uses the value, at the place an eager read would have put it
(:class:`_AttributeEntry`: after the newest node when the forward began, in the order of the
module's attributes), so the graph is the eager one less the unused reads. A rollback that
erases such a node makes its proxy forget it (:mod:`.tracer`). A plugin giving ints a proxy
class of its own gets the node at once.

Imports from fxsym: nothing.
"""

from __future__ import annotations

import contextlib
import operator
from collections import OrderedDict
from typing import Any

import torch
import torch.fx
from torch import nn

from .guard import tracing_here
from .proxy import ShapeProxy
from .questions import ATTRIBUTE_META
from .state import TracerState


class AttributeSizes(TracerState):
    """The part of the tracer that reads a traced-into module's int attributes as sizes."""

    # -- sizes read from attributes ----------------------------------------------------------
    @property
    def attribute_values(self) -> dict[str, int | tuple[int, ...]]:
        """The value of each int (or tuple of ints) read as a ``get_attr`` node (an attribute,
        a config field), by target; what such a node's value is computed from."""
        return self._attribute_values

    def reading_sizes(self) -> bool:
        """Whether a size read now is the traced model's own code (not a node's value being
        computed, nor a module run quietly, nor another thread)."""
        return not (self._quiet or self._evaluating) and tracing_here()

    @contextlib.contextmanager
    def _attribute_sizes(self, m: nn.Module, path: str) -> Any:
        """While ``m``'s forward is traced, its int attributes read as graph values.

        Each public attribute holding an ``int`` (not a ``bool``) is replaced in
        ``m.__dict__`` by the proxy of a ``get_attr`` node carrying the int
        (``node.meta[ATTRIBUTE_META]`` is ``(path, name)``); a tuple of ints by a tuple of
        proxies of ``getitem`` nodes on such a node, element ``i`` marked ``(path,
        "name[i]")``. So ``x.reshape(n, self.hidden_dim, -1)`` records where the size came
        from; the analysis ties the attribute to the dim it sizes. Python questions about
        its value are answered (:class:`ShapeProxy`) and recorded on the node. The ints are
        put back when the forward returns or raises; without example inputs nothing is
        replaced. Reads Python makes of the int elsewhere (a leaf module's own forward,
        which is not traced into) are untouched.
        """
        if not self.with_values or id(m) in self._sizing:
            yield
            return
        state = vars(m)
        names = [k for k, v in state.items() if (type(v) is int or (
            type(v) is tuple and _int_tuple(v))) and not k.startswith("_")]
        originals = {name: state[name] for name in names}
        proxies: dict[str, Any] = {}
        entry = _AttributeEntry(self.graph._root.prev, self.module_stack.copy(),
                                (self.scope.module_path, self.scope.module_type))
        self._sizing.add(id(m))
        try:
            for slot, name in enumerate(names):
                target = f"{path}.{name}" if path else name
                value = originals[name]
                self._attribute_values[target] = value
                read = self._attribute_read(entry, (slot, 0), "get_attr", target, (),
                                            (path, name))
                if type(value) is int:
                    proxies[name] = read
                    continue
                # a tuple of ints, read element by element (``normalized_shape``)
                proxies[name] = tuple(
                    self._attribute_read(entry, (slot, i + 1), "call_function",
                                         operator.getitem, (read, i), (path, f"{name}[{i}]"))
                    for i in range(len(value)))
            state.update(proxies)
            yield
        finally:
            self._sizing.discard(id(m))
            for name, proxy in proxies.items():
                if state.get(name) is proxy:  # the forward may rebind it (the guard restores)
                    state[name] = originals[name]

    def _attribute_read(self, entry: _AttributeEntry, key: tuple[int, int], kind: str,
                        target: Any, args: tuple[Any, ...], where: tuple[str, str]
                        ) -> torch.fx.Proxy:
        """The proxy of an int attribute (``kind``, ``target`` and ``args`` of its node), its
        node marked ``node.meta[ATTRIBUTE_META] = where``.

        The node is made when the forward first uses the value: most modules hold ints their
        forward never reads (strides, flags, counts), which then cost no node. It is made as it
        would have been when the forward began (:class:`_AttributeEntry`), so the graph is the
        one an eager read gives, less the unused reads. A plugin giving ints a proxy class of
        its own gets the node at once."""

        def create(proxy: ShapeProxy | None = None) -> torch.fx.Node:
            node_args = tuple(a.node if isinstance(a, torch.fx.Proxy) else a for a in args)
            after = entry.anchor
            for made_key, made in sorted(entry.made.items()):
                if made_key < key and made in self._attribute_nodes:  # (not erased since)
                    after = made
            asked, self.index_questions = self.index_questions, []  # not the model's next node
            try:
                with self.graph.inserting_after(after):
                    node = self.create_node(kind, target, node_args, {})
            finally:
                self.index_questions = asked
            node.meta[ATTRIBUTE_META] = where
            if entry.stack:
                node.meta["nn_module_stack"] = entry.stack.copy()
            else:
                node.meta.pop("nn_module_stack", None)
            self.node_name_to_scope[node.name] = entry.scope
            entry.made[key] = node
            self._attribute_nodes[node] = proxy
            return node

        if self.registry.proxy_class(int) is not None:
            return self.proxy(create())
        owner, name = where
        return ShapeProxy.deferred(self, create, f"{owner}.{name}" if owner else name)


class _AttributeEntry:
    """Where the int attributes of a module read as sizes belong, for one call of its forward:
    after ``anchor`` (the newest node when the forward began), in the order of the module's
    attributes (an element of a tuple after the tuple), with the call's module ``stack`` and
    ``scope`` (path and type); ``made``: the nodes made so far, by place in that order."""

    __slots__ = ("anchor", "made", "scope", "stack")

    def __init__(self, anchor: torch.fx.Node, stack: OrderedDict[str, Any],
                 scope: tuple[str, Any]) -> None:
        self.anchor = anchor
        self.stack = stack
        self.scope = scope
        self.made: dict[tuple[int, int], torch.fx.Node] = {}


def _int_tuple(value: Any) -> bool:
    """A short tuple of ints (``self.normalized_shape = (hidden,)``): read as sizes."""
    return type(value) is tuple and 0 < len(value) <= 8 and all(type(v) is int for v in value)
