"""A ``save_pretrained`` directory read for :func:`fxsym.prune_checkpoint` (the
``fxsym_checkpoint_reader`` hook): :class:`PretrainedDirectory`.

* the model is built from ``config.json`` with its parameters on the meta device and its
  buffers computed (rotary frequencies, which no weight file holds): each parameter is moved
  to the meta device as the module registers it (:func:`parameters_on_meta`, the idea of
  accelerate's ``init_empty_weights(include_buffers=False)``; the memory a module asks for
  before that is never touched), and transformers' weight initialisation is skipped. The class
  is the config's architecture, a class of the ``transformers`` package (nothing from the
  directory is imported), else the ``AutoModelForCausalLM`` mapping's; parameters take the
  config's ``dtype`` and are tied as ``from_pretrained`` ties them;
* the tensors are where ``model.safetensors.index.json`` says, else in ``model.safetensors``,
  under the names and in the layout ``save_pretrained`` writes, which transformers' conversion
  mapping relates to the model's (:mod:`.stored`: a MoE layer's experts, fused in the model,
  are one tensor per expert in the files);
* calibration text is tokenised with the directory's own tokenizer (``AutoTokenizer``, local
  files only), the texts' tokens concatenated (each text ended by the end-of-sequence token)
  and cut into sequences.

Every failure is a :class:`fxsym.CheckpointError` (:class:`fxsym.CalibrationError` for the
tokenizer) saying which file.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fxsym.errors import CalibrationError, CheckpointError
from fxsym.prune.paths import kind

from .stored import StoredTensors

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
#: the most bytes of buffers (tables the model computes when built: rotary frequencies,
#: masks, positions) a checkpoint's config may ask for; a real model's are a few MB
MAX_BUFFER_BYTES = 2**30
#: the largest index read (a model of a million tensors names them in well under this)
MAX_INDEX_BYTES = 64 * 2**20


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """While the block runs, every parameter a module registers is put on the meta device
    (buffers are not). Not thread safe: it patches ``nn.Module.register_parameter``."""
    original = nn.Module.register_parameter

    def register(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = type(param)(param.to("meta"), requires_grad=param.requires_grad)
        original(self, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


class PretrainedDirectory:
    """A :class:`fxsym.prune.checkpoint.CheckpointReader` of a transformers checkpoint directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _config(self) -> Any:
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(self.directory, local_files_only=True)
        except Exception as exc:
            raise CheckpointError(f"{self.directory / 'config.json'}: not a config "
                                  f"transformers reads: {' '.join(str(exc).split())}") from exc

    def build(self) -> nn.Module:
        import transformers
        from transformers import GenerationConfig
        from transformers import initialization as init

        config = self._config()
        cls = _model_class(config)
        if cls is None:
            raise CheckpointError(f"{self.directory}: config.json names no model class of "
                                  f"transformers (architectures: "
                                  f"{getattr(config, 'architectures', None)})")
        _check_buffers(cls, config, self.directory)
        try:
            with parameters_on_meta(), init.no_init_weights():
                model: nn.Module = cls(config)
        except Exception as exc:
            raise CheckpointError(f"{self.directory}: cannot build {cls.__name__} from its "
                                  f"config: {' '.join(str(exc).split())}") from exc
        dtype = getattr(config, "dtype", None)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype, None)
        if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
            cast: dict[int, nn.Parameter] = {}
            for mod in model.modules():
                for attr, p in list(mod.named_parameters(recurse=False)):
                    if p.is_floating_point() and p.dtype != dtype:
                        if id(p) not in cast:
                            cast[id(p)] = nn.Parameter(p.to(dtype), requires_grad=False)
                        setattr(mod, attr, cast[id(p)])
        if isinstance(model, transformers.PreTrainedModel):
            model.tie_weights()  # as from_pretrained does (tied embeddings share one tensor)
        if (self.directory / "generation_config.json").is_file() and isinstance(
                model, transformers.PreTrainedModel):
            try:
                model.generation_config = GenerationConfig.from_pretrained(
                    self.directory, local_files_only=True)
            except Exception as exc:
                raise CheckpointError(f"{self.directory / 'generation_config.json'}: "
                                      f"{' '.join(str(exc).split())}") from exc
        return model.eval()

    def tensor_files(self) -> dict[str, str]:
        index = self.directory / INDEX
        if os.path.lexists(index):
            what = kind(index)
            if what is not None:
                raise CheckpointError(f"{index} is {what} (not opened)")
            if index.stat().st_size > MAX_INDEX_BYTES:
                raise CheckpointError(f"{index} is larger than {MAX_INDEX_BYTES:,} bytes: not "
                                      "an index of safetensors shards")
            try:
                data = json.loads(index.read_text(encoding="utf-8"))
                weight_map = data["weight_map"]
                ok = isinstance(weight_map, dict) and all(
                    isinstance(k, str) and isinstance(v, str) and Path(v).name == v
                    and v not in ("", ".", "..") for k, v in weight_map.items())
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{index}: not a safetensors index ({exc})") from exc
            if not ok:
                raise CheckpointError(f"{index}: weight_map must map tensor names to file "
                                      "names in the directory")
            for v in sorted(set(weight_map.values())):
                what = kind(self.directory / v)
                if what == "missing":
                    raise CheckpointError(f"{index} names {v}, which is not in "
                                          f"{self.directory}")
                if what is not None:
                    raise CheckpointError(f"{self.directory / v}, a weight file {index.name} "
                                          f"names, is {what} (not opened)")
            return dict(weight_map)
        single = self.directory / SINGLE
        what = kind(single)
        if what == "missing":
            raise CheckpointError(f"{self.directory}: no {SINGLE} nor {INDEX} (only "
                                  "safetensors checkpoints are read)")
        if what is not None:
            raise CheckpointError(f"{single} is {what} (not opened)")
        from safetensors import safe_open

        try:
            with safe_open(str(single), framework="pt") as handle:
                return dict.fromkeys(handle.keys(), SINGLE)
        except Exception as exc:
            raise CheckpointError(f"{single}: not a safetensors file: {exc}") from exc

    def stored(self, model: nn.Module) -> StoredTensors | None:
        found = StoredTensors(model, list(self.tensor_files()))
        return found if found.renamed or found.fused else None

    def ignored(self, model: nn.Module, stored: Sequence[str]) -> set[str]:
        """The stored tensors ``from_pretrained`` ignores without a word: those matching the
        model's ``_keys_to_ignore_on_load_unexpected`` and the patterns transformers adds
        (an old checkpoint's per-layer ``rotary_emb.inv_freq``, GPT-2's causal mask
        ``attn.bias``), asked of transformers' own rule; never a tensor of the model."""
        import types

        held = set(model.state_dict(keep_vars=True)) | {n for n, _ in model.named_buffers()}
        extra = {n for n in stored if n not in held}
        adjust = getattr(model, "_adjust_missing_and_unexpected_keys", None)
        if not extra or adjust is None:
            return set()
        info = types.SimpleNamespace(missing_keys=set(), unexpected_keys=set(extra))
        try:
            adjust(info)
        except Exception:
            return set()  # another transformers: nothing ignored, extra tensors refused
        return extra - set(info.unexpected_keys)

    def how_to_load(self, output: Path) -> str:
        from .checkpoint import loading_note

        return loading_note(output)

    def replaced_files(self) -> set[str]:
        return {"config.json", INDEX, SINGLE}

    def calibration(self, texts: Sequence[str], *, tokens: int, seq_len: int) -> list[Any]:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(self.directory, local_files_only=True)
        except Exception as exc:
            raise CalibrationError(f"{self.directory}: no tokenizer to tokenise the calibration "
                                   f"text with ({' '.join(str(exc).split())})") from exc
        if isinstance(tokenizer, bool) or not callable(tokenizer):
            raise CalibrationError(f"{self.directory}: no tokenizer to tokenise the "
                                   "calibration text with")
        eos = getattr(tokenizer, "eos_token_id", None)
        ids: list[int] = []
        for text in texts:
            ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
            if isinstance(eos, int):
                ids.append(eos)
            if len(ids) >= tokens:
                break
        ids = ids[:tokens]
        return [{"input_ids": torch.tensor([ids[i:i + seq_len]]), "use_cache": False}
                for i in range(0, len(ids), seq_len)]


