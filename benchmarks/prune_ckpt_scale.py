"""Peak memory and time of ``fxsym.prune_checkpoint`` on synthetic checkpoints of growing size
(issue 22 §5, issue 29): memory should stay flat as the checkpoint grows.

The checkpoints (``--family``), random bfloat16 weights written shard by shard (500 MB shards)
into a temporary directory under /tmp with a tokenizer trained on the standard library's
source, deleted after, with as many layers as the size asks:

* ``llama``: Llama-2-shaped (hidden 2048, 16 heads of 128, 4 key/value heads, intermediate
  5632, vocabulary 32000, untied head);
* ``gemma3_text``: Gemma-3-shaped (hidden 1152, 4 heads of 256, 1 key/value head,
  intermediate 6912, tied embedding, vocabulary 32000): five sliding-window layers of 128
  tokens, smaller than the calibration sequences of 512, to one global layer with its own
  rotary table, so every layer must get the mask and table the model gives it;
* ``moe``: Mixtral-shaped (hidden 1024, 8 heads of 128, 2 key/value heads, 8 experts of width
  2816 with 2 picked per token, vocabulary 32000), stored as ``save_pretrained`` stores them
  (one tensor per expert and projection, ``block_sparse_moe.experts.{e}.w1/w2/w3.weight``):
  each layer's experts are fused when the layer runs and split again when written.

Each is pruned as ``--mode`` says (:data:`MODES`): ``uniform`` (half the parameters, uniform
plan, activation importance on 2048 calibration tokens of the standard library's source in
sequences of 512, sizes rounded to multiples of 64; ``uniform-512`` the same on 512 tokens,
what the search's time compares with), ``search`` (a parameter target: half the parameters by
the architecture search, uniform candidates of depth and widths each scored by its next-token
loss, all in one streamed pass over their pruned tensors, on 512 tokens), ``depth``
(half the layers, ranked by block importance on 1024 tokens), ``experts`` (Mixtral: half the
experts by router load and activation on 1024 tokens) or ``experts-l2`` (by the stored
weights, no calibration run).

Every step runs in a subprocess of its own; the prune's peak resident memory is the child's
``ru_maxrss`` (``resource.getrusage(RUSAGE_SELF)`` printed by the child when it is done), and
the first row is a child that only imports torch, transformers and fxsym (the floor). Target:
peak under 40 % of the checkpoint for the largest one, flat as the size grows.

    python benchmarks/prune_ckpt_scale.py [--sizes 0.5,1.5,3] [--family llama|gemma3_text|moe]
        [--mode uniform|uniform-512|search|depth|experts|experts-l2] [--tmp DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VOCAB = 32000
#: the dense families of ``--family``: Llama-2-shaped, and Gemma-3-shaped (five sliding-window
#: layers of 128 tokens, smaller than the calibration sequences, to one global layer with its
#: own rotary base)
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=4,
                  intermediate_size=5632, tie_word_embeddings=False),
    "gemma3_text": dict(hidden_size=1152, num_attention_heads=4, num_key_value_heads=1,
                        head_dim=256, intermediate_size=6912, sliding_window=128),
}
FAMILY_CLASS = {"llama": "LlamaForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
#: the Mixtral-shaped checkpoints of ``--moe``
MOE = dict(hidden=1024, heads=8, kv=2, ffn=2816, experts=8, top_k=2)


def family_config(family: str, layers: int) -> Any:
    """The config of a ``family`` checkpoint (:data:`FAMILIES`) with ``layers`` layers."""
    import transformers

    config = transformers.AutoConfig.for_model(
        family, **FAMILIES[family], num_hidden_layers=layers, vocab_size=VOCAB,
        max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config.architectures = [FAMILY_CLASS[family]]
    config.dtype = "bfloat16"
    return config


def stored_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """What ``save_pretrained`` stores of the model ``config`` describes (a meta build: its
    parameters, a tied head once, and persistent buffers), by name."""
    import torch
    import transformers

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    persistent = set(model.state_dict())
    out = {n: tuple(p.shape) for n, p in model.named_parameters()}
    out.update({n: tuple(b.shape) for n, b in model.named_buffers() if n in persistent})
    return out


def _mixtral(directory: Path, layers: int) -> dict[str, tuple[int, ...]]:
    """Write the config of a Mixtral-shaped checkpoint (:data:`MOE`) into ``directory``;
    its tensors' shapes as ``save_pretrained`` stores them (one tensor per expert)."""
    import transformers

    hidden, heads, kv, ffn = MOE["hidden"], MOE["heads"], MOE["kv"], MOE["ffn"]
    config = transformers.MixtralConfig(
        num_local_experts=MOE["experts"], num_experts_per_tok=MOE["top_k"], hidden_size=hidden,
        num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=ffn,
        vocab_size=VOCAB, num_hidden_layers=layers, tie_word_embeddings=False,
        max_position_embeddings=4096, bos_token_id=1, eos_token_id=2)
    config.architectures = ["MixtralForCausalLM"]
    config.dtype = "bfloat16"
    config.save_pretrained(directory)
    transformers.GenerationConfig(bos_token_id=1, eos_token_id=2).save_pretrained(directory)  # type: ignore[no-untyped-call]
    h, d = hidden, hidden // heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        shapes.update({
            a + "q_proj.weight": (heads * d, h), a + "k_proj.weight": (kv * d, h),
            a + "v_proj.weight": (kv * d, h), a + "o_proj.weight": (h, heads * d),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
        m = p + "block_sparse_moe."
        shapes[m + "gate.weight"] = (MOE["experts"], h)
        for e in range(MOE["experts"]):
            shapes.update({f"{m}experts.{e}.w1.weight": (ffn, h),
                           f"{m}experts.{e}.w3.weight": (ffn, h),
                           f"{m}experts.{e}.w2.weight": (h, ffn)})
    shapes.update({"model.norm.weight": (h,), "lm_head.weight": (VOCAB, h)})
    return shapes


