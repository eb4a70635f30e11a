"""How a ``save_pretrained`` directory stores a model's tensors when not under the model's own
names and layout: transformers' checkpoint conversion mapping, applied one tensor at a time.

transformers 5 relates the tensors of the files to the model's in three ways:

* *many to one*: a mixture-of-experts layer's experts are fused in memory
  (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``, ``mlp.experts.down_proj`` ``[E, H, I]``) while
  ``save_pretrained`` writes one tensor per expert and projection, under the names the family
  has always used (Mixtral: ``block_sparse_moe.experts.{e}.w1/w2/w3.weight``; Qwen2/3-MoE,
  OLMoE: ``mlp.experts.{e}.gate_proj/up_proj/down_proj.weight``);
* *one to many*: one stored tensor is split into several parameters (Sarvam-MoE's
  ``attention.query_key_value`` into ``self_attn.q_proj/k_proj/v_proj``, by each one's size;
  HRM's ``attn.gqkv_proj`` into four equal chunks; Lara's ``linear_attn.in_proj`` into the
  gated delta net's four input projections);
* *one to one*: a tensor stored whole under another name (Mixtral's router,
  ``block_sparse_moe.gate.weight``).

``from_pretrained`` converts the files' tensors to the model's. Both directions are
transformers' own: the mapping of the model
(:func:`transformers.conversion_mapping.get_model_conversion_mapping`) names each stored
tensor's model tensor and the operations making it (stack the experts, concatenate gate and
up, split the rows); :func:`transformers.core_model_loading.revert_weight_conversion` is what
``save_pretrained`` does to a state dict. Nothing here knows a family: which parameters one
stored tensor becomes is asked of transformers, by running its conversion on meta tensors of
the shapes ``save_pretrained`` writes for the model (a *probe*: names and shapes, no memory).

:class:`StoredTensors` applies them to the few tensors of one conversion at a time, so a
streamed prune holds one layer's experts (or one fused projection), never the model, and
writes the layout ``save_pretrained`` writes (which ``from_pretrained`` and every other
reader of the family's checkpoints read). A pruned layout is checked before it is written:
the tensors :meth:`StoredTensors.store` gives must load back, by transformers' own
conversion for the pruned model, into the pruned tensors' names and shapes (an equal-chunk
split cannot give parameters the plan sized apart); where not, a
:class:`fxsym.errors.CheckpointError` names the stored tensor and the parameters it becomes.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fxsym.errors import CheckpointError

from .configs import NONUNIFORM


@dataclass
class _Conversion:
    """One conversion transformers makes when it loads: the stored tensors ``sources``
    (``(stored name, pattern matched)``) made by ``converter`` into the model tensors
    ``targets``, under the name ``layer`` (the first target: what transformers converts
    under)."""

    converter: Any
    layer: str
    sources: list[tuple[str, str]] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)

    def stored(self) -> list[str]:
        return [key for key, _ in self.sources]


class _AsBuilt:
    """What transformers' conversion reads of the model while it loads (a parameter's size:
    ``Split``; the config: ``Chunk`` by a config field), as the reader built it: the model
    itself is resized by the plan before the input's tensors are read to be written."""

    def __init__(self, model: nn.Module) -> None:
        self.config = copy.deepcopy(getattr(model, "config", None))
        self.params = {n: torch.empty(p.shape, dtype=p.dtype, device="meta")
                       for n, p in model.named_parameters(remove_duplicate=False)}

    def get_parameter(self, target: str) -> torch.Tensor:
        try:
            return self.params[target]
        except KeyError:
            raise AttributeError(f"the model has no parameter {target}") from None


