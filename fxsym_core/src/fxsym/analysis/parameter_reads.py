"""Tensors the graph reads itself: parameter members, and parameters that produce.

A parameter or buffer read with ``get_attr`` (``F.linear(x, self.weight)`` in a module traced
into) starts a group with no producer for each dim longer than 1
(:meth:`ParameterReads._new_parameter`); if an op ties one to a group, the tensor is a
*parameter member* ``(owner, "name:dim")`` that resize slices along that dim. Where an op rule
proves that a parameter dim makes the entries of its output dim (``F.linear``, ``F.conv2d``,
``F.embedding``: :meth:`~fxsym.analysis.context.OpContext.produce`), the nearest such
parameter becomes a searchable producer of its group
(:meth:`ParameterReads.produce_from_parameter`), unless a module whose family's resize rule
runs owns it (:meth:`ParameterReads._owned_by_family`): that rule keeps the module consistent.
A tensor a leaf's rule slices is no member (:meth:`ParameterReads.drop_parameter_member`,
called by :mod:`.shared`).
"""

from __future__ import annotations

import functools

import torch
import torch.fx

from .layout import Dim, Layout, TensorLayout, fixed_layout, group_dim
from .shared import own_tensor
from .state import AnalyzerBase


class ParameterReads(AnalyzerBase):
    """The part of the analyzer that lays out tensors read with ``get_attr``."""

    def _parameter(self, node: torch.fx.Node) -> Layout:
        known = self.param_reads.get(str(node.target))  # read twice: the same groups
        if known is None:
            known = self.param_reads[str(node.target)] = self._new_parameter(node)
        return known

    def drop_parameter_member(self, target: str) -> None:
        """The tensor read at ``target`` is sliced by a module's resize rule, not directly."""
        keys = self._member_keys.pop(target, ())
        for key in keys:
            self.param_members.discard(key)
            self.symbol_dims.pop(key, None)
        if keys:  # its module's own symbols produce what it produced
            for producers in self.table.producers.values():
                producers[:] = [p for p in producers if (p[1], p[2]) not in keys]

    def produce_from_parameter(self, dim: Dim, source: torch.fx.Node,
                               node: torch.fx.Node) -> bool:
        """See :meth:`OpContext.produce`: the parameter nearest ``source`` (breadth first
        over its inputs) with a dim in ``dim``'s group becomes a searchable producer of it.

        A tensor of a module with a SymInfo (an ``nn.Linear`` whose weight the model passes to
        ``F.linear`` itself) is skipped: its family's resize rule, not a slice of the tensor,
        keeps that module consistent (``out_features``)."""
        if len(dim) != 1 or dim[0].group is None:
            return False
        root = self.table.find(dim[0].group)
        seen: set[torch.fx.Node] = set()
        queue = [source]
        while queue and len(seen) < 64:
            n = queue.pop(0)
            if n in seen:
                continue
            seen.add(n)
            if n.op == "get_attr" and not self._owned_by_family(str(n.target)):
                for key in self._member_keys.get(str(n.target), ()):
                    segs = self.symbol_dims.get(key, ())
                    g = segs[0].group if len(segs) == 1 else None
                    if g is None or self.table.find(g) != root:
                        continue
                    known = self.table.producers.get(root, [])
                    if not any((q, s) == key for _, q, s, _ in known):
                        self.table.add_producer(g, key[0], key[1], True)
                    return True
            queue.extend(n.all_input_nodes)
        return False

    def _new_parameter(self, node: torch.fx.Node) -> Layout:
        """A parameter or buffer of the model used in the graph: each dim of size > 1 starts a
        group with no producer. If an op ties it to a producer's group, the tensor becomes a
        *parameter member* ``(owner, "name:dim")`` that resize slices along that dim."""
        value = node.meta.get("val")
        owner, _, pname = str(node.target).rpartition(".")
        if not isinstance(value, torch.Tensor) or pname.startswith("_tensor_constant"):
            return fixed_layout(value)
        try:
            mod = self.modules(owner)
        except AttributeError:
            return fixed_layout(value)
        if own_tensor(mod, pname) is None:
            return fixed_layout(value)
        name = (self.symmap.name_of(mod) if mod in self.symmap else owner) if owner else ""
        dims: list[Dim] = []
        for d, size in enumerate(value.shape):
            if size <= 1:
                dims.append(fixed_layout(value)[d])
                continue
            g = self.table.new(size)
            dim = group_dim(g, size)
            key = (name, f"{pname}:{d}")
            self.symbol_dims[key] = dim
            self.param_members.add(key)
            self._member_keys.setdefault(str(node.target), []).append(key)
            dims.append(dim)
        return TensorLayout(dims)

    def _owned_by_family(self, target: str) -> bool:
        """Whether the tensor at ``target`` belongs to a module whose family's resize rule
        runs: a module with a SymInfo that the graph calls (itself, or a leaf holding it). A
        family module the model only reads tensors of (``F.linear(x, self.qkv.weight)``) is
        not: its tensor is sliced as a parameter member, and its size attributes follow
        (:func:`.shared.tie_shared_tensors`)."""
        owner = target.rpartition(".")[0]
        try:
            mod = self.model_modules(owner)
        except AttributeError:
            return False
        return mod in self.symmap and id(mod) in self._called

    @functools.cached_property
    def _called(self) -> set[int]:
        """The ids of the modules the graph calls, and of every module inside one."""
        out: set[int] = set()
        for node in self.gm.graph.nodes:
            if node.op == "call_module":
                out.update(id(m) for m in self.gm.get_submodule(str(node.target)).modules())
        return out
