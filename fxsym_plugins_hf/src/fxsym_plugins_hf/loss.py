"""The loss a language model's output is scored by (the ``fxsym_batch_loss`` hook): the
next-token cross-entropy of its ``logits`` for the batch's ``input_ids``.

fxsym's architecture search (in memory and streamed from a checkpoint) scores each candidate
by the mean of this loss over the calibration batches; an output without logits for the
batch's tokens is no language model's here (``None``: another plugin, or the search's mean
squared error to the unpruned output, decides).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn


def _logits(out: object) -> object:
    """The logits of a model's output: its ``logits`` (a transformers ``ModelOutput``), the
    first tensor of a tuple, or the output itself."""
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return out


def compared_output(out: object) -> torch.Tensor | None:
    """The ``logits`` of a model's output (a transformers ``ModelOutput``), what the
    ``fxsym_compared_output`` hook gives; ``None`` for any other output."""
    logits = getattr(out, "logits", None)
    return logits if isinstance(logits, torch.Tensor) else None


def next_token_loss(out: object, batch: object) -> float | None:
    """The next-token cross-entropy of a model's output ``out`` on ``batch``, where the
    output holds ``logits`` for the batch's ``input_ids``; else ``None``."""
    logits = _logits(out)
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    if not (isinstance(ids, torch.Tensor) and isinstance(logits, torch.Tensor)
            and logits.dim() == 3 and logits.shape[:2] == ids.shape):
        return None
    return float(nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                             ids[:, 1:].flatten()))
