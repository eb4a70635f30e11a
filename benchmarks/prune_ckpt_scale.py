"""Peak memory and time of ``fxsym.prune_checkpoint`` on synthetic llama checkpoints of growing
size (issue 22 §5): memory should stay flat as the checkpoint grows.

Each checkpoint is a Llama-2-shaped model (hidden 2048, 16 heads of 128, 4 key/value heads,
intermediate 5632, vocabulary 32000, untied head) with as many layers as the size asks,
random bfloat16 weights written shard by shard (500 MB shards) into a temporary directory under
/tmp with a tokenizer trained on the standard library's source, deleted after. It is pruned to
half its parameters (uniform plan, activation importance on 2048 calibration tokens of the
standard library's source in sequences of 512, sizes rounded to multiples of 64).

With ``--moe``, the checkpoints are Mixtral-shaped instead (hidden 1024, 8 heads of 128, 2
key/value heads, 8 experts of width 2816 with 2 picked per token, vocabulary 32000), stored as
``save_pretrained`` stores them (one tensor per expert and projection,
``block_sparse_moe.experts.{e}.w1/w2/w3.weight``), and pruned to 4 experts per layer (router
load and activation on 1024 calibration tokens): each layer's experts are fused when the layer
runs and split again when written, one layer's experts in memory at a time.

Every step runs in a subprocess of its own; the prune's peak resident memory is the child's
``ru_maxrss`` (``resource.getrusage(RUSAGE_SELF)`` printed by the child when it is done), and
the first row is a child that only imports torch, transformers and fxsym (the floor). Target:
peak under 40 % of the checkpoint for the largest one, flat as the size grows.

``--moe --importance l2`` scores the stored weights instead (no calibration run): each
parameter read, scored and given back in turn.

With ``--search``, the llama checkpoints are pruned to half their parameters by the
architecture search (``search=True``: uniform candidates of depth and widths, each scored by
its next-token loss in a streamed pass over its pruned tensors), on 512 calibration tokens.

    python benchmarks/prune_ckpt_scale.py [--sizes 0.5,1.5,3] [--moe | --search] [--tmp DIR]
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

HIDDEN, HEADS, KV, FFN, VOCAB = 2048, 16, 4, 5632, 32000
#: the Mixtral-shaped checkpoints of ``--moe``
MOE = dict(hidden=1024, heads=8, kv=2, ffn=2816, experts=8, top_k=2)

def write_checkpoint(directory: Path, layers: int, moe: bool = False) -> dict[str, int]:
    """A synthetic llama (Mixtral with ``moe``) checkpoint in ``directory``, one 500 MB shard
    in memory at a time."""
    import math
    import sysconfig

    import torch
    import transformers
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hidden, heads, kv, ffn = ((MOE["hidden"], MOE["heads"], MOE["kv"], MOE["ffn"]) if moe
                              else (HIDDEN, HEADS, KV, FFN))
    sizes = dict(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv,
                 intermediate_size=ffn, vocab_size=VOCAB, num_hidden_layers=layers,
                 tie_word_embeddings=False, max_position_embeddings=4096, bos_token_id=1,
                 eos_token_id=2)
    config = (transformers.MixtralConfig(num_local_experts=MOE["experts"],
                                         num_experts_per_tok=MOE["top_k"], **sizes) if moe
              else transformers.LlamaConfig(**sizes))
    config.architectures = ["MixtralForCausalLM" if moe else "LlamaForCausalLM"]
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
        if not moe:
            shapes.update({p + "mlp.gate_proj.weight": (ffn, h),
                           p + "mlp.up_proj.weight": (ffn, h),
                           p + "mlp.down_proj.weight": (h, ffn)})
            continue
        m = p + "block_sparse_moe."
        shapes[m + "gate.weight"] = (MOE["experts"], h)
        for e in range(MOE["experts"]):
            shapes.update({f"{m}experts.{e}.w1.weight": (ffn, h),
                           f"{m}experts.{e}.w3.weight": (ffn, h),
                           f"{m}experts.{e}.w2.weight": (h, ffn)})
    shapes.update({"model.norm.weight": (h,), "lm_head.weight": (VOCAB, h)})
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


def prune(src: str, out: str, calib: str, moe: str = "", importance: str = "activation"
          ) -> dict[str, float]:
    import resource

    import fxsym

    start = time.perf_counter()
    if moe == "search":
        plan = fxsym.prune_checkpoint(src, out, calibration=calib, calibration_tokens=512,
                                      seq_len=512, param_ratio=0.5, round_to=64, search=True)
    elif moe and importance == "l2":
        plan = fxsym.prune_checkpoint(src, out, importance="l2",
                                      sizes={"experts": MOE["experts"] // 2})
    elif moe:
        plan = fxsym.prune_checkpoint(src, out, calibration=calib, calibration_tokens=1024,
                                      seq_len=512, sizes={"experts": MOE["experts"] // 2})
    else:
        plan = fxsym.prune_checkpoint(src, out, calibration=calib, calibration_tokens=2048,
                                      seq_len=512, param_ratio=0.5, round_to=64)
    return {"seconds": time.perf_counter() - start,
            "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "before": plan.params_before, "after": plan.params_after}


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


def layers_for(gigabytes: float, moe: bool = False) -> int:
    if moe:
        h, kv, heads, ffn = MOE["hidden"], MOE["kv"], MOE["heads"], MOE["ffn"]
        per_layer = 2 * (2 * h * h + 2 * h * h * kv // heads + MOE["experts"] * (3 * h * ffn + h)
                         + 2 * h)
        outside = 2 * (2 * VOCAB * h + h)
        return max(1, round((gigabytes * 1e9 - outside) / per_layer))
    per_layer = 2 * (2 * HIDDEN * HIDDEN + 2 * HIDDEN * HIDDEN * KV // HEADS
                     + 3 * HIDDEN * FFN + 2 * HIDDEN)
    outside = 2 * (2 * VOCAB * HIDDEN + HIDDEN)
    return max(1, round((gigabytes * 1e9 - outside) / per_layer))


def main() -> None:
    from fxsym.console import render_table as table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0.5,1.5,3", help="checkpoint sizes in GB")
    parser.add_argument("--tmp", default="/tmp", help="where the checkpoints are written")
    parser.add_argument("--moe", action="store_true",
                        help="Mixtral-shaped checkpoints pruned to half their experts")
    parser.add_argument("--importance", choices=("activation", "l2"), default="activation",
                        help="with --moe: l2 scores the stored weights (no calibration run)")
    parser.add_argument("--search", action="store_true",
                        help="the architecture search for half the parameters (512 "
                        "calibration tokens; each candidate scored by a streamed pass)")
    args = parser.parse_args()
    least = child("floor")["peak_kb"] / 1024
    rows: list[list[object]] = [["(imports only)", "", "", "", f"{least:.0f}", "", ""]]
    import sysconfig

    for gb in (float(x) for x in args.sizes.split(",")):
        work = Path(tempfile.mkdtemp(prefix="fxsym-ckpt-", dir=args.tmp))
        try:
            src, out, calib = work / "in", work / "out", work / "calib.txt"
            calib.write_text(Path(sysconfig.get_paths()["stdlib"], "argparse.py").read_text(),
                             encoding="utf-8")
            layers = layers_for(gb, args.moe)
            moe = "moe" if args.moe else ""
            start = time.perf_counter()
            made = child("write", str(src), str(layers), moe)
            written = time.perf_counter() - start
            got = child("prune", str(src), str(out), str(calib),
                        "search" if args.search else moe, args.importance)
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
        result = (write_checkpoint(Path(rest[0]), int(rest[1]), moe="moe" in rest[2:])
                  if step == "write"
                  else prune(*rest) if step == "prune" else floor())
        print(json.dumps(result))
    else:
        main()
