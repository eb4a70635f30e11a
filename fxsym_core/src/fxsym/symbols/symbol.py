"""The :class:`Symbol`: one size of one module, and its four states.

A symbol is *free* (nothing decided yet), *searchable* (the root of a cross-layer group),
*dynamic* (linked to a parent symbol it follows) or *constant*. The transitions
(:meth:`Symbol.link_to`, :meth:`Symbol.make_searchable`, :meth:`Symbol.disable`) are the only
writers of those states, and they keep a symbol's dependency tree consistent: a link never
makes a cycle, and disabling one symbol disables its whole tree. A cross-layer symbol
(``INCOMING``/``OUTGOING``) says which dim of the module's input or output tensor it sizes
through ``elastic_dims``.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class Symbol:
    """One size of one module; see the module docstring for its states."""

    class CLType(Enum):
        """How a symbol relates to the tensors crossing the module boundary."""

        NONE = "none"
        INCOMING = "incoming"
        OUTGOING = "outgoing"

    def __init__(
        self,
        is_searchable: bool = False,
        is_sortable: bool = True,
        cl_type: Symbol.CLType = CLType.NONE,
        elastic_dims: Iterable[int] | None = None,
        *,
        units: int | None = None,
        units_stay: bool = False,
        size: int | None = None,
        block: int = 1,
        covers: Iterable[tuple[str, str]] = (),
        copies: int = 1,
        places: Iterable[tuple[str, tuple[int | str, ...]]] = (),
    ) -> None:
        #: an INCOMING symbol's dim may only change in this many whole pieces (conv groups)
        self.units = units
        #: with ``units``: the pieces stay instead, and each loses as many entries as every
        #: other, at the same places (a group norm that keeps its ``num_groups``)
        self.units_stay = units_stay
        #: the size of a searchable symbol that is not cross-layer (heads inside a leaf)
        self.size = size
        #: entries per unit of an OUTGOING symbol (a head of ``head_dim`` features)
        self.block = block
        #: ``(submodule path relative to this module, symbol name)`` of the symbols inside a
        #: leaf that this symbol sizes (an attention leaf's ``heads`` size its ``q_proj``'s
        #: ``out_features``): they join this symbol's groups as members, and this module's
        #: resize rule, not theirs, resizes them
        self.covers: tuple[tuple[str, str], ...] = tuple(covers)
        #: an OUTGOING symbol's dim holds this many consecutive copies of its group, the
        #: same entries kept in each (a bidirectional RNN's forward then backward half)
        self.copies = copies
        #: further tensor dims this symbol sizes, one copy each: ``("input", path)`` or
        #: ``("output", path)``, ``path`` indexing the module's arguments (a position, or a
        #: keyword's name) or its output down to a tensor, then the dim
        #: (``("output", (1, 0, -1))``: the last dim of ``output[1][0]``, an LSTM's ``h_n``);
        #: an input dim is tied to the symbol's group, an output dim carries it (places a call
        #: does not have are skipped)
        self.places: tuple[tuple[str, tuple[int | str, ...]], ...] = tuple(places)
        self._is_searchable = is_searchable
        self._is_sortable = is_sortable
        self._is_constant = False
        self._cl_type = cl_type
        self._elastic_dims: set[int] = set(elastic_dims or ())
        self._parent: Symbol | None = None
        self._dependencies: list[Symbol] = []
        if self.is_cross_layer != bool(self._elastic_dims):
            raise ValueError(
                "a cross-layer symbol (INCOMING/OUTGOING) needs elastic_dims, "
                "and only cross-layer symbols may have them"
            )

    # -- states -----------------------------------------------------------------------------
    @property
    def parent(self) -> Symbol | None:
        """The symbol this one follows, if it is dynamic."""
        return self._parent

    @property
    def dependencies(self) -> list[Symbol]:
        """The symbols that follow this one."""
        return self._dependencies

    @property
    def is_searchable(self) -> bool:
        return self._is_searchable

    @property
    def is_dynamic(self) -> bool:
        return self._parent is not None

    @property
    def is_constant(self) -> bool:
        return self._is_constant

    @property
    def is_free(self) -> bool:
        return not (self._is_searchable or self._is_constant or self._parent is not None)

    @property
    def is_sortable(self) -> bool:
        """Whether every symbol of this symbol's dependency tree may be reordered."""
        return all(s._is_sortable for s in self._tree())

    @is_sortable.setter
    def is_sortable(self, value: bool) -> None:
        self._is_sortable = value

    @property
    def is_sortable_itself(self) -> bool:
        """Whether this symbol alone may be reordered, whatever the symbols linked to it say
        (the value ``is_sortable`` was last set to)."""
        return self._is_sortable

    # -- cross-layer properties -------------------------------------------------------------
    @property
    def cl_type(self) -> Symbol.CLType:
        return self._cl_type

    @property
    def is_cross_layer(self) -> bool:
        return self._cl_type is not Symbol.CLType.NONE

    @property
    def is_incoming(self) -> bool:
        return self._cl_type is Symbol.CLType.INCOMING

    @property
    def is_outgoing(self) -> bool:
        return self._cl_type is Symbol.CLType.OUTGOING

    @property
    def is_dangling(self) -> bool:
        """Cross-layer and still free: analysis has not decided it."""
        return self.is_cross_layer and self.is_free

    @property
    def elastic_dims(self) -> set[int]:
        """Equivalent indices of the one input/output tensor dimension this symbol sizes."""
        return self._elastic_dims

    # -- transitions ------------------------------------------------------------------------
    def link_to(self, parent: Symbol) -> None:
        """Make this symbol follow ``parent`` (it becomes dynamic)."""
        if parent is self:
            raise ValueError("a symbol cannot follow itself")
        if not (self.is_free or self._is_searchable):
            raise ValueError(f"only a free or searchable symbol can be linked, not {self!r}")
        if parent.is_constant:
            raise ValueError("cannot link to a constant symbol; disable() this one instead")
        if (self._parent is not None or self._dependencies) and self in parent._tree():
            # (a symbol linked to nothing and followed by nothing is in no other's tree)
            raise ValueError("linking would create a cycle")
        self._is_searchable = False
        self._parent = parent
        parent._dependencies.append(self)

    def make_searchable(self) -> None:
        """Make this symbol the searchable root of its group (its value may be chosen).

        Raises ``ValueError`` if it is constant or dynamic: such a symbol cannot lead a group.
        """
        if self._is_constant or self._parent is not None:
            raise ValueError(f"only a free or searchable symbol can be made searchable, not "
                             f"{self!r}")
        self._is_searchable = True

    def disable(self) -> None:
        """Make this symbol and its whole dependency tree (parents and followers) constant."""
        for sym in self._tree():
            sym._parent = None
            sym._dependencies = []
            sym._is_searchable = False
            sym._is_sortable = False
            sym._is_constant = True

    def _tree(self) -> list[Symbol]:
        seen: dict[int, Symbol] = {}
        stack = [self]
        while stack:
            sym = stack.pop()
            if id(sym) in seen:
                continue
            seen[id(sym)] = sym
            stack.extend(sym._dependencies)
            if sym._parent is not None:
                stack.append(sym._parent)
        return list(seen.values())

    def __repr__(self) -> str:
        flags = ("searchable", "free", "dynamic", "constant", "incoming", "outgoing")
        shown = [f for f in flags if getattr(self, f"is_{f}")]
        return f"Symbol({', '.join(shown)})"
