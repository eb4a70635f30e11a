"""Default example inputs for a transformers model (the ``fxsym_example_inputs`` hook).

Built from the model's config and its ``main_input_name``, never from a tokenizer or
processor: token ids (``input_ids`` with an all-ones ``attention_mask``) for text models,
``pixel_values`` for vision models, and ``decoder_input_ids`` for encoder-decoder models.
Shapes are small (batch 2, sequence 8) and within the config's limits; values are
deterministic. Only the arguments the model's ``forward`` accepts are given.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

BATCH = 2
SEQ = 8


def _get(cfg: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(cfg, name, None)
        if value is not None:
            return value
    return default


def _forward_params(model: nn.Module) -> set[str]:
    return set(inspect.signature(inspect.unwrap(type(model).forward)).parameters)


def _device(model: nn.Module) -> torch.device:
    for t in model.parameters():
        return t.device
    return torch.device("cpu")


def _token_ids(cfg: Any, seq: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    vocab = int(_get(cfg, "vocab_size", default=2) or 2)
    ids = torch.randint(0, vocab, (BATCH, seq), generator=gen)
    return ids.to(device)


def _sequence_length(cfg: Any) -> int:
    limit = _get(cfg, "max_position_embeddings", "n_positions", "max_seq_len")
    return max(1, min(SEQ, int(limit))) if isinstance(limit, int) else SEQ


def _pixels(cfg: Any, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    size = _get(cfg, "image_size", default=224)
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    channels = int(_get(cfg, "num_channels", default=3))
    return torch.randn(BATCH, channels, h, w, generator=gen).to(device)


def example_inputs(model: nn.Module) -> dict[str, Any] | None:
    """Inputs for ``model``, or ``None`` if it is not a transformers model this knows."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        return None
    cfg = model.config
    params = _forward_params(model)
    main = getattr(model, "main_input_name", "input_ids")
    gen = torch.Generator().manual_seed(0)
    device = _device(model)
    inputs: dict[str, Any] = {}
    if main == "pixel_values" and "pixel_values" in params:
        inputs["pixel_values"] = _pixels(cfg, gen, device)
    elif main in ("input_ids", "inputs_embeds") and "input_ids" in params:
        seq = _sequence_length(cfg)
        inputs["input_ids"] = _token_ids(cfg, seq, gen, device)
        if "attention_mask" in params:
            inputs["attention_mask"] = torch.ones(BATCH, seq, dtype=torch.long, device=device)
    else:
        return None
    if getattr(cfg, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        dec_cfg = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
        inputs["decoder_input_ids"] = _token_ids(dec_cfg, max(1, SEQ - 3), gen, device)
    return inputs


#: what a task model's user reads; its auxiliary hidden states may change size
TASK_OUTPUTS = ("loss", "logits", "start_logits", "end_logits")


def default_outputs(model: nn.Module) -> tuple[str, ...] | None:
    """The output contract of a transformers task model (a class with a task head, such as
    ``LlamaForCausalLM``): its losses and logits. A base model (``LlamaModel``) keeps every
    output: its hidden states are what its user reads."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel) or "For" not in type(model).__name__:
        return None
    return TASK_OUTPUTS
