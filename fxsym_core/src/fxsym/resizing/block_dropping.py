"""Dropping blocks of a depth group (:class:`~fxsym.symbols.DepthGroup`).

A choice for a depth group is the list of blocks to keep, in increasing order (blocks are
not reordered: unlike a group's units, their order is what the model computes). The
container keeps the modules of the kept blocks, renumbered ``0 .. K-1`` (a ``Sequential``
with names of its own keeps them), and every attribute that counts the blocks
(``DepthGroup.positions``: ``layer_idx``, in the blocks that hold it: a hybrid stack's
attention sits in some blocks only) is set to the block's new position. Then the
plugins' ``fxsym_after_depth`` hooks update what describes the model (a Hugging Face
config's ``num_hidden_layers`` and per-layer lists). A group whose blocks read per-position
values (``varying_inputs``) is refused unless a plugin says it made their choice follow.

The caller (:func:`fxsym.resize`) holds the transaction: everything here rebinds
(the container's children, int attributes), nothing is written in place.

Imports from fxsym: errors, plugins, symbols.
"""

from __future__ import annotations

import itertools
import numbers
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..errors import ResizeError
from ..plugins.calls import call_each
from ..symbols import DepthGroup, SymMap

__all__ = ["depth_choices", "drop_blocks"]


def depth_choices(symmap: SymMap, choices: Mapping[str, Any]) -> dict[str, list[int]]:
    """The depth group choices among ``choices``, each checked: a list (or 1-D integer
    tensor) of distinct block positions, increasing, at least one."""
    groups = {g.name: g for g in symmap.depth_groups()}
    out: dict[str, list[int]] = {}
    for name, choice in choices.items():
        group = groups.get(name)
        if group is None:
            continue
        if isinstance(choice, torch.Tensor):
            if choice.dim() != 1 or choice.is_floating_point() or choice.is_complex():
                raise ResizeError(f"depth group {name!r}: give a 1-D integer tensor or list of "
                                  "the blocks to keep")
            choice = choice.cpu().tolist()
        if isinstance(choice, numbers.Integral):
            raise ResizeError(f"depth group {name!r}: give the blocks to keep, not a count "
                              f"(fxsym.plan(..., layers={int(choice)}) ranks them)")
        try:
            kept = list(choice)
        except TypeError:
            raise ResizeError(f"depth group {name!r}: {choice!r} is not a list of blocks") \
                from None
        if not kept or not all(isinstance(i, numbers.Integral) and not isinstance(i, bool)
                               for i in kept):
            raise ResizeError(f"depth group {name!r}: keep at least one block, each given by "
                              f"its position (an int); got {kept!r}")
        kept = [int(i) for i in kept]
        if any(not 0 <= i < group.size for i in kept):
            raise ResizeError(f"depth group {name!r}: a position out of [0, {group.size}) in "
                              f"{kept}")
        if any(b <= a for a, b in itertools.pairwise(kept)):
            raise ResizeError(f"depth group {name!r}: the blocks to keep must be distinct and "
                              f"increasing (blocks keep their order), got {kept}")
        out[name] = kept
    return out


def drop_blocks(model: nn.Module, symmap: SymMap, kept: Mapping[str, list[int]]) -> None:
    """Keep the blocks ``kept[name]`` of each depth group; see the module docstring."""
    groups = {g.name: g for g in symmap.depth_groups()}
    for name, positions in kept.items():
        group = groups[name]
        if len(positions) == group.size:
            continue
        container = model.get_submodule(group.container)
        items = list(container.named_children())
        if len(items) != group.size:
            raise ResizeError(f"{group.container} holds {len(items)} blocks, the analysis saw "
                              f"{group.size}; analyze again")
        numbered = [k for k, _ in items] == [str(i) for i in range(len(items))]
        for key, _ in items:
            delattr(container, key)
        for j, i in enumerate(positions):
            key, block = items[i]
            container.add_module(str(j) if numbered else key, block)
            for path, attr in group.positions:  # where this block holds one
                holder = _submodule(block, path)
                if holder is not None and type(vars(holder).get(attr)) is int:
                    setattr(holder, attr, j)
        _after_depth(model, symmap, group, positions)


def _submodule(block: nn.Module, path: str) -> nn.Module | None:
    try:
        return block.get_submodule(path)
    except AttributeError:
        return None


def _after_depth(model: nn.Module, symmap: SymMap, group: DepthGroup,
                 positions: list[int]) -> None:
    pm = symmap.registry.plugin_manager
    failed = len(pm.failed)
    followed: list[str] = []
    args = {"model": model, "group": group, "kept": list(positions)}
    with warnings.catch_warnings(record=True) as issued:
        warnings.simplefilter("always")
        for _, answer in call_each(pm, "fxsym_after_depth", lambda _: args):
            if answer:
                followed.extend(str(a) for a in answer)
    for w in issued:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if len(pm.failed) > failed:
        failure = pm.failed[failed]
        raise ResizeError(f"plugin {failure.name!r} failed: {failure.error}")
    if group.varying_inputs and not followed:
        raise ResizeError(
            f"the blocks of {group.container} read values chosen by their position "
            f"({group.varying_inputs[0]}) and no plugin made that choice follow the kept "
            "blocks: dropping some would give the others another block's values")
