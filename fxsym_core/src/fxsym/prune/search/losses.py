"""A candidate's loss on the calibration batches, in memory (:func:`loss_of`): the plan
applied to a copy of the model, each batch's output scored by the loss a plugin gives
(``fxsym_batch_loss``, :func:`batch_loss`: the hf plugin's next-token cross-entropy where the
model returns ``logits`` for ``input_ids``), else by the mean squared error to the unpruned
model's output (:func:`references`; the tensor of an output a plugin says stands for it,
``fxsym_compared_output``). A checkpoint directory scores its candidates by
streaming instead (:func:`fxsym.prune.checkpoint.stream_losses`), with :func:`batch_loss`.

Imports from fxsym: importance, planning, plugins, symbols.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ...plugins.calls import call_hook
from ...symbols import SymMap
from ..importance import run_batch
from ..planning import Plan


def references(model: nn.Module, batches: Sequence[Any]) -> list[Any]:
    with torch.no_grad():
        return [_output(run_batch(model.eval(), b)) for b in batches]


def _output(out: Any) -> Any:
    """The tensor compared for ``out``: a plugin's (``fxsym_compared_output``, the hf plugin's
    ``logits``), else the first tensor of a tuple or list, else ``out``."""
    compared: torch.Tensor | None = call_hook("fxsym_compared_output", output=out)
    if compared is not None:
        return compared
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return out


def loss_of(model: nn.Module, symmap: SymMap, p: Plan, batches: Sequence[Any],
             loss: Callable[[nn.Module, Any], torch.Tensor] | None,
             reference: list[Any] | None) -> float:
    trial, trial_map = copy.deepcopy((model, symmap))
    p.apply(trial, trial_map)
    trial.eval()
    total = 0.0
    with torch.no_grad():
        for i, batch in enumerate(batches):
            if loss is not None:
                total += float(loss(trial, batch))
                continue
            out = run_batch(trial, batch)
            value = batch_loss(out, batch)
            if value is None:
                assert reference is not None
                value = float(nn.functional.mse_loss(_output(out).float(),
                                                     reference[i].float()))
            total += value
    return total / len(batches)


def batch_loss(out: Any, batch: Any) -> float | None:
    """The loss of a model's output ``out`` on ``batch`` a plugin gives
    (``fxsym_batch_loss``: the hf plugin's next-token cross-entropy where the output holds
    ``logits`` for the batch's ``input_ids``), or ``None`` where none does."""
    value: float | None = call_hook("fxsym_batch_loss", output=out, batch=batch)
    return None if value is None else float(value)
