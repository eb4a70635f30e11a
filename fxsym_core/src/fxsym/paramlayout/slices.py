"""The layout as data: :class:`ParamLayout`, where the units of every searchable group lie in the
model's parameters, as :class:`Slices` (which slice of which parameter dim belongs to which
unit), and the parameter shapes and counts it gives once each group keeps some of its units.
"""


from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

#: what using the old name ``Layout`` of :class:`ParamLayout` warns (a ``DeprecationWarning``)
LAYOUT_RENAMED = ("Layout is now ParamLayout (fxsym.paramlayout.ParamLayout): one concept, one "
                  "name; fxsym.analysis.Layout is the layout of one traced value")


@dataclass(frozen=True)
class Slices:
    """The slices of parameter ``param`` along ``dim`` that belong to units of one group:
    slice ``index[i]`` belongs to unit ``unit[i]``."""

    param: str
    dim: int
    index: torch.Tensor
    unit: torch.Tensor


@dataclass(frozen=True)
class ParamLayout:
    """Where the units of every searchable group lie in the model's parameters.

    ``shapes`` holds every parameter of the model (a shared one under its first name);
    ``slices`` the slices of each group of size 2 or more (a group without any parameter
    slice has an empty list), in the order of the parameters and their dims; ``sizes`` the
    units of every group.
    """

    shapes: Mapping[str, tuple[int, ...]]
    slices: Mapping[str, Sequence[Slices]]
    sizes: Mapping[str, int]

    def shapes_after(self, kept: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape once each group of ``kept`` keeps that many units.

        A slice stays if every group it belongs to keeps its unit; groups cutting one dim side
        by side (a concatenation) or crosswise (heads x head dims of one projection) are both
        counted exactly, whichever units are kept."""
        return {**self.shapes, **self.changed_shapes(kept)}

    def changed_shapes(self, kept: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        """The parameters :meth:`shapes_after` changes, with their new shapes (in the size of
        the groups' slices, not of the model).

        A dim one group cuts, with as many slices per unit, keeps ``slices / units x kept``
        of them (counted); a dim several groups cut keeps the sum, over its slices, of the
        product of the shares each group keeps (``kept / units``) of the slice."""
        cuts: dict[tuple[str, int], list[tuple[Slices, int, int]]] = {}
        for group, count in kept.items():
            size = self.sizes[group]
            if count == size:
                continue
            for s in self.slices.get(group, ()):
                cuts.setdefault((s.param, s.dim), []).append((s, count, size))
        shapes: dict[str, list[int]] = {}
        for (param, dim), parts in cuts.items():
            length = self.shapes[param][dim]
            s, count, size = parts[0]
            n = s.index.numel()
            if len(parts) == 1 and n % size == 0:
                left = length - n + n // size * count
            else:
                share = torch.ones(length, dtype=torch.float64)
                for s, count, size in parts:
                    share.index_copy_(0, s.index, share.index_select(0, s.index) * (count / size))
                left = round(float(share.sum()))
            shapes.setdefault(param, list(self.shapes[param]))[dim] = left
        return {name: tuple(shape) for name, shape in shapes.items()}

    def param_count(self, kept: Mapping[str, int]) -> int:
        """How many parameters the model holds once each group of ``kept`` keeps that many
        units (the others unchanged)."""
        return sum(math.prod(s) for s in self.shapes.values()) - sum(
            math.prod(self.shapes[p]) - math.prod(s) for p, s in self.changed_shapes(kept).items())
