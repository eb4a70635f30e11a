"""Analyze a Llama-3-70B-shaped model built on the meta device (no weights allocated).

80 layers, hidden 8192, 64 query heads, 8 key/value heads, intermediate 28672, vocabulary
128256. Prints the time to build, trace and analyze, the number of groups, and the peak
resident memory of the process. Target: under 60 s and under 4 GB.

``--model deepseek_v3`` analyzes a DeepSeek-V3-shaped model instead (671B: transformers'
default ``DeepseekV3Config``, 61 layers, 256 routed experts of 8 per token in 8 groups,
multi-head latent attention), and counts its routed expert groups.

    python benchmarks/hf_scale.py [--model llama|deepseek_v3] [--layers N]
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # before importing torch and transformers

import argparse  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402


def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 / 1024 if sys.platform == "darwin" else peak / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("llama", "deepseek_v3"), default="llama")
    parser.add_argument("--layers", type=int, default=None,
                        help="decoder layers (default: the model's own, 80 or 61)")
    args = parser.parse_args()

    import transformers

    import fxsym

    fxsym.load_plugins()
    if args.model == "llama":
        args.layers = args.layers or 80
        cfg = transformers.AutoConfig.for_model(
            "llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=args.layers,
            num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
            max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False)
    else:
        cfg = transformers.AutoConfig.for_model("deepseek_v3")
        if args.layers:
            cfg.num_hidden_layers = args.layers
        args.layers = cfg.num_hidden_layers
    rows: list[tuple[str, str]] = []
    start = time.perf_counter()
    imports = start - T0
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    built = time.perf_counter()
    n_params = sum(p.numel() for p in model.parameters())
    assert all(p.is_meta for p in model.parameters()), "weights were allocated"
    sm = fxsym.analyze(model)
    done = time.perf_counter()
    groups = sm.groups()
    by_kind: dict[str, int] = {}
    for g in groups:
        kind = g.name.rsplit(".", 1)[-1]
        by_kind[kind] = by_kind.get(kind, 0) + 1
    rows += [
        ("model", f"{type(model).__name__}, {args.layers} layers, {n_params / 1e9:.2f}B params "
                  "(meta)"),
        ("graph nodes", str(len(sm.graph_module.graph.nodes))),
        ("build (s)", f"{built - start:.2f}"),
        ("analyze (s)", f"{done - built:.2f}"),
        ("total (s)", f"{done - start:.2f}"),
        ("imports (s)", f"{imports:.2f} (torch, transformers, fxsym and plugins)"),
        ("groups", f"{len(groups)} " + str(dict(sorted(by_kind.items())))),
        ("routed groups", f"{sum(g.routed for g in groups)} (experts, at least "
                          f"{sorted({g.min_size for g in groups if g.routed})} kept)"),
        ("peak RSS (MB)", f"{peak_rss_mb():.0f}"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
