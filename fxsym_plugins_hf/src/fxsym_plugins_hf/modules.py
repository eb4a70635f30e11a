"""SymInfos of transformers' own building blocks that are not attention.

* ``transformers.pytorch_utils.Conv1D`` (GPT-2 and relatives): a linear layer whose weight is
  stored transposed, ``(in, out)``, with its sizes kept in ``nx``/``nf`` (``forward`` reads
  ``nf``). Described like ``nn.Linear``.

* the activation modules of ``transformers.activations`` (``ACT2CLS``, found in models by
  :mod:`.discovery`): elementwise, so shape-preserving leaves. Traced through, some would be
  opaque (``GELUTanh`` calls a ``functools.partial`` of ``F.gelu``, which no op rule can
  name).

Norms need no SymInfo: each family's RMSNorm (``LlamaRMSNorm``, ``T5LayerNorm``, ...) is traced
through, and its ``weight`` becomes a parameter member tied to the hidden-size group by the
elementwise product; ``nn.LayerNorm`` is described by the nn plugin.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fxsym import Symbol, SymInfo
from fxsym.resizing import l1_scores, resize_projection

IN = Symbol.CLType.INCOMING
OUT = Symbol.CLType.OUTGOING

CONV1D = "transformers.pytorch_utils.Conv1D"


def projection_info() -> SymInfo:
    """The symbols of a linear projection: input features in, searchable output features out."""
    return SymInfo(
        in_features=Symbol(cl_type=IN, elastic_dims={-1}),
        out_features=Symbol(is_searchable=True, cl_type=OUT, elastic_dims={-1}),
    )


def conv1d_info(mod: nn.Module) -> SymInfo:
    """GPT-2's Conv1D is a linear layer with a transposed weight: the same symbols."""
    return projection_info()


def conv1d_resize(mod: Any, name: str, index: torch.Tensor) -> None:
    resize_projection(mod, name, index, in_dim=0, out_dim=1, size_attrs=("nx", "nf"))


def linear_resize(mod: nn.Linear, name: str, index: torch.Tensor) -> None:
    """Keep input or output features of an ``nn.Linear`` projection inside an attention leaf."""
    resize_projection(mod, name, index)


def conv1d_importance(mod: Any, name: str) -> torch.Tensor:
    return l1_scores(mod.weight, 1)


def activation_info(mod: Any) -> SymInfo:
    return SymInfo(is_shape_preserving=True)


def no_resize(mod: Any, name: str, index: torch.Tensor) -> None:
    """Elementwise activations hold nothing sized."""
