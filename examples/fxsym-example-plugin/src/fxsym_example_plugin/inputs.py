"""Default example inputs made to match the model: what the example's hook wrapper does."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def model_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype of the model's first floating-point parameter, or ``None``."""
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return None


def like_model(model: Any, inputs: Any) -> Any:
    """``inputs`` (a tuple, a dict or one tensor) with every floating-point tensor cast to
    the model's dtype; anything else is returned as it is."""
    dtype = model_dtype(model) if isinstance(model, nn.Module) else None

    def cast(value: Any) -> Any:
        if dtype is not None and isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(dtype)
        return value

    if isinstance(inputs, tuple):
        return tuple(cast(v) for v in inputs)
    if isinstance(inputs, dict):
        return {k: cast(v) for k, v in inputs.items()}
    return cast(inputs)