def write_checkpoint(directory: Path, layers: int, family: str) -> dict[str, int]:
    """A synthetic checkpoint of ``family`` (:data:`FAMILIES`, or ``moe``: Mixtral-shaped) in
    ``directory``, one 500 MB shard in memory at a time."""
    import math
    import sysconfig

    import torch
    import transformers
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if family != "moe":
        config = family_config(family, layers)
        config.save_pretrained(directory)
        transformers.GenerationConfig(bos_token_id=1, eos_token_id=2).save_pretrained(directory)  # type: ignore[no-untyped-call]
        shapes = stored_shapes(config)
    else:
        shapes = _mixtral(directory, layers)
    shards: list[list[str]] = [[]]
    used = 0
    for name, shape in shapes.items():
        size = math.prod(shape) * 2
        if shards[-1] and used + size > 500 * 10**6:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    weight_map = {}
    gen = torch.Generator().manual_seed(0)
    for k, names in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name in names:
            shape = shapes[name]
            t = torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=gen) * 0.02
            tensors[name] = t.to(torch.bfloat16)
            weight_map[name] = file
        save_file(tensors, str(directory / file), metadata={"format": "pt"})
        del tensors
    total = sum(math.prod(s) * 2 for s in shapes.values())
    (directory / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))
    text = Path(sysconfig.get_paths()["stdlib"], "textwrap.py").read_text(encoding="utf-8")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=2000, special_tokens=["<unk>", "<s>", "</s>"]))
    transformers.PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
    ).save_pretrained(directory)
    return {"bytes": total}


