"""Ints read as sizes: a module attribute or a config field as a group of its own.

The tracer reads a traced-into module's int attributes, and its config's int fields, as
``get_attr`` nodes (:mod:`fxsym.tracer.attribute_sizes`, :mod:`fxsym.tracer.configs`).
:meth:`AttributeReads._attribute` gives each such read the layout of a size: a group of its own
whose member ``(owner, "attr:name")`` (:data:`~fxsym.analysis.attributes.ATTRIBUTE_PREFIX`)
resize updates with the dims the group is tied to (``"attr:name[i]"`` for element ``i`` of a
tuple); an int of at most 1 is a fixed size. Every read of one attribute, and of one field of
one config object, has the same layout. After the walk,
:meth:`AttributeReads._hidden_config_readers` pins the config fields whose config object a
leaf also holds (its forward, which fxsym does not see, would read the resized value) and says
where a field read by several modules was pinned for all of them.
"""

from __future__ import annotations

import torch
import torch.fx

from ..tracer.configs import CONFIG_META
from ..tracer.questions import ATTRIBUTE_META
from .attributes import ATTRIBUTE_PREFIX
from .layout import (
    AttributeSize,
    Dim,
    Layout,
    SizeLayout,
    fixed_dim,
    fixed_layout,
    group_dim,
    iter_dims,
)
from .state import AnalyzerBase


class AttributeReads(AnalyzerBase):
    """The part of the analyzer that lays out ints read as sizes."""

    def _attribute(self, node: torch.fx.Node) -> Layout:
        """An int attribute of a module read as a size (see :mod:`fxsym.analysis.attributes`):
        a group of its own whose member is ``(owner, "attr:name")`` (``"attr:name[i]"`` for
        element ``i`` of a tuple of ints). Questions Python asked of its value at trace time
        are guards, decided once their reads have layouts (:mod:`fxsym.analysis.guards`).
        Every read of one attribute has the same layout."""
        owner, name = node.meta[ATTRIBUTE_META]
        target = f"{owner}.{name}" if owner else name
        known = self.attribute_reads.get(target)
        shared = node.meta.get(CONFIG_META)  # one field of one config object: one group
        if shared is not None:
            self.config_readers.setdefault(shared, set()).add(node.meta[ATTRIBUTE_META][0])
        if known is None and shared in self.config_reads:
            known = self.attribute_reads[target] = self.config_reads[shared]
            if isinstance(known, AttributeSize):
                self._attribute_member(node, known[0])
        if known is None:
            value = node.meta.get("val")
            if isinstance(value, tuple):  # read element by element: each is a size
                known = fixed_layout(value)
            elif not isinstance(value, int) or value <= 1:
                known = SizeLayout((fixed_dim(int(value or 0)),))
            else:
                g = self.table.new(value)
                dim = group_dim(g, value)
                self._attribute_member(node, dim)
                self.attribute_groups.add(g)
                known = AttributeSize((dim,))
            self.attribute_reads[target] = known
            if shared is not None:
                self.config_reads[shared] = known
        return known

    def _hidden_config_readers(self) -> None:
        """Pin the config fields read as sizes whose config object a module called as a leaf
        (or a module inside one) also holds: its forward, which fxsym does not see, would read
        the resized value too. A field read by several modules is one group; say so where it
        is pinned."""
        ids = {key[0] for key in self.config_reads}
        hidden: dict[int, str] = {}
        for node in self.gm.graph.nodes:
            if node.op != "call_module":
                continue
            for sub_name, sub in self.modules(str(node.target)).named_modules():
                for value in vars(sub).values():
                    if id(value) in ids:
                        hidden.setdefault(id(value), f"{node.target}.{sub_name}".rstrip("."))
        for (cid, field), layout in self.config_reads.items():
            readers = ", ".join(sorted(self.config_readers.get((cid, field), ())) or ["<root>"])
            groups = [seg.group for d in iter_dims(layout) for seg in d if seg.group is not None]
            if cid in hidden:
                reason = (f"config field {field} (read as a size by {readers}) is held by "
                          f"{hidden[cid]}, a leaf whose forward fxsym does not see")
                if any([self.table.fix(g, reason) for g in groups]):
                    self.report.add("config", field, reason)
            elif len(self.config_readers.get((cid, field), ())) > 1:
                why = next((r for g in groups if (r := self.table.reason(g))), None)
                if why is not None:
                    self.report.add("config", field, f"config field {field} is shared by "
                                    f"{readers}; pinned for all of them: {why}")

    def _attribute_member(self, node: torch.fx.Node, dim: Dim) -> None:
        """Record the attribute ``node`` reads as a member ``(owner, "attr:name")`` of ``dim``."""
        owner, name = node.meta[ATTRIBUTE_META]
        try:
            mod = self.modules(owner)
        except AttributeError:
            mod = None
        owner_name = self.symmap.name_of(mod) if mod is not None and (
            mod in self.symmap) else owner
        key = (owner_name, f"{ATTRIBUTE_PREFIX}{name}")
        self.symbol_dims[key] = dim
        self.param_members.add(key)
