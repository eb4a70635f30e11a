"""Running a model for an oracle and comparing what it gives.

:func:`run_model` runs a model on example inputs and flattens the tensors of the outputs a
contract keeps (:mod:`fxsym.analysis.outputs`); ``_close`` compares two runs at a tolerance
relative to each output's scale; ``_bound`` gives the SymMap of the model checked (a fresh
analysis when the one given was computed for another model); ``_cast_inputs`` casts floating
inputs to the dtype a copy runs in; ``_attribute`` reads a tensor by its dotted name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..analysis import analyze
from ..analysis.outputs import Contract, select_outputs
from ..symbols import SymMap


def run_model(model: nn.Module, example_inputs: Any,
              contract: Contract | None = None) -> list[torch.Tensor]:
    """Run ``model`` on example inputs; the tensors of the outputs in ``contract`` (default:
    every output; see :mod:`fxsym.analysis.outputs`), flattened."""
    with torch.no_grad():
        if isinstance(example_inputs, dict):
            out = model(**example_inputs)
        elif isinstance(example_inputs, (tuple, list)):
            out = model(*example_inputs)
        else:
            out = model(example_inputs)
    if contract is None:
        picked = [out.to_tuple() if hasattr(out, "to_tuple") else out]
    else:
        picked = select_outputs(out, contract, strict=False)
    return [t for t in pytree.tree_leaves(picked) if isinstance(t, torch.Tensor)]


def _close(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], rtol: float, atol: float) -> bool:
    # summation order changes under a permutation: tolerate float error relative to the
    # output's scale (random-weight models can have large outputs)
    return len(a) == len(b) and all(
        x.shape == y.shape and torch.allclose(
            x.double(), y.double(), rtol=rtol,
            atol=atol * max(1.0, float(x.double().abs().max()) if x.numel() else 1.0))
        for x, y in zip(a, b)
    )


def _bound(model: nn.Module, symmap: SymMap, example_inputs: Any) -> SymMap:
    """``symmap`` if it was computed for ``model``, else a fresh analysis of ``model``."""
    if symmap.model is model:
        return symmap
    return analyze(model, example_inputs=example_inputs)


def _cast_inputs(example_inputs: Any, dtype: torch.dtype) -> Any:
    return pytree.tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor)
                           and t.is_floating_point() else t, example_inputs)


def _attribute(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
    return obj