class StoredTensors:
    """The stored names and layout of the tensors of ``model`` (a transformers model, on the
    meta device) in a directory holding the tensors ``stored`` (their names):
    a :class:`fxsym.prune.checkpoint.StoredLayout`.

    * :attr:`renamed`: ``{model tensor: stored tensor}`` for a tensor stored whole under
      another name (Mixtral's router, ``block_sparse_moe.gate.weight``);
    * :attr:`fused`: ``{model tensor: its stored tensors, in order}`` for a tensor made by a
      conversion: from several stored tensors (a layer's fused experts from one tensor per
      expert), or with others from one (q, k and v from one ``query_key_value``); the model
      tensors of one conversion have the same stored tensors;
    * :meth:`load` makes a model tensor from its stored tensors, :meth:`store` gives the
      stored tensors of model tensors (real or meta) as ``save_pretrained`` writes them.

    A stored tensor transformers splits into parameters the model does not hold as it says
    raises :class:`~fxsym.errors.CheckpointError` naming both.
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
        self._built = _AsBuilt(model)
        mapping = get_model_conversion_mapping(model)  # type: ignore[arg-type]
        self._renamings = renamings = [t for t in mapping if isinstance(t, WeightRenaming)]
        self._converters = converters = [t for t in mapping if isinstance(t, WeightConverter)]
        self._by_pattern = by_pattern = {p: c for c in converters for p in c.source_patterns}
        meta = dict(model.state_dict(keep_vars=True))
        self._prefix = prefix = getattr(model, "base_model_prefix", None)
        self.renamed: dict[str, str] = {}
        self.fused: dict[str, list[str]] = {}
        self._made: dict[str, _Conversion] = {}
        conversions: dict[str, _Conversion] = {}
        for key in sorted(stored, key=dot_natural_key):
            name, pattern = rename_source_key(key, renamings, converters, prefix, meta)
            if name not in meta and key in meta:
                name, pattern = key, None
            if name not in meta or (name == key and pattern is None):
                continue
            if pattern is None:
                self.renamed[name] = key
                continue
            conversions.setdefault(name, _Conversion(by_pattern[pattern], name)).sources.append(
                (key, pattern))
        written: dict[str, torch.Tensor] | None = None
        for made in conversions.values():
            if len(made.converter.target_patterns) == 1:
                made.targets = [made.layer]
            else:  # one stored tensor made into several: which, asked of transformers
                if written is None:
                    written = self._written(meta)
                made.targets = self._targets(made, written, meta)
            for target in made.targets:
                self.fused[target] = made.stored()
                self._made[target] = made

    def _written(self, meta: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What ``save_pretrained`` writes for the whole model, on the meta device (names
        and shapes)."""
        from transformers.core_model_loading import revert_weight_conversion

        metas = {n: torch.empty(t.shape, dtype=t.dtype, device="meta")
                 for n, t in meta.items()}
        try:
            return dict(revert_weight_conversion(self.model, metas))  # type: ignore[arg-type]
        except Exception as exc:
            raise CheckpointError(f"cannot tell how save_pretrained stores this model: "
                                  f"transformers' conversion of its tensors fails: {exc}"
                                  ) from exc

    def _targets(self, made: _Conversion, written: Mapping[str, torch.Tensor],
                 meta: Mapping[str, torch.Tensor]) -> list[str]:
        """The model tensors transformers makes of ``made``'s stored tensors: its conversion
        run on meta tensors of the shapes ``save_pretrained`` writes; each must be a tensor of
        the model, of the shape it makes."""
        keys = made.stored()
        patterns = ", ".join(made.converter.target_patterns)
        missing = [k for k in keys if k not in written]
        if missing:
            raise CheckpointError(
                f"{missing[0]} is stored as one tensor transformers makes into several "
                f"({made.layer}, ... of {patterns}), but save_pretrained of the model the config "
                f"builds writes no {missing[0]}: cannot tell which parameters it becomes")
        got = self._convert(made, {k: written[k] for k in keys}, self._built)
        wrong = [(n, tuple(t.shape)) for n, t in got.items()
                 if n not in meta or tuple(meta[n].shape) != tuple(t.shape)]
        if not got or wrong:
            said = ", ".join(f"{n} {s}" for n, s in wrong) or "nothing"
            raise CheckpointError(
                f"{', '.join(keys)}: transformers makes it into {said}, which the model the "
                f"config builds does not hold (its parameters {patterns} of {made.layer})")
        return list(got)

    def _convert(self, made: _Conversion, tensors: Mapping[str, torch.Tensor],
                 model: nn.Module | _AsBuilt) -> dict[str, torch.Tensor]:
        """``made``'s conversion (transformers' converter) of ``tensors`` (by stored name), for
        ``model``: the model tensors by name."""
        converter = copy.deepcopy(made.converter)
        for key, pattern in made.sources:
            converter.add_tensor(made.layer, key, pattern, tensors[key])
        try:
            out = converter.convert(made.layer, model=model,
                                    config=getattr(model, "config", None))
        except Exception as exc:
            raise CheckpointError(f"cannot make {made.layer} from its stored tensors "
                                  f"({made.sources[0][0]}, ...): {exc}") from exc
        return {n: t[0] if isinstance(t, list) else t for n, t in out.items()}

    def load(self, name: str, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Model tensor ``name`` made from its stored tensors (``tensors``, by stored name),
        by the operations of transformers' converter."""
        made = self._made[name]
        out = self._convert(made, tensors, self._built).get(name)
        if not isinstance(out, torch.Tensor):
            raise CheckpointError(f"transformers' conversion of {made.sources[0][0]}, ... "
                                  f"gives no {name}")
        return out

    def store(self, model: nn.Module, tensors: Mapping[str, torch.Tensor]
              ) -> dict[str, torch.Tensor]:
        """The tensors ``save_pretrained`` of ``model`` (pruned: its config holds the sizes
        after the plan) writes for ``tensors`` (model tensors by name, all those a converter
        makes together), by stored name; meta tensors give the names and shapes. They must
        load back, by transformers' conversion for ``model``, into ``tensors``' names and
        shapes (:class:`~fxsym.errors.CheckpointError` naming them where not). A model whose
        config cannot describe it (sizes differ between layers) is read back by
        :func:`fxsym.load`, which reads the model's own names and layout: ``tensors`` as
        they are."""
        from transformers.core_model_loading import revert_weight_conversion

        if getattr(getattr(model, "config", None), NONUNIFORM, None):
            return dict(tensors)
        try:
            out = dict(revert_weight_conversion(model, dict(tensors)))  # type: ignore[arg-type]
        except Exception as exc:
            raise CheckpointError(f"cannot give the stored layout of {next(iter(tensors))}: "
                                  f"{exc}") from exc
        self._round_trip(model, tensors, out)
        return out

    def _round_trip(self, model: nn.Module, tensors: Mapping[str, torch.Tensor],
                    out: Mapping[str, torch.Tensor]) -> None:
        """Raise unless the stored tensors ``out`` of ``tensors`` load back, for ``model``, as
        ``from_pretrained`` loads them (renamed, converted), into ``tensors``' names and shapes
        (checked on meta tensors: nothing is copied)."""
        from transformers.core_model_loading import dot_natural_key, rename_source_key

        meta = {n: torch.empty(t.shape, dtype=t.dtype, device="meta") for n, t in tensors.items()}
        back: dict[str, tuple[int, ...]] = {}
        conversions: dict[str, _Conversion] = {}
        for key in sorted(out, key=dot_natural_key):
            name, pattern = rename_source_key(key, self._renamings, self._converters,
                                              self._prefix, meta)
            if pattern is None:
                back[name] = tuple(out[key].shape)
            else:
                conversions.setdefault(name, _Conversion(self._by_pattern[pattern], name)
                                       ).sources.append((key, pattern))
        for made in conversions.values():
            metas = {k: torch.empty(out[k].shape, dtype=out[k].dtype, device="meta")
                     for k in made.stored()}
            back.update((n, tuple(t.shape)) for n, t in self._convert(made, metas, model).items())
        want = {n: tuple(t.shape) for n, t in tensors.items()}
        if back != want:
            ops = "; ".join(", ".join(repr(op) for op in c.converter.operations)
                            for c in conversions.values())
            raise CheckpointError(
                f"{', '.join(out)}: transformers stores {_shapes(want)} so ({ops}); written "
                f"for the pruned model, {'it loads' if len(out) == 1 else 'they load'} back as "
                f"{_shapes(back) or 'nothing'}: the plan cannot be written in the checkpoint's "
                "layout (keep these parameters' sizes alike: exclude the groups that size them "
                "apart)")


def _shapes(tensors: Mapping[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{n} {s}" for n, s in tensors.items())
