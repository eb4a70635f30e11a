"""How a ``save_pretrained`` directory stores a model's tensors when not under the model's own
names and layout: transformers' checkpoint conversion mapping, applied one tensor at a time.

transformers 5 keeps a mixture-of-experts layer's experts fused in memory
(``mlp.experts.gate_up_proj`` ``[E, 2I, H]``, ``mlp.experts.down_proj`` ``[E, H, I]``) while
``save_pretrained`` writes one tensor per expert and projection, under the names the family
has always used (Mixtral: ``block_sparse_moe.experts.{e}.w1/w2/w3.weight``; Qwen2/3-MoE,
OLMoE: ``mlp.experts.{e}.gate_proj/up_proj/down_proj.weight``), and ``from_pretrained``
converts back. Both directions are transformers' own: the mapping of the model
(:func:`transformers.conversion_mapping.get_model_conversion_mapping`) names each stored
tensor's model tensor and the operations making it (stack the experts, concatenate gate and
up); :func:`transformers.core_model_loading.revert_weight_conversion` is what
``save_pretrained`` does to a state dict. :class:`StoredTensors` applies them to the few
tensors of one model tensor at a time, so a streamed prune holds one layer's experts, never
the model, and writes the layout ``save_pretrained`` writes (which ``from_pretrained`` and
every other reader of the family's checkpoints read).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from fxsym.errors import CheckpointError

from .configs import NONUNIFORM


class StoredTensors:
    """The stored names and layout of the tensors of ``model`` (a transformers model, on the
    meta device) in a directory holding the tensors ``stored`` (their names):
    a :class:`fxsym.checkpoint.StoredLayout`.

    * :attr:`renamed`: ``{model tensor: stored tensor}`` for a tensor stored whole under
      another name (Mixtral's router, ``block_sparse_moe.gate.weight``);
    * :attr:`fused`: ``{model tensor: its stored tensors, in order}`` for a tensor made of
      several (a layer's fused experts from one tensor per expert);
    * :meth:`load` makes a fused tensor from its stored tensors, :meth:`store` gives the stored
      tensors of model tensors (real or meta) as ``save_pretrained`` writes them.
    """

    def __init__(self, model: nn.Module, stored: Sequence[str]) -> None:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import (
            WeightConverter,
            WeightRenaming,
            dot_natural_key,
            rename_source_key,
        )

        self.model = model
        mapping = get_model_conversion_mapping(model)  # type: ignore[arg-type]
        renamings = [t for t in mapping if isinstance(t, WeightRenaming)]
        converters = [t for t in mapping if isinstance(t, WeightConverter)]
        by_pattern = {p: c for c in converters for p in c.source_patterns}
        meta = dict(model.state_dict(keep_vars=True))
        prefix = getattr(model, "base_model_prefix", None)
        self.renamed: dict[str, str] = {}
        self.fused: dict[str, list[str]] = {}
        self._sources: dict[str, list[tuple[str, str]]] = {}
        self._converter: dict[str, Any] = {}
        for key in sorted(stored, key=dot_natural_key):
            name, pattern = rename_source_key(key, renamings, converters, prefix, meta)
            if name not in meta and key in meta:
                name, pattern = key, None
            if name not in meta or (name == key and pattern is None):
                continue
            if pattern is None:
                self.renamed[name] = key
                continue
            self.fused.setdefault(name, []).append(key)
            self._sources.setdefault(name, []).append((key, pattern))
            self._converter.setdefault(name, by_pattern[pattern])

    def load(self, name: str, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Fused model tensor ``name`` made from its stored tensors (``tensors``, by stored
        name), by the operations of transformers' converter."""
        converter = copy.deepcopy(self._converter[name])
        for key, pattern in self._sources[name]:
            converter.add_tensor(name, key, pattern, tensors[key])
        try:
            made = converter.convert(name, model=self.model, config=getattr(self.model, "config",
                                                                            None))
        except Exception as exc:
            raise CheckpointError(f"cannot make {name} from its stored tensors "
                                  f"({self.fused[name][0]}, ...): {exc}") from exc
        out = made.get(name)
        if isinstance(out, list):
            out = out[0]
        if not isinstance(out, torch.Tensor):
            raise CheckpointError(f"transformers' conversion of {self.fused[name][0]}, ... "
                                  f"gives no {name}")
        return out

    def store(self, model: nn.Module, tensors: Mapping[str, torch.Tensor]
              ) -> dict[str, torch.Tensor]:
        """The tensors ``save_pretrained`` of ``model`` (pruned: its config holds the sizes
        after the plan) writes for ``tensors`` (model tensors by name, all those a converter
        fuses together), by stored name; meta tensors give the names and shapes. A model whose
        config cannot describe it (sizes differ between layers) is read back by
        :func:`fxsym.load`, which reads the model's own names and layout: ``tensors`` as
        they are."""
        from transformers.core_model_loading import revert_weight_conversion

        if getattr(getattr(model, "config", None), NONUNIFORM, None):
            return dict(tensors)
        try:
            return dict(revert_weight_conversion(model, dict(tensors)))  # type: ignore[arg-type]
        except Exception as exc:
            raise CheckpointError(f"cannot give the stored layout of {next(iter(tensors))}: "
                                  f"{exc}") from exc