def prune(src: str, out: str, calib: str, mode: str) -> dict[str, float]:
    """Prune ``src`` into ``out`` as ``mode`` says (:data:`MODES`); time, peak memory and the
    parameter counts."""
    import resource

    import fxsym

    start = time.perf_counter()
    plan = fxsym.prune_checkpoint(src, out, **{"calibration": calib, **MODES[mode](src)})
    return {"seconds": time.perf_counter() - start,
            "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "before": plan.params_before, "after": plan.params_after}


def _layers_in(src: str) -> int:
    return int(json.loads(Path(src, "config.json").read_text())["num_hidden_layers"])


#: how each mode prunes a checkpoint directory (prune_checkpoint's arguments)
MODES: dict[str, Any] = {
    # half the parameters, uniform, activation importance on 2048 tokens
    "uniform": lambda src: dict(calibration_tokens=2048, seq_len=512, param_ratio=0.5,
                                round_to=64, search=False),
    # the same on the search's 512 tokens: what the search's time is compared with
    "uniform-512": lambda src: dict(calibration_tokens=512, seq_len=512, param_ratio=0.5,
                                    round_to=64, search=False),
    # half the parameters by the architecture search (a parameter target) on 512 tokens
    "search": lambda src: dict(calibration_tokens=512, seq_len=512, param_ratio=0.5,
                               round_to=64, search=True),
    # half the layers, ranked by block importance on 1024 tokens
    "depth": lambda src: dict(calibration_tokens=1024, seq_len=512,
                              layers=max(1, _layers_in(src) // 2)),
    # Mixtral-shaped: half the experts, by router load and activation on 1024 tokens
    "experts": lambda src: dict(calibration_tokens=1024, seq_len=512,
                                sizes={"experts": MOE["experts"] // 2}),
    # Mixtral-shaped: half the experts by the stored weights' l2 (no calibration run)
    "experts-l2": lambda src: dict(calibration=None, importance="l2",
                                   sizes={"experts": MOE["experts"] // 2}),
}


def floor() -> dict[str, float]:
    import resource

    import safetensors  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import fxsym

    fxsym.load_plugins()
    return {"peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def child(*args: str) -> dict[str, float]:
    """Run this script as a child doing one step; what it printed last, as JSON."""
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *args],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"child failed:\n{done.stderr[-3000:]}")
    data: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return data


def layers_for(gigabytes: float, family: str) -> int:
    """How many layers make a ``family`` checkpoint of about ``gigabytes`` (bfloat16)."""
    import math

    if family == "moe":
        h, kv, heads, ffn = MOE["hidden"], MOE["kv"], MOE["heads"], MOE["ffn"]
        per_layer = 2 * (2 * h * h + 2 * h * h * kv // heads + MOE["experts"] * (3 * h * ffn + h)
                         + 2 * h)
        outside = 2 * (2 * VOCAB * h + h)
    else:
        one, two = (sum(math.prod(v) * 2 for v in stored_shapes(family_config(family, n))
                        .values()) for n in (1, 2))
        per_layer, outside = two - one, one - (two - one)
    return max(1, round((gigabytes * 1e9 - outside) / per_layer))


def main() -> None:
    from fxsym.prune.console import render_table as table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0.5,1.5,3", help="checkpoint sizes in GB")
    parser.add_argument("--tmp", default="/tmp", help="where the checkpoints are written")
    parser.add_argument("--family", choices=(*FAMILIES, "moe"), default="llama",
                        help="llama (Llama-2-shaped), gemma3_text (sliding-window layers) or "
                        "moe (Mixtral-shaped, stored one tensor per expert)")
    parser.add_argument("--mode", choices=MODES, default=None,
                        help="uniform (default; experts with --family moe): half the "
                        "parameters (uniform-512: on the search's 512 tokens); search: the "
                        "architecture search for half the parameters; "
                        "depth: half the layers; experts-l2: half the experts by weight")
    args = parser.parse_args()
    mode = args.mode or ("experts" if args.family == "moe" else "uniform")
    if mode.startswith("experts") != (args.family == "moe"):
        parser.error(f"--mode {mode} does not go with --family {args.family}")
    least = child("floor")["peak_kb"] / 1024
    rows: list[list[object]] = [["(imports only)", "", "", "", f"{least:.0f}", "", ""]]
    import sysconfig

    for gb in (float(x) for x in args.sizes.split(",")):
        work = Path(tempfile.mkdtemp(prefix="fxsym-ckpt-", dir=args.tmp))
        try:
            src, out, calib = work / "in", work / "out", work / "calib.txt"
            calib.write_text(Path(sysconfig.get_paths()["stdlib"], "argparse.py").read_text(),
                             encoding="utf-8")
            layers = layers_for(gb, args.family)
            start = time.perf_counter()
            made = child("write", str(src), str(layers), args.family)
            written = time.perf_counter() - start
            got = child("prune", str(src), str(out), str(calib), mode)
            size_mb = made["bytes"] / 1e6
            out_mb = sum(f.stat().st_size for f in out.glob("*.safetensors")) / 1e6
            peak = got["peak_kb"] / 1024
            rows.append([f"{made['bytes'] / 1e9:.2f} GB", layers, f"{out_mb / size_mb:.2f}",
                         f"{got['after'] / got['before']:.2f}", f"{peak:.0f}",
                         f"{100 * peak * 2**20 / made['bytes']:.0f}%", f"{got['seconds']:.0f}"])
            print(f"{gb} GB: written in {written:.0f} s, pruned: {rows[-1]}", file=sys.stderr)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(table(rows, ["checkpoint", "layers", "out/in bytes", "params after/before",
                       "peak RSS MiB", "peak/size", "prune s"]))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        step, rest = sys.argv[2], sys.argv[3:]
        result = (write_checkpoint(Path(rest[0]), int(rest[1]), rest[2])
                  if step == "write"
                  else prune(*rest) if step == "prune" else floor())
        print(json.dumps(result))
    else:
        main()
