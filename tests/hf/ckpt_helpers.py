"""Tiny ``save_pretrained`` checkpoint directories for the checkpoint tests (random weights,
a tokenizer trained here with ``tokenizers``: nothing downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TEXT = ("The quick brown fox jumps over the lazy dog. " * 3 + "Pack my box with five dozen "
        "liquor jugs. How vexingly quick daft zebras jump! Sphinx of black quartz, judge my "
        "vow. ") * 20


def n_params(model: torch.nn.Module) -> int:
    """How many numbers ``model``'s parameters hold."""
    return sum(p.numel() for p in model.parameters())


def tokenizer(vocab: int = 100) -> Any:
    """A byte-level BPE tokenizer of at most ``vocab`` tokens, trained on :data:`TEXT`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()[:60])
    tok.train_from_iterator([TEXT], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")


def checkpoint(directory: Path, model_type: str, *, seed: int = 0, shard: str = "200KB",
               with_tokenizer: bool = True, **overrides: Any) -> Any:
    """Write a tiny causal LM of ``model_type`` with ``save_pretrained`` (sharded) and a
    tokenizer into ``directory``; return the model."""
    import transformers

    sizes: dict[str, Any] = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=3,
                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                                 max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
                                 tie_word_embeddings=False)
    sizes.update(overrides)
    config = transformers.AutoConfig.for_model(model_type, **sizes)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(directory, max_shard_size=shard)
    if with_tokenizer:
        tokenizer(sizes["vocab_size"]).save_pretrained(directory)
    return model
