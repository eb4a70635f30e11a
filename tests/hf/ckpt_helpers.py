"""Tiny ``save_pretrained`` checkpoint directories for the checkpoint tests (random weights,
a tokenizer trained here with ``tokenizers`` and stored: nothing downloaded)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import fxsym.prune.importance

TEXT = ("The quick brown fox jumps over the lazy dog. " * 3 + "Pack my box with five dozen "
        "liquor jugs. How vexingly quick daft zebras jump! Sphinx of black quartz, judge my "
        "vow. ") * 20

WINDOW = dict(sliding_window=6)
MAMBA2 = dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8)

#: model_type -> config overrides making its layers differ (with 4 layers): windows smaller than
#: the calibration sequences on some layers, no-rope layers, dense-then-MoE and hybrid stacks
LAYERED: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": WINDOW,
    "gemma2": WINDOW,
    "gemma3_text": dict(WINDOW, head_dim=16,
                        layer_types=["sliding_attention", "full_attention"] * 2),
    "qwen2": dict(WINDOW, use_sliding_window=True, max_window_layers=2),
    "qwen3": dict(WINDOW, use_sliding_window=True, max_window_layers=2, head_dim=16),
    "cohere2": WINDOW,
    "olmo3": WINDOW,
    "exaone4": WINDOW,
    "gpt_oss": dict(WINDOW, head_dim=16, num_local_experts=4, num_experts_per_tok=2),
    "smollm3": dict(pad_token_id=0),
    "qwen2_moe": dict(mlp_only_layers=[1], moe_intermediate_size=32, num_experts=4,
                      num_experts_per_tok=2, shared_expert_intermediate_size=48),
    "qwen3_moe": dict(mlp_only_layers=[1], head_dim=16, moe_intermediate_size=32, num_experts=4,
                      num_experts_per_tok=2),
    "deepseek_v3": dict(first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=32, n_group=1, topk_group=1, num_key_value_heads=4,
                        q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
                        qk_nope_head_dim=8, v_head_dim=16),
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                  expert_layer_offset=1, num_experts=4, mamba_d_state=8, mamba_dt_rank=8,
                  use_mamba_kernels=False),
    "bamba": dict(MAMBA2, attn_layer_indices=[1, 3]),
    "falcon_h1": dict(MAMBA2, mamba_d_ssm=128, head_dim=16),
    "granitemoehybrid": dict(MAMBA2, layer_types=["mamba", "attention"] * 2,
                             num_local_experts=4, num_experts_per_tok=2),
    "zamba2": dict(mamba_d_state=8, mamba_headdim=16, n_mamba_heads=8, mamba_ngroups=1,
                   num_mem_blocks=1, layers_block_type=["mamba", "hybrid"] * 2,
                   attention_head_dim=16),
    "qwen3_next": dict(layer_types=["linear_attention", "full_attention"] * 2, head_dim=16,
                       linear_num_value_heads=4, linear_num_key_heads=2,
                       linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=32),
    "lfm2": dict(layer_types=["conv", "full_attention"] * 2, block_ff_dim=192),
    # chunked attention on 3 layers of 4 (chunks of 6, no rope there), MoE every other layer;
    # its model moves the token ids to its embedding's device before calling it
    "llama4_text": dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                        interleave_moe_layer_step=2, pad_token_id=0, attention_chunk_size=6,
                        no_rope_layers=[1, 1, 1, 0],
                        layer_types=["chunked_attention"] * 3 + ["full_attention"]),
    # one stored tensor split into several parameters by transformers' loading: HRM's
    # gqkv_proj (4 equal chunks) and gate_up_proj, both stacks' layers called in cycles
    "hrm_text": dict(head_dim=16, intermediate_size=128, pad_token_id=0),
    # Lara's in_proj split into the gated delta net's 4 input projections by their sizes;
    # linear, sliding and full attention layers, MoE with a shared expert
    "lara_mini": dict(WINDOW, head_dim=16, layer_types=["linear_attention", "sliding_attention",
                                                        "linear_attention", "full_attention"],
                      linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                      linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32, shared_expert_intermediate_size=32,
                      pad_token_id=0),
    # Sarvam-MoE's query_key_value split into q, k, v (GQA) by their sizes, dense then MoE
    "sarvam_moe": dict(head_dim=16, intermediate_size=128, first_k_dense_replace=1,
                       n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       n_shared_experts=1, n_group=1, topk_group=1, pad_token_id=0),
}


def n_params(model: torch.nn.Module) -> int:
    """How many numbers ``model``'s parameters hold."""
    return sum(p.numel() for p in model.parameters())


#: the byte-level BPE tokenizer the checkpoints carry, trained once on :data:`TEXT` by
#: :func:`train_tokenizer` and stored: the ``tokenizers`` trainer breaks ties between equally
#: frequent pairs differently in each process, so a tokenizer trained per process gave each
#: test process other token ids (``python tests/hf/ckpt_helpers.py`` writes it again)
TOKENIZER = Path(__file__).with_name("tokenizer.json")