def _check_buffers(cls: type[nn.Module], config: Any, directory: Path) -> None:
    """:class:`fxsym.CheckpointError` if the model ``config`` describes would compute more
    than :data:`MAX_BUFFER_BYTES` of buffers when built (a causal mask or a table of positions
    sized by a ``max_position_embeddings`` the config inflates): measured on a build with
    everything on the meta device, before the real build allocates them. A class that cannot
    be built on meta is not measured (its real build is the check)."""
    from transformers import initialization as init

    try:
        with torch.device("meta"), init.no_init_weights(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            probe = cls(config)
    except Exception:
        return
    size = sum(b.numel() * b.element_size() for b in probe.buffers())
    if size > MAX_BUFFER_BYTES:
        largest = max(probe.named_buffers(), key=lambda nb: nb[1].numel() * nb[1].element_size())
        raise CheckpointError(
            f"{directory / 'config.json'} asks for {size:,} bytes of computed buffers "
            f"({largest[0]}: {tuple(largest[1].shape)}), more than {MAX_BUFFER_BYTES:,}: does "
            "it give the checkpoint's sizes (max_position_embeddings and the like)? Nothing "
            "was allocated")


def _model_class(config: Any) -> type[nn.Module] | None:
    """The class of the config's first architecture, a ``PreTrainedModel`` of transformers,
    else the ``AutoModelForCausalLM`` mapping's class for the config."""
    import transformers

    for name in getattr(config, "architectures", None) or ():
        cls = getattr(transformers, name, None) if isinstance(name, str) else None
        if (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)
                and cls.__module__.startswith("transformers.")):
            return cls
    try:
        found: Any = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:
        return None
    return found if isinstance(found, type) and issubclass(found, nn.Module) else None
