"""Importance of a checkpoint's units, streamed, one of

* *activation* (:func:`stream_activations`): a streamed run (:mod:`.streaming`) while an
  :class:`~fxsym.importance.ActivationRecorder` watches the members of the block the batches
  pass (and the modules outside the blocks); per block, ``1 - cos`` between its input and
  output hidden states (ShortGPT's block importance) is kept too (:class:`StreamedScores`);
* *weights* (``l1``, ``l2``: :func:`weight_scores`): each parameter read, scored and dropped
  in turn, its memory given back before the next is read
  (:func:`fxsym.importance.element_scores` with a reader).

Imports from fxsym: errors, importance (console inside a function).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...errors import CheckpointError
from ..importance import ActivationRecorder, ParamLayout, element_scores
from .memory import trim
from .streaming import Loader, Watch, block_list, stream
from .tensors import Tensors

#: the old fields of :class:`StreamedScores`, each now a key of its ``usage`` (the hf plugin's
#: records' names), kept as deprecated aliases
DEPRECATED_FIELDS = ("expert_load", "expert_activation")


@dataclass
class StreamedScores:
    """What a streamed calibration run gives: per group, one score per unit; per block of
    the block list (:func:`block_list`), ``1 - cos`` of its input and output hidden states
    averaged over the tokens (ShortGPT's block importance: low is a block that changes little);
    what the plugins' usage recorders record beside their scores (``usage``: ``{name: {group:
    one number per unit}}``, :meth:`fxsym.importance.ActivationRecorder.records`; the hf
    plugin's ``expert_load`` and ``expert_activation``, each expert's router load and Minitron
    activation).
    """

    scores: dict[str, torch.Tensor]
    block_importance: list[float] = field(default_factory=list)
    blocks: str = ""
    usage: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def __getattr__(self, name: str) -> dict[str, list[float]]:
        """The old fields (:data:`DEPRECATED_FIELDS`): ``usage[name]``, with a
        ``DeprecationWarning``."""
        if name in DEPRECATED_FIELDS:
            warnings.warn(f"StreamedScores.{name} is deprecated: read "
                          f"StreamedScores.usage[{name!r}]", DeprecationWarning, stacklevel=2)
            usage: dict[str, dict[str, list[float]]] = vars(self).get("usage", {})
            return usage.get(name, {})
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def _under(prefix: str) -> Callable[[str], bool]:
    return lambda qualname: qualname.startswith(prefix)


class _Activations(Watch):
    """Minitron's activation importance of the members inside each block while it runs and
    outside the blocks in the last run; ShortGPT's ``1 - cos`` per block."""

    def __init__(self, recorder: ActivationRecorder, prefix: str, n: int) -> None:
        self.recorder, self.prefix = recorder, prefix
        self.inside = [f"{prefix}.{i}." for i in range(n)]
        self.cos = [0.0] * n
        self.count = [0] * n

    def block(self, i: int) -> list[Any]:
        return self.recorder.attach(_under(self.inside[i]))

    def pair(self, i: int, h: torch.Tensor, o: torch.Tensor) -> None:
        sim = nn.functional.cosine_similarity(h.flatten(0, -2).double(),
                                              o.flatten(0, -2).double(), dim=-1)
        self.cos[i] += float(sim.sum())
        self.count[i] += sim.numel()

    def rest(self) -> list[Any]:
        return self.recorder.attach(lambda q: not any(q.startswith(p) for p in self.inside)
                                    and q != self.prefix)

    def importance(self) -> list[float]:
        return [1 - c / max(n, 1) for c, n in zip(self.cos, self.count)]


def stream_activations(model: nn.Module, symmap: Any, tensors: Tensors, batches: Sequence[Any],
                       *, consumers_only: bool = True, progress: bool = False
                       ) -> StreamedScores:
    """Activation importance of the groups of ``symmap`` (the meta ``model``'s analysis) on
    ``batches``, computed block by block (see :mod:`.streaming`). ``model``'s parameters
    are on the meta device again when this returns."""
    found = block_list(model)
    if found is None:
        raise CheckpointError("the model holds no list of blocks to stream through")
    recorder = ActivationRecorder(model, symmap, consumers_only=consumers_only)
    watch = _Activations(recorder, found[0], len(found[1]))
    stream(model, Loader(model, tensors), batches, watch, progress=progress)
    return StreamedScores(recorder.scores(), watch.importance(), found[0], recorder.records())


def weight_scores(model: nn.Module, symmap: Any, tensors: Tensors, name: str, lay: ParamLayout,
                   *, progress: bool = False) -> dict[str, torch.Tensor]:
    """``l1`` / ``l2`` of the checkpoint's weights, one parameter in memory at a time (a step
    of the progress bar each: the parameters the groups slice, ``lay``). The memory a
    parameter's scores took is given back (:func:`trim`) before the next is read: the C
    library kept it otherwise, and the peak grew with every layer scored (a Mixtral-shaped
    checkpoint: 97 MiB more at 10 layers than at 3; 5 MiB with the trim)."""
    import contextlib

    from ..console import steps

    read = len({s.param for g in symmap.groups() if g.size >= 2
                for s in lay.slices.get(g.name, ())})
    with (steps(read, description=f"scoring the weights ({name})") if progress
          else contextlib.nullcontext(lambda label: None)) as step:
        def one(n: str) -> torch.Tensor:
            step(n)
            trim()
            return tensors.one(n)

        if name == "l1":
            return element_scores(model, symmap, lambda n, p: p.double().abs(), tensors=one)
        return element_scores(model, symmap, lambda n, p: p.double().square(), torch.sqrt,
                              tensors=one)
