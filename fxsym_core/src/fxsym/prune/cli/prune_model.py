"""``fxsym prune MODEL`` for a model in memory: random batches shaped like its example inputs,
the criterion calibrated on them, the plan by depth and sizes or the architecture search, and
how the directory written loads back (:func:`saved_note`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import FxsymError
from ..request import Checked, PruneRequest
from .models import SAFE_SOURCES

if TYPE_CHECKING:
    import torch
    from torch import nn


def _random_batches(inputs: Any, count: int) -> list[Any]:
    """``count`` batches shaped like ``inputs``: random floats, integer inputs kept."""
    import torch

    def like(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return torch.randn_like(v)
        return v

    if isinstance(inputs, dict):
        return [{k: like(v) for k, v in inputs.items()} for _ in range(count)]
    return [tuple(like(v) for v in inputs) for _ in range(count)]


def _criterion(name: str, count: int, inputs: Any) -> Any:
    """The importance ``name``d; taylor and activation are calibrated on ``count`` random
    inputs of the example shape (a smoke run: with real data, use the library)."""
    import torch

    from .. import importance
    from ..importance import run_batch

    if name not in ("taylor", "activation"):
        return name
    batches = _random_batches(inputs, count)
    if name == "activation":
        return importance.activation(batches, progress=True)

    def self_labelled(model: nn.Module, batch: Any) -> torch.Tensor:
        out = run_batch(model, batch)
        scores = out if isinstance(out, torch.Tensor) else out[0]
        scores = scores.flatten(0, -2) if scores.dim() > 1 else scores[None]
        return torch.nn.functional.cross_entropy(scores, scores.detach().argmax(-1))

    return importance.taylor(self_labelled, batches, progress=True)


def saved_note(source: str | None, output: str) -> str:
    """How the directory ``fxsym prune`` wrote for an in-memory model loads back: as a
    checkpoint where a plugin reads it as one (a Hugging Face model's ``config.json``: the
    reader's :meth:`~fxsym.checkpoint.CheckpointReader.how_to_load`), else with
    :func:`fxsym.load` on a fresh model built as ``source`` says."""
    from ..checkpoint import open_checkpoint

    try:
        return open_checkpoint(output).how_to_load(Path(output))
    except FxsymError:
        pass
    lib, _, name = (source or "").partition(":")
    build = {"torchvision": f"torchvision.models.get_model({name!r}, weights=None)",
             "timm": f"timm.create_model({name!r})"}.get(lib, f"model built as {source} "
                                                          "builds it")
    again = (f"; fxsym analyze {output} and fxsym prune {output} read it too"
             if lib in SAFE_SOURCES else "")
    return (f"load it with fxsym.load(model, {output!r}) on a fresh {build} (the plan is "
            f"replayed on it, then the weights are loaded){again}")


def _plan_architecture(checked: Checked, req: PruneRequest, model: nn.Module, sm: Any,
                       inputs: Any, criterion: Any) -> tuple[Any, str | None]:
    """A plan by depth and sizes (``--layers``, ``--hidden`` ...), or the architecture search
    for a parameter target (:mod:`fxsym.search`; ``--layers K`` fixes the candidates'
    depth): its plan and the table of candidates (``None`` without a search). Calibrated on
    random batches shaped like the example inputs. ``req`` is the request with a
    ``--param-ratio`` made a count of the model's."""
    from ..console import status
    from ..depth import block_importance
    from ..planning import solve as make_plan
    from ..search import search, sizes_for

    batches = _random_batches(inputs, checked.batches)
    count, kind = checked.target
    layers = req.layer_list()
    if checked.searching:
        target = req.target_params if count is None else count  # a --param-ratio's count
        assert target is not None
        with status("searching uniform architectures (each planned and scored)"):
            result = search(model, sm, target_params=target, batches=batches,
                            active=kind == "active", non_embedding=kind == "non_embedding",
                            round_to=max(req.round_to, 1), importance=criterion,
                            depths=(layers,) if isinstance(layers, int) else None,
                            describable=bool(req.describable), exclude=req.exclude,
                            min_keep=req.min_keep, shortlist=checked.shortlist)
        return result.plan, result.table()
    with status("planning (depth and sizes)"):
        return make_plan(model, sm, ratio=req.ratio, target_params=req.target_params,
                         target_non_embedding_params=req.target_non_embedding_params,
                         target_macs=req.target_macs, importance=criterion,
                         scope=checked.scope or "uniform", round_to=req.round_to,
                         min_keep=req.min_keep, exclude=req.exclude, layers=layers,
                         describable=bool(req.describable),
                         depth_importance=None if layers is None else block_importance(
                             batches), sizes=sizes_for(sm, **req.sizes) if req.sizes
                         else None), None
