"""Streamed = in memory on every causal-LM family transformers ships (issue 29 §1).

For every model type of ``AutoModelForCausalLM`` (or those given), a tiny config is made from
the family's defaults: the size fields it has (:data:`TINY`) set small, 4 layers, and every
per-layer list of the default config (``layer_types``, ``mlp_only_layers`` …) cut to its first
4 entries, the families of ``tests/hf/ckpt_helpers.LAYERED`` with their own overrides (windows
smaller than the calibration sequences). Its random weights are written by
``save_pretrained`` with a tokenizer trained here; then the streamed calibration
(:func:`fxsym.prune.checkpoint.stream_activations`, one block in memory at a time) and the model
loaded whole (:func:`fxsym.importance.activation` and hooks for ``1 - cos`` per block) score
the same 3 batches. A row gives the largest relative difference of any group's scores and of
any block's importance (float32 rounding is about 1e-6), or why the family was not compared:
its tiny config does not build, ``prune_checkpoint`` does not read it, or the streamed run
refused it (a typed error, said aloud).

    python benchmarks/streamed_families.py [--families llama,gemma2]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "hf"))

from ckpt_helpers import LAYERED, TEXT, block_importance, checkpoint, tiny_config

#: small values for the size fields a family's config has (set only where it has the field)
TINY: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=300, max_position_embeddings=128, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, num_experts=4, n_routed_experts=4,
    num_local_experts=4, num_experts_per_tok=2, n_shared_experts=1, q_lora_rank=16,
    kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1,
    topk_group=1, sliding_window=6, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1,
    mamba_d_state=8, mamba_d_ssm=128, n_embd=64, n_head=4, n_inner=128, n_positions=128,
    d_model=64, ffn_dim=128, linear_num_value_heads=4, linear_num_key_heads=2,
    linear_key_head_dim=16, linear_value_head_dim=16, first_k_dense_replace=1, pad_token_id=0,
)
LAYERS = 4
#: a tiny config holding more parameters than this is not built (fields :data:`TINY` misses)
MAX_PARAMS = 20_000_000


def tiny_overrides(family: str) -> dict[str, Any]:
    """The overrides of a tiny 4-layer config of ``family`` (see the module docstring)."""
    import transformers

    if family in LAYERED:
        return dict(LAYERED[family])
    default = transformers.AutoConfig.for_model(family).to_dict()
    out = {k: v for k, v in TINY.items() if k in default}
    layers = default.get("num_hidden_layers", default.get("n_layer"))
    for key, value in default.items():
        if isinstance(value, list) and layers and len(value) == layers:
            out[key] = value[:LAYERS]
    if "n_layer" in default:
        out["n_layer"] = LAYERS
    return out


def meta_params(family: str) -> int:
    """How many parameters the tiny config of ``family`` holds (built on the meta device)."""
    import torch
    import transformers

    config = tiny_config(family, num_hidden_layers=LAYERS, **tiny_overrides(family))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def compare(src: Path) -> str:
    """The largest relative differences between streamed and in-memory scores and block
    importance of the checkpoint ``src``."""
    import transformers

    import fxsym
    import fxsym.prune.checkpoint as ckpt

    reader = ckpt.open_checkpoint(src)
    batches = reader.calibration([TEXT], tokens=64, seq_len=24)
    captured: list[Any] = []
    real = ckpt.stream_activations

    def keep(*args: Any, **kwargs: Any) -> Any:
        captured.append(real(*args, **kwargs))
        return captured[-1]

    ckpt.stream_activations = keep  # type: ignore[assignment]
    try:
        fxsym.prune_checkpoint(src, src.parent / "out", calibration=[TEXT],
                               calibration_tokens=64, seq_len=24, ratio=0.25)
    finally:
        ckpt.stream_activations = real  # type: ignore[assignment]
    (streamed,) = captured
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    loaded = fxsym.importance.activation(batches, consumers_only=True)(model, fxsym.analyze(model))
    if streamed.scores.keys() != loaded.keys():
        return f"DIFFERENT GROUPS: {sorted(set(streamed.scores) ^ set(loaded))[:3]}"
    score = max((float((streamed.scores[n] - s).abs().max() / s.abs().max().clamp_min(1e-30))
                 for n, s in loaded.items()), default=0.0)
    found = ckpt.block_list(model)
    assert found is not None
    blocks = found[1]
    want = block_importance(model, blocks, batches)
    block = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(streamed.block_importance, want))
    return f"{len(loaded)} groups, {len(blocks)} blocks | {score:.1e} | {block:.1e}"


def row(family: str) -> str:
    """The table row's cells of ``family`` (in a process of its own: see :func:`main`)."""
    from fxsym.errors import FxsymError

    work = Path(tempfile.mkdtemp(prefix="fxsym-streamed-"))
    try:
        try:
            big = meta_params(family)
            if big > MAX_PARAMS:
                raise ValueError(f"its tiny config still holds {big:,} parameters")
            checkpoint(work / "in", family, num_hidden_layers=LAYERS, shard="10MB",
                       **tiny_overrides(family))
        except Exception as exc:
            return f"not built: {type(exc).__name__}: {' '.join(str(exc).split())[:100]}"
        try:
            return compare(work / "in")
        except FxsymError as exc:
            return f"refused: {' '.join(str(exc).split())}"
        except Exception as exc:
            return f"FAILED: {type(exc).__name__}: {' '.join(str(exc).split())}"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    """One process per family, so that a plugin one family makes fail (which fxsym then
    disables for the rest of its process) or a config too big for memory touches no other."""
    import subprocess

    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)))
    args = parser.parse_args()
    print("| family | compared | max rel. diff, scores | max rel. diff, block importance |")
    print("|---|---|---|---|", flush=True)
    for family in args.families.split(","):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--child", family], text=True,
                              capture_output=True, check=False)
        lines = done.stdout.strip().splitlines()
        cells = (lines[-1] if done.returncode == 0 and lines
                 else f"FAILED: the process ended with {done.returncode}: "
                      f"{' '.join(done.stderr.split()[-30:])}")
        print(f"| {family} | {cells} |", flush=True)
        print(f"{family}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        import torch
        import transformers

        torch.set_num_threads(2)
        warnings.simplefilter("ignore")
        transformers.logging.set_verbosity_error()
        print(row(sys.argv[2]))
    else:
        main()