def train_tokenizer(vocab: int = 300) -> Any:
    """A ``tokenizers.Tokenizer``: byte-level BPE of at most ``vocab`` tokens trained on
    :data:`TEXT` (its specials, the alphabet, then one token per merge, in merge order)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()[:60])
    tok.train_from_iterator([TEXT], trainer)
    return tok


def tokenizer(vocab: int = 100) -> Any:
    """The stored tokenizer (:data:`TOKENIZER`) cut to at most ``vocab`` tokens (never below
    its specials and alphabet): its first merges, the tokens they make, as a trainer asked for
    fewer tokens would have stopped there."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    state = json.loads(TOKENIZER.read_text(encoding="utf-8"))
    model = state["model"]
    merges = len(model["merges"])
    kept = max(0, min(merges, vocab - (len(model["vocab"]) - merges)))
    model["merges"] = model["merges"][:kept]
    size = len(model["vocab"]) - merges + kept
    model["vocab"] = {t: i for t, i in model["vocab"].items() if i < size}
    tok = Tokenizer.from_str(json.dumps(state))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")


def tiny_llama() -> Any:
    """A 3-layer llama with grouped queries (4 heads, 2 key-value heads), hidden 64, FFN 192,
    vocabulary 128, seeded; the CLI reaches it as ``ckpt_helpers:tiny_llama``."""
    import transformers

    cfg = transformers.AutoConfig.for_model(
        "llama", hidden_size=64, intermediate_size=192, vocab_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def tiny_config(model_type: str, **overrides: Any) -> Any:
    """The config of a tiny causal LM of ``model_type`` (hidden 64, 3 layers, 4 heads, 2
    key/value heads, vocabulary 300), ``overrides`` given."""
    import transformers

    sizes: dict[str, Any] = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=3,
                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                                 max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
                                 tie_word_embeddings=False)
    sizes.update(overrides)
    return transformers.AutoConfig.for_model(model_type, **sizes)


def checkpoint(directory: Path, model_type: str, *, seed: int = 0, shard: str = "200KB",
               with_tokenizer: bool = True, **overrides: Any) -> Any:
    """Write a tiny causal LM of ``model_type`` (:func:`tiny_config`) with ``save_pretrained``
    (sharded) and a tokenizer into ``directory``; return the model."""
    import transformers

    config = tiny_config(model_type, **overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(directory, max_shard_size=shard)
    if with_tokenizer:
        tokenizer(config.vocab_size).save_pretrained(directory)
    return model


def block_importance(model: torch.nn.Module, blocks: torch.nn.ModuleList,
                     batches: list[Any]) -> list[float]:
    """``1 - cos`` of each block's input and output hidden states over every token, from
    hooks on ``model`` loaded whole (what a streamed run's block importance must equal)."""
    sums = [0.0] * len(blocks)
    counts = [0] * len(blocks)
    seen: dict[int, torch.Tensor] = {}

    def before(i: int) -> Any:
        def hook(m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            seen[i] = args[0] if args else next(iter(kwargs.values()))
        return hook

    def after(i: int) -> Any:
        def hook(m: Any, args: Any, out: Any) -> None:
            o = out if isinstance(out, torch.Tensor) else out[0]
            sim = torch.nn.functional.cosine_similarity(
                seen[i].flatten(0, -2).double(), o.flatten(0, -2).double(), dim=-1)
            sums[i] += float(sim.sum())
            counts[i] += sim.numel()
        return hook

    handles = [h for i, b in enumerate(blocks)
               for h in (b.register_forward_pre_hook(before(i), with_kwargs=True),
                         b.register_forward_hook(after(i)))]
    with torch.no_grad():
        for batch in batches:
            fxsym.importance.run_batch(model, batch)
    for h in handles:
        h.remove()
    return [1 - s / n for s, n in zip(sums, counts)]


def on_reads(monkeypatch: Any, before_read: Callable[[str], None],
             after_read: Callable[[str, torch.Tensor], None] | None = None) -> None:
    """From now on, call ``before_read(name)`` before safetensors reads the bytes of tensor
    ``name`` (``get_tensor``, or indexing a ``get_slice``; a header's shapes and dtypes are not
    reads): to record the reads, or to fail one; ``after_read(name, tensor)`` with what each
    read gave."""

    def given(name: str, t: Any) -> Any:
        if after_read is not None:
            after_read(name, t)
        return t

    import safetensors

    real = safetensors.safe_open

    class Slice:
        def __init__(self, part: Any, name: str) -> None:
            self.part, self.name = part, name

        def __getitem__(self, key: Any) -> Any:
            before_read(self.name)
            return given(self.name, self.part[key])

        def __getattr__(self, attr: str) -> Any:
            return getattr(self.part, attr)

    class Handle:
        def __init__(self, path: str, **kwargs: Any) -> None:
            self.handle = real(path, **kwargs)

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.handle.__exit__(*exc)

        def __getattr__(self, attr: str) -> Any:
            return getattr(self.handle, attr)

        def get_tensor(self, name: str) -> Any:
            before_read(name)
            return given(name, self.handle.get_tensor(name))

        def get_slice(self, name: str) -> Slice:
            return Slice(self.handle.get_slice(name), name)

    monkeypatch.setattr(safetensors, "safe_open", Handle)


if __name__ == "__main__":
    TOKENIZER.write_text(train_tokenizer().to_str(pretty=True) + "\n", encoding="utf-8")
