"""The search's candidates scored on the checkpoint: the next-token loss of the meta model
pruned by a plan (:func:`stream_loss`), run block by block on the checkpoint's tensors cut as
the written checkpoint would hold them (:mod:`.cuts`). All the candidates run in one
streamed run (:func:`stream_losses`, :func:`~.streaming.stream_together`) that reads each
tensor of the checkpoint once, each block kept until the run moves to the next.

Imports from fxsym: depth, errors, importance (ParamLayout), planning, search.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ...errors import CheckpointError
from ..depth import renamed
from ..importance import ParamLayout
from ..planning import Plan
from ..search import batch_loss
from .cuts import first_names, kept_positions
from .memory import trim
from .streaming import Loader, Source, Trial, Watch, block_list, stream_together
from .tensors import Tensors


class _Loss(Watch):
    """The mean loss of the model's outputs a plugin gives (:func:`fxsym.search.batch_loss`)."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def output(self, batch: Any, out: Any) -> None:
        value = batch_loss(out, batch)
        if value is None:
            raise CheckpointError("the search scores a candidate by the loss a plugin gives "
                                  "for the model's output on the calibration batches "
                                  "(fxsym_batch_loss), and no plugin gives one for this model")
        self.values.append(value)


class _Pruned:
    """The checkpoint's tensors as a plan makes them, by their names in the pruned model: the
    input tensor (``before``: its name in the unpruned model) with the positions the plan
    keeps along each dim (``cuts``, by the ParamLayout's first names ``first``)."""

    def __init__(self, tensors: Source, before: Mapping[str, str], first: Mapping[str, str],
                 cuts: Mapping[tuple[str, int], torch.Tensor]) -> None:
        self.tensors, self.before, self.first, self.cuts = tensors, before, first, cuts
        self.directory = tensors.directory

    def has(self, name: str) -> bool:
        return name in self.before

    def read(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        got = self.tensors.read([self.before[n] for n in names])
        out = {}
        for n in names:
            old = self.before[n]
            t = got.pop(old)
            for dim in range(t.dim()):
                index = self.cuts.get((self.first.get(old, old), dim))
                if index is not None:
                    t = t.index_select(dim, index)
            out[n] = t
        return out


def stream_loss(model: nn.Module, symmap: Any, tensors: Tensors, lay: ParamLayout, chosen: Plan,
                batches: Sequence[Any], *, progress: bool = False) -> float:
    """The mean next-token loss on ``batches`` of the meta ``model`` pruned by ``chosen``
    (applied to a copy), run block by block on the pruned tensors: the checkpoint's, cut as
    the written checkpoint would be (``lay``: ``model``'s ParamLayout), one block's in memory at a
    time. ``model`` is not changed."""
    return stream_losses(model, symmap, tensors, lay, [chosen], batches, progress=progress)[0]


def stream_losses(model: nn.Module, symmap: Any, tensors: Tensors, lay: ParamLayout,
                  plans: Sequence[Plan], batches: Sequence[Any], *, progress: bool = False
                  ) -> list[float]:
    """:func:`stream_loss` of each of ``plans``, all in one streamed run that reads each
    tensor of the checkpoint once: the pruned copies run in one lock step
    (:func:`stream_together`) whose gates open in the order of the checkpoint's blocks, each
    block read when the first copy keeping it reaches it and freed when the run moves to the
    next, every copy's tensors cut from it (a block a copy drops is never read for it). The
    tensors of the modules outside the blocks are kept for the whole run: in memory at once,
    one block and those (the embedding, the head), plus each copy's hidden states."""
    import copy

    first = first_names(model)
    depth_groups = symmap.depth_groups()
    found = block_list(model)
    if found is None:
        raise CheckpointError("the model holds no list of blocks to stream through")
    prefix = found[0]
    kept = _Kept(tensors, f"{prefix}.")
    trials, watches = [], []
    for chosen in plans:
        blocks = {d.name: list(d.keep) for d in chosen.depth}
        before: dict[str, str] = {}
        for unit in tensors.units():
            for n in unit:
                new = renamed(n, depth_groups, blocks)
                if new is not None:
                    before[new] = n
        trial, trial_map = copy.deepcopy((model, symmap))
        chosen.apply(trial, trial_map)
        watch = _Loss()
        cuts = kept_positions(lay, chosen.choices())
        sources = next((keep for d, keep in blocks.items()
                        if symmap.depth_group(d).container == prefix), None)
        trials.append(Trial(trial, Loader(trial, _Pruned(kept, before, first, cuts)), watch,
                             sources))
        watches.append(watch)
    try:
        stream_together(trials, batches, reached=kept.reached, progress=progress,
                         description="scoring")
    finally:
        kept.clear()
    return [sum(w.values) / len(w.values) for w in watches]


class _Kept:
    """The checkpoint's tensors, each read once for several pruned copies
    (:func:`stream_losses`): a block's (named under ``prefix``) kept until the run reaches
    the next block (:meth:`reached`), the others until :meth:`clear`."""

    def __init__(self, tensors: Tensors, prefix: str) -> None:
        self.tensors, self.prefix = tensors, prefix
        self.directory = tensors.directory
        self.held: dict[str, torch.Tensor] = {}
        self.block = f"{prefix}-1."

    def has(self, name: str) -> bool:
        return self.tensors.has(name)

    def read(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        missing = [n for n in names if n not in self.held]
        if missing:
            self.held.update(self.tensors.read(missing))
        return {n: self.held[n] for n in names}

    def reached(self, block: int) -> None:
        """The run is at checkpoint block ``block``: the tensors of the one before go."""
        if self.block == f"{self.prefix}{block}.":
            return
        gone = [n for n in self.held if n.startswith(self.block)]
        for n in gone:
            del self.held[n]
        self.block = f"{self.prefix}{block}."
        if gone:
            trim()

    def clear(self) -> None:
        self.held.clear()
        trim()
