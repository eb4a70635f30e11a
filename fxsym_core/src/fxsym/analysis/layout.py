"""Dimension layouts: which group each entry of a tensor dimension belongs to.

A tensor value's *layout* is a :class:`TensorLayout`: one :data:`Dim` per tensor dimension.
A ``Dim`` is a tuple of :class:`Seg` segments laid end to end along that dimension:

* ``Seg(None, n)`` — ``n`` entries of fixed size (nothing may resize them);
* ``Seg(g, units, block)`` — ``units`` units of group ``g``, each ``block`` consecutive
  entries long (``block > 1`` after a ``flatten`` of a channel dim with spatial dims, or for a
  head made of ``head_dim`` channels).

So a concatenation of two convs' outputs along channels is ``(Seg(g1, 64), Seg(g2, 32))`` and
``flatten`` of ``(N, C=g, 7, 7)`` gives ``(Seg(g, C, 49),)`` on dimension 1. Non-tensor values
have layout ``None``; tuples and lists of values have a tuple of layouts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch


class Seg(NamedTuple):
    """``units`` units of ``group`` (``None``: fixed), each ``block`` entries long."""

    group: int | None
    units: int
    block: int = 1

    @property
    def length(self) -> int:
        return self.units * self.block


Dim = tuple[Seg, ...]


class TensorLayout(tuple):  # type: ignore[type-arg]
    """The layout of one tensor: a :data:`Dim` per dimension."""

    def __repr__(self) -> str:
        return f"TensorLayout{tuple.__repr__(self)}"


class SizeLayout(tuple):  # type: ignore[type-arg]
    """The layout of an int read from a tensor's shape (``x.size(1)``, ``x.shape[1]``).

    It holds the Dims the int follows at run time: one Dim for a size read directly, several
    (``derived=True``) for arithmetic on sizes. A reshape may use a direct size only for a dim
    with that same layout; anything else pins the groups involved.
    """

    derived: bool = False
    #: the nodes whose op rule proved which dim this size sizes there
    uses: set[Any]

    def __new__(cls, dims: Any = (), derived: bool = False) -> SizeLayout:
        obj = super().__new__(cls, tuple(dims))
        obj.derived = derived
        obj.uses = set()
        return obj

    def with_dims(self, dims: Any) -> SizeLayout:
        """The same size (its kind and :attr:`uses` shared) following ``dims`` instead: a
        split group read as its blocks."""
        obj = type(self)(dims, self.derived)
        obj.uses = self.uses
        return obj

    def __repr__(self) -> str:
        return f"SizeLayout({tuple.__repr__(self)}, derived={self.derived})"


class AttributeSize(SizeLayout):
    """The layout of an int read from a module attribute (``self.hidden_dim``).

    Its one Dim is a group of its own (``value`` units) whose member is the attribute. An op
    rule that can prove which tensor dim the int sizes ties the two
    (:func:`fxsym.analysis.attributes.tie_size`), which records the node in :attr:`uses`;
    any other use pins the group (the analyzer checks every node after its rule ran).
    """

    def __new__(cls, dims: Any = (), derived: bool = False) -> AttributeSize:
        obj = super().__new__(cls, dims, derived)
        assert isinstance(obj, AttributeSize)
        return obj

    def __repr__(self) -> str:
        return f"AttributeSize({tuple.__repr__(self)})"


Layout = Any  # TensorLayout | SizeLayout | tuple[Layout, ...] | None


def fixed_dim(n: int) -> Dim:
    return (Seg(None, int(n), 1),)


def dim_size(dim: Dim) -> int:
    return sum(s.units * s.block for s in dim)


def is_fixed(dim: Dim) -> bool:
    return all(s.group is None for s in dim)


def group_dim(group: int, units: int, block: int = 1) -> Dim:
    return (Seg(group, units, block),)


def fixed_layout(value: Any) -> Layout:
    """A layout for ``value`` with every dimension fixed."""
    if isinstance(value, torch.Tensor):
        return TensorLayout(fixed_dim(n) for n in value.shape)
    if isinstance(value, (tuple, list)):
        return tuple(fixed_layout(v) for v in value)
    if isinstance(value, dict):
        return {k: fixed_layout(v) for k, v in value.items()}
    return None


def iter_dims(layout: Layout) -> Iterator[Dim]:
    """Every dimension of every tensor in a (possibly nested) layout."""
    if isinstance(layout, (TensorLayout, SizeLayout)):
        yield from layout
    elif isinstance(layout, tuple):
        for item in layout:
            yield from iter_dims(item)
    elif isinstance(layout, dict):
        for item in layout.values():
            yield from iter_dims(item)


def scale_block(dim: Dim, factor: int) -> Dim:
    """``dim`` with each unit ``factor`` times longer (the dim was merged with inner dims)."""
    return tuple(Seg(s.group, s.units, s.block * factor) if s.group is not None
                 else Seg(None, s.units * s.block * factor, 1) for s in dim)


def concat_dims(dims: list[Dim]) -> Dim:
    """Dims laid end to end, adjacent fixed segments merged."""
    out: list[Seg] = []
    for dim in dims:
        for s in dim:
            if s.group is None and out and out[-1].group is None:
                out[-1] = Seg(None, out[-1].length + s.length, 1)
            elif s.length or s.group is not None:
                out.append(s if s.group is not None else Seg(None, s.length, 1))
    return tuple(out) or fixed_dim(0)
