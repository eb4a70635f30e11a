"""Per Hugging Face family (tiny config, random weights): groups, coverage, both oracles,
analyze time.

    python benchmarks/hf_report.py [--families gpt2,llama]

Coverage is the share of the ``nn.Linear``, ``Conv1D``, convolution and ``nn.Embedding``
modules whose output dim (``out_features``, ``out_channels``, ``embedding_dim``) is a member
of a searchable group, counting every member (the projections inside attention leaves too,
and a subclass traced into by its weight or size attribute member). A task head whose output
is the model's contract (``lm_head``, a classifier) always counts against it. ``oracle
cov.`` is :func:`fxsym.oracles.coverage` (every module with an OUTGOING symbol, attention
leaves included, and every module traced into whose parameter is the weight of a functional
projection, such as ``FalconLinear``: the same projections the first column counts through
their ``weight:<dim>`` member).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

import fxsym
from fxsym.oracles import check_permutation, check_shrink, coverage
from fxsym.tracer import resolve_example_inputs

LM, CLS = "AutoModelForCausalLM", "AutoModelForSequenceClassification"
S2S, IMG = "AutoModelForSeq2SeqLM", "AutoModelForImageClassification"

_DECODER: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)
_ENCODER: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    vocab_size=100, max_position_embeddings=64, num_labels=3)

#: model_type -> (auto class, config overrides): the sizes of ``tests/hf/conftest.py``
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2": (LM, dict(n_embd=64, n_inner=128, n_layer=2, n_head=4, vocab_size=100,
                      n_positions=64, bos_token_id=0, eos_token_id=0)),
    "llama": (LM, _DECODER),
    "mistral": (LM, _DECODER),
    "qwen2": (LM, _DECODER),
    "qwen3": (LM, dict(_DECODER, head_dim=16)),
    "gemma": (LM, dict(_DECODER, head_dim=16, num_key_value_heads=1)),
    "gemma2": (LM, dict(_DECODER, head_dim=16)),
    "phi3": (LM, dict(_DECODER, pad_token_id=0)),
    "opt": (LM, dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                     vocab_size=100, max_position_embeddings=64, word_embed_proj_dim=64)),
    "gpt_neox": (LM, dict(_ENCODER, num_labels=2)),
    "falcon": (LM, dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        vocab_size=100)),
    "bloom": (LM, dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=100)),
    "gptj": (LM, dict(n_embd=64, n_inner=128, n_layer=2, n_head=4, rotary_dim=8,
                      vocab_size=100, n_positions=64)),
    "olmo": (LM, _DECODER),
    "stablelm": (LM, _DECODER),
    "bert": (CLS, _ENCODER),
    "roberta": (CLS, dict(_ENCODER, max_position_embeddings=66)),
    "distilbert": (CLS, dict(dim=64, hidden_dim=128, n_layers=2, n_heads=4, vocab_size=100,
                             max_position_embeddings=64, num_labels=3)),
    "albert": (CLS, dict(_ENCODER, embedding_size=32)),
    "electra": (CLS, dict(_ENCODER, embedding_size=32)),
    "deberta-v2": (CLS, _ENCODER),
    "vit": (IMG, dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, image_size=32, patch_size=8, num_labels=3)),
    "t5": (S2S, dict(d_model=64, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                     d_kv=16, vocab_size=100, decoder_start_token_id=0)),
    "bart": (S2S, dict(d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128,
                       encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, vocab_size=100)),
}

#: the symbol naming a projection's output dim, by module class name, and the members that a
#: subclass traced into (its own ``forward``) carries instead: the parameter member
#: (``weight:<dim>``) and the family's size attribute (``attr:<symbol>``, which follows the
#: weight dim where a tied leaf's rule slices the weight, as Bart's scaled embeddings)
OUTPUT_SYMBOL: dict[str, tuple[str, ...]] = {
    "Linear": ("out_features", "weight:0", "attr:out_features"),
    "Conv1D": ("out_features", "weight:1", "attr:nf"),
    "Conv1d": ("out_channels", "weight:0", "attr:out_channels"),
    "Conv2d": ("out_channels", "weight:0", "attr:out_channels"),
    "Conv3d": ("out_channels", "weight:0", "attr:out_channels"),
    "Embedding": ("embedding_dim", "weight:1", "attr:embedding_dim")}


def _output_keys(mod: nn.Module) -> tuple[str, ...] | None:
    """The symbol and parameter member of ``mod``'s output dim, if its class or a base class
    (``FalconLinear`` is an ``nn.Linear``) is a counted projection."""
    for cls in type(mod).__mro__:
        if cls.__name__ in OUTPUT_SYMBOL and cls.__module__.startswith(("torch.", "transformers.")):
            return OUTPUT_SYMBOL[cls.__name__]
    return None


def build(model_type: str) -> nn.Module:
    import transformers

    auto, kwargs = CONFIGS[model_type]
    cfg = transformers.AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(0)
    model: nn.Module = getattr(transformers, auto).from_config(cfg).eval()
    return model


def projection_coverage(model: nn.Module, sm: fxsym.SymMap) -> tuple[int, int]:
    """(projections whose output dim is a group member, projections)."""
    members = {m for g in sm.groups() for m in g.members}
    total = live = 0
    for name, mod in model.named_modules():
        keys = _output_keys(mod)
        if keys is None:
            continue
        total += 1
        live += any((name, k) in members for k in keys)
    return live, total


def _status(result: Any) -> str:
    return str(result.status) if result.status != "failed" else str(result)[:50]


def report(family: str) -> list[str]:
    model = build(family)
    inputs = resolve_example_inputs(model, None)
    start = time.perf_counter()
    sm = fxsym.analyze(model)
    elapsed = time.perf_counter() - start
    live, total = projection_coverage(model, sm)
    perm, shrink = check_permutation(model, sm, inputs), check_shrink(model, sm, inputs)
    heads = sum(g.name.endswith((".heads", ".queries_per_kv", ".head_dim")) for g in sm.groups())
    return [family, type(model).__name__, str(len(sm.groups())), str(heads),
            f"{live / total:.2f} ({live}/{total})", f"{coverage(sm):.2f}", _status(perm),
            _status(shrink), f"{elapsed:.2f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--families", help="comma-separated model types (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    warnings.simplefilter("ignore")  # transformers' and the resized configs' notes
    fxsym.load_plugins()
    families = args.families.split(",") if args.families else list(CONFIGS)
    table = Table(title="fxsym on tiny Hugging Face models")
    for column in ["family", "model", "groups", "leaf head groups", "coverage", "oracle cov.",
                   "permutation", "shrink", "analyze s"]:
        table.add_column(column, justify="left" if column in ("family", "model") else "right")
    for i, family in enumerate(families, 1):
        print(f"[{i}/{len(families)}] {family}", file=sys.stderr, flush=True)
        try:
            table.add_row(*report(family))
        except Exception as exc:  # a family that fails is a row, not the end of the report
            table.add_row(family, "", "", "", "", "", f"error: {type(exc).__name__}: {exc}"[:60],
                          "", "")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
