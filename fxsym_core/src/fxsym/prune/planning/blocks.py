"""Depth in a plan: the blocks ``layers`` keeps per depth group (:mod:`fxsym.depth` chooses
them), and a plan made to drop the others (its shapes under their new names, its counts
without the dropped blocks' parameters).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from torch import nn

from ...symbols import SymMap
from ..depth import block_importance, choose_blocks, renamed
from .amounts import _is_int
from .counts import _MacModel
from .data import DepthChoice, Plan


def _blocks_kept(model: nn.Module, symmap: SymMap, layers: Any, importance: Any,
                 notes: list[str]) -> dict[str, list[int]]:
    """The blocks ``layers`` keeps, per depth group (:func:`fxsym.depth.choose_blocks`, a
    block of each kind the model needs kept: a swap that took is said in ``notes``)."""
    if layers is None:
        return {}
    counts = (layers.values() if isinstance(layers, Mapping) else [layers])
    scores = None
    if any(_is_int(c) for c in counts):
        if importance is None:
            importance = block_importance([symmap.example_inputs])
        scores = importance if isinstance(importance, Mapping) else importance(model, symmap)
    return choose_blocks(symmap, layers, scores, model=model, notes=notes)


def _without(shapes: Mapping[str, tuple[int, ...]], dropped: frozenset[str]
             ) -> dict[str, tuple[int, ...]]:
    """``shapes`` with the parameters of dropped blocks emptied (for the MAC model)."""
    return {k: (0,) if k in dropped else v for k, v in shapes.items()}


def _with_depth(p: Plan, symmap: SymMap, blocks: Mapping[str, list[int]],
                dropped: frozenset[str], macs: _MacModel) -> Plan:
    """``p`` dropping the blocks not in ``blocks``: shapes under their new names, counts
    without the dropped blocks' parameters."""
    if not blocks:
        return p
    groups = symmap.depth_groups()
    sizes = {g.name: g.size for g in groups}
    shapes = {renamed(k, groups, blocks): v for k, v in p.shapes.items() if k not in dropped}
    return replace(
        p, shapes={k: v for k, v in shapes.items() if k is not None},
        params_after=sum(math.prod(v) for k, v in shapes.items() if k is not None),
        macs_after=macs.count(_without(p.shapes, dropped)),
        depth=tuple(DepthChoice(n, sizes[n], tuple(k)) for n, k in blocks.items()))
