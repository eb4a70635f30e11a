"""Does fxsym prune an LLM well? A small llama trained on the standard library's source, pruned
to half its parameters by fxsym and by Torch-Pruning, each recovered by the same distillation.

Everything ships offline with Python: the text is this interpreter's ``Lib/*.py`` (one file in
ten, by sorted name, held out for validation), the tokenizer a byte-level BPE trained on the
training files with ``tokenizers``, the model a ``LlamaForCausalLM`` built from a
``LlamaConfig`` with random weights (untied head; the vocabulary is sized so that the embedding
and the head weigh two decoder layers, so that dropping layers alone can land at half the
parameters). The base model is trained **once**, seeded, for a fixed number of tokens, and
cached under ``--cache`` (``/tmp``, never the repository) with its validation perplexity.

Per seed (``--seeds``), what pruning and recovery depend on changes: the calibration text
(the training files in a seeded order, its first ``Setup.calib_tokens`` tokens in sequences
of ``Setup.seq_len``) and the order of the recovery batches. The base model is the same for every
seed. Rows:

* **fxsym width / depth / both**: the product end to end. The base is a checkpoint directory
  (``save_pretrained`` and the tokenizer); ``fxsym.prune_checkpoint`` reads it streamed,
  scores with activation importance (Minitron's, on the calibration text, tokenised with the
  checkpoint's tokenizer) and writes a checkpoint that plain ``from_pretrained`` loads.
  *width*: ``param_ratio=0.5`` (``scope="uniform"``, sizes multiples of ``round_to``, twice
  the heads or the heads, whichever lands within 2 % of half: :func:`fitting_round_to`);
  *depth*: ``layers=K``, the K decoder layers of highest block importance (``1 - cos`` of
  their input and output) with no width cut; *both*: ``layers=K2`` (three quarters of the
  layers) and the width cut that brings the rest to half.
* **fxsym width searched / searched**: Minitron's recipe, which does not cut every width by the
  same ratio: ``search=True, target_params=`` half, ``round_to`` the width row's. The
  uniform candidates meeting the target (hidden sizes of 1, 7/8, 3/4, 5/8 and 1/2 of the
  base's, each with the widest FFN that fits; heads whole) are scored by their next-token
  loss on the calibration text, streamed, and the lowest is kept. *width searched* keeps
  every layer (``layers=`` all of them with ``search``: the candidates' depth is fixed);
  *searched* also tries 7/8 ... 1/2 of the layers (ranked by block importance).
* **Torch-Pruning magnitude / Taylor**: its LLM recipe (``examples/LLMs`` of its repository)
  as far as it runs on transformers 5.24's llama: ``MetaPruner``, one pruning ratio for every
  group (``global_pruning=False``), the head ignored, ``GroupMagnitudeImportance(p=2)`` or
  ``GroupTaylorImportance`` (gradients of the next-token loss on the **same calibration
  batches** fxsym reads: ``CheckpointReader.calibration``), its ratio bisected once to the
  count nearest fxsym's width row's (the same kinds of sizes cut; with one ratio for every
  group the count does not depend on the importance); the config's
  ``hidden_size``/``intermediate_size`` are then set by hand, as its example does. It prunes
  the hidden size and the FFN width; **attention heads are not pruned**: with
  ``q_proj``/``k_proj``/``v_proj`` as roots (what ``num_heads`` and ``prune_num_heads=True``
  need), Torch-Pruning 1.6.1's dependency graph does not finish building their groups
  (``DependencyGraph.get_all_groups`` on a two-layer llama of hidden size 32 had not returned
  after 90 s, while the hidden-size and MLP groups take 0.2 s), so they are ignored as roots
  (their input channels still follow the hidden size). fxsym's uniform width plan keeps the
  heads too here (``round_to`` is more than the two key/value heads), so both cut the same
  kinds of sizes.

Every pruned model is recovered by the same budget: ``--recover-steps`` steps of logit
distillation from the base (KL divergence of the next-token distributions, AdamW, the same
learning rate), on batches of the training text. Perplexity is measured on the same held-out
tokens before pruning, right after pruning and after recovery.

The table gives the mean and the spread (half the range, min to max) over the seeds; the
verdict of a fxsym row compares its recovered perplexity with the best Torch-Pruning row's:
*better* or *worse* only when the two ranges do not overlap, else *tie*. The raw figures go to
``--json`` (under ``/tmp`` by default).

One torch thread (``--threads``): on the two shared cores this was written on (load 10-13),
two threads made a training step 8 times slower than one (15.2 s against 1.8 s).

    python benchmarks/prune_llm.py            # the full run (see docs/pruning.md)
    python benchmarks/prune_llm.py --smoke    # a toy size (minutes): the table's rows
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import statistics
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import fxsym

EOS = "<|endoftext|>"


@dataclass(frozen=True)
class Setup:
    """The sizes of one run (the full benchmark's, or ``--smoke``'s toy)."""

    vocab: int = 1024
    hidden: int = 96
    ffn: int = 256
    layers: int = 8
    heads: int = 4
    kv_heads: int = 2
    seq_len: int = 128
    batch: int = 16
    train_tokens: int = 1_000_000
    lr: float = 3e-3
    calib_tokens: int = 8192
    recover_steps: int = 30
    recover_lr: float = 1e-3
    eval_tokens: int = 32_768
    text_bytes: int = 0  # 0: all of Lib/*.py

    def key(self) -> str:
        return "-".join(str(v) for v in (self.vocab, self.hidden, self.ffn, self.layers,
                                         self.heads, self.kv_heads, self.seq_len, self.batch,
                                         self.train_tokens, self.lr, self.text_bytes))


SMOKE = Setup(vocab=300, hidden=32, ffn=64, layers=4, heads=4, kv_heads=2, seq_len=32, batch=8,
              train_tokens=8192, lr=3e-3, calib_tokens=256, recover_steps=2, eval_tokens=1024,
              text_bytes=200_000)


# -- data -----------------------------------------------------------------------------------
def source_files(limit: int) -> tuple[list[str], list[str]]:
    """The standard library's top-level modules as texts: (training, validation), one file in
    ten (by sorted name) held out; ``limit`` bytes at most in all when non-zero."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    train: list[str] = []
    val: list[str] = []
    used = 0
    for i, path in enumerate(sorted(stdlib.glob("*.py"))):
        text = path.read_text(encoding="utf-8", errors="replace")
        (val if i % 10 == 5 else train).append(text)
        used += len(text)
        if limit and used >= limit:
            break
    return train, val


def train_tokenizer(texts: Sequence[str], vocab: int) -> Any:
    """A byte-level BPE of ``vocab`` entries (``tokenizers``), wrapped for transformers."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab, min_frequency=2, special_tokens=[EOS],
                            show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token=EOS,
                                   bos_token=EOS, unk_token=EOS)


def encode(tokenizer: Any, texts: Sequence[str]) -> torch.Tensor:
    """The texts' tokens, one stream, each text followed by the end-of-text token."""
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def sequences(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    n = stream.numel() // seq_len
    return stream[:n * seq_len].view(n, seq_len)


def batches(data: torch.Tensor, size: int, steps: int, seed: int) -> Iterator[torch.Tensor]:
    """``steps`` batches of ``size`` sequences, in a seeded order, epoch after epoch."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(data), generator=g)
    at = 0
    for _ in range(steps):
        if at + size > len(order):
            order, at = torch.randperm(len(data), generator=g), 0
        yield data[order[at:at + size]]
        at += size


# -- models -----------------------------------------------------------------------------------
def build(setup: Setup, tokenizer: Any) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=setup.hidden, intermediate_size=setup.ffn,
        num_hidden_layers=setup.layers, num_attention_heads=setup.heads,
        num_key_value_heads=setup.kv_heads, max_position_embeddings=setup.seq_len,
        tie_word_embeddings=False, bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def perplexity(model: nn.Module, data: torch.Tensor, batch: int) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(data), batch):
        ids = data[i:i + batch]
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                       ids[:, 1:].reshape(-1), reduction="sum"))
        count += ids[:, 1:].numel()
    return math.exp(total / count)


def schedule(step: int, steps: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def train(model: nn.Module, data: torch.Tensor, setup: Setup, seed: int) -> None:
    """Next-token training of the base: ``train_tokens`` tokens, AdamW, warmup then cosine."""
    steps = max(1, setup.train_tokens // (setup.batch * setup.seq_len))
    opt = torch.optim.AdamW(model.parameters(), lr=setup.lr, weight_decay=0.1,
                            betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: schedule(s, steps, max(1, steps // 20)))
    model.train()
    for ids in progress(batches(data, setup.batch, steps, seed), steps, "training the base"):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()


def recover(student: nn.Module, teacher: nn.Module, data: torch.Tensor, setup: Setup,
            seed: int, label: str) -> None:
    """The recovery every pruned model gets: ``recover_steps`` steps of distillation of the
    teacher's next-token distributions (KL divergence), batches in a seeded order."""
    steps = setup.recover_steps
    opt = torch.optim.AdamW(student.parameters(), lr=setup.recover_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: schedule(s, steps, max(1, steps // 10)))
    teacher.eval()
    student.train()
    for ids in progress(batches(data, setup.batch, steps, seed), steps, label):
        with torch.no_grad():
            target = F.log_softmax(teacher(input_ids=ids, use_cache=False).logits, -1)
        out = F.log_softmax(student(input_ids=ids, use_cache=False).logits, -1)
        loss = F.kl_div(out.flatten(0, 1), target.flatten(0, 1), log_target=True,
                        reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        sched.step()
    student.eval()


def progress(items: Iterator[torch.Tensor], total: int, label: str) -> Iterator[torch.Tensor]:
    """``items``, with a line on stderr at each tenth of ``total`` (steps, elapsed seconds)."""
    start = time.perf_counter()
    every = max(1, total // 10)
    for i, item in enumerate(items, 1):
        yield item
        if i % every == 0 or i == total:
            print(f"{label}: {i}/{total} steps, {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)


# -- the tools --------------------------------------------------------------------------------
def prune_fxsym(base_dir: Path, work: Path, texts: Sequence[str], setup: Setup,
                **how: Any) -> nn.Module:
    """``fxsym.prune_checkpoint`` of the base checkpoint with activation importance on
    ``texts``; the output loaded with plain ``from_pretrained``."""
    from transformers import AutoModelForCausalLM

    out = work / "pruned"
    fxsym.prune_checkpoint(base_dir, out, calibration=list(texts),
                           calibration_tokens=setup.calib_tokens, seq_len=setup.seq_len,
                           importance="activation", **how)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model.eval()
    return model


def tp_ratio(base: nn.Module, calib: Sequence[dict[str, Any]], target: int) -> float:
    """Torch-Pruning's pruning ratio giving the count nearest ``target``, bisected once: with
    one ratio for every group (its LLM recipe), the count does not depend on the importance."""
    lo, hi = 0.0, 0.95
    best = (math.inf, 0.0)
    for _ in range(8):
        mid = (lo + hi) / 2
        count = n_params(tp_once(copy.deepcopy(base), calib, mid, "magnitude"))
        best = min(best, (abs(count - target), mid))
        if count > target:
            lo = mid
        else:
            hi = mid
    return best[1]


def taylor_gradients(model: nn.Module, calib: Sequence[dict[str, Any]]) -> None:
    """The gradients Torch-Pruning's Taylor importance reads: the language-model loss of each
    calibration batch, accumulated from zero."""
    model.zero_grad()
    for batch in calib:
        ids = batch["input_ids"]
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()


def tp_once(model: nn.Module, calib: Sequence[dict[str, Any]], ratio: float, kind: str
            ) -> nn.Module:
    """One Torch-Pruning prune of ``model`` in place at ``ratio`` (hidden size and FFN width;
    the attention projections are not roots: see the module docstring)."""
    import torch_pruning as tp

    config: Any = model.config
    for p in model.parameters():
        p.requires_grad_(True)
    attention = [getattr(mod, name) for mod in model.modules() if hasattr(mod, "q_proj")
                 for name in ("q_proj", "k_proj", "v_proj")]
    imp: Any = (tp.importance.GroupMagnitudeImportance(p=2) if kind == "magnitude"
                else tp.importance.GroupTaylorImportance())
    pruner = tp.pruner.MetaPruner(
        model, example_inputs=calib[0]["input_ids"], importance=imp, global_pruning=False,
        pruning_ratio=ratio, ignored_layers=[model.lm_head, *attention],
        output_transform=lambda out: out.logits)
    if kind == "taylor":
        taylor_gradients(model, calib)
    pruner.step()
    model.zero_grad(set_to_none=True)
    config.hidden_size = model.lm_head.in_features
    config.intermediate_size = model.model.layers[0].mlp.gate_proj.out_features
    return model


# -- the run ----------------------------------------------------------------------------------
def base_model(setup: Setup, cache: Path) -> tuple[Path, dict[str, Any]]:
    """The trained base as a checkpoint directory (model and tokenizer) and its record
    (validation perplexity, seconds of training), trained once and cached."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = cache / f"base-{setup.key()}"
    record_file = directory / "benchmark.json"
    if record_file.is_file():
        return directory, json.loads(record_file.read_text())
    train_texts, val_texts = source_files(setup.text_bytes)
    start = time.perf_counter()
    tokenizer = train_tokenizer(train_texts, setup.vocab)
    tok_seconds = time.perf_counter() - start
    torch.manual_seed(0)
    model = build(setup, tokenizer)
    train_ids = sequences(encode(tokenizer, train_texts), setup.seq_len)
    start = time.perf_counter()
    train(model, train_ids, setup, seed=0)
    seconds = time.perf_counter() - start
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    AutoTokenizer.from_pretrained(directory)  # the reader fxsym uses
    del model
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    val_ids = sequences(encode(tokenizer, val_texts), setup.seq_len)
    record = {"params": n_params(model), "train_seconds": seconds,
              "tokenizer_seconds": tok_seconds, "train_sequences": len(train_ids),
              "val_tokens": val_ids.numel(),
              "val_ppl": perplexity(model, val_ids[:setup.eval_tokens // setup.seq_len],
                                    setup.batch),
              "setup": asdict(setup)}
    record_file.write_text(json.dumps(record, indent=1))
    return directory, record


def fitting_round_to(model: nn.Module, setup: Setup, params: int, layers: int | None) -> int:
    """The multiple of the heads (twice the heads, else the heads) whose uniform plan to half
    the parameters lands within 2 % of half: a uniform plan's count depends on its sizes only,
    so it is read off an in-memory plan. Sizes must be multiples of the heads because Llama's
    config checks ``hidden_size % num_attention_heads == 0`` (else the output is not a plain
    checkpoint)."""
    sm = fxsym.analyze(model)
    for step in (2 * setup.heads, setup.heads):
        chosen = fxsym.plan(model, sm, target_params=params // 2, importance="l2",
                            scope="uniform", round_to=step, layers=layers)
        if abs(chosen.params_after / params - 0.5) <= 0.02:
            return step
    return setup.heads


def depth_only(setup: Setup, params: int, layer: int) -> int:
    """The number of layers whose keeping lands nearest half the parameters."""
    return min(range(1, setup.layers), key=lambda k: abs(params - (setup.layers - k) * layer
                                                         - params / 2))


ROWS = ("fxsym width", "fxsym width searched", "fxsym depth", "fxsym both", "fxsym searched",
        "Torch-Pruning magnitude", "Torch-Pruning Taylor")


def run(setup: Setup, seeds: int, cache: Path, out: Path) -> dict[str, Any]:
    """The benchmark's raw figures, also written to ``out`` after each seed."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fxsym.prune.checkpoint import open_checkpoint

    base_dir, record = base_model(setup, cache)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    for p in base.parameters():
        p.requires_grad_(False)
    train_texts, val_texts = source_files(setup.text_bytes)
    train_ids = sequences(encode(tokenizer, train_texts), setup.seq_len)
    val_ids = sequences(encode(tokenizer, val_texts), setup.seq_len)
    val_ids = val_ids[:setup.eval_tokens // setup.seq_len]
    params = n_params(base)
    layer = n_params(base.model.layers[0])
    keep = depth_only(setup, params, layer)
    both_layers = max(1, setup.layers * 3 // 4)
    before = perplexity(base, val_ids, setup.batch)
    reader = open_checkpoint(base_dir)
    width_step = fitting_round_to(base, setup, params, None)
    both_step = fitting_round_to(base, setup, params, both_layers)
    raw: dict[str, list[dict[str, Any]]] = {name: [] for name in ROWS}
    ratio: float | None = None
    for seed in range(seeds):
        order = list(train_texts)
        random.Random(seed).shuffle(order)
        calib = reader.calibration(order, tokens=setup.calib_tokens, seq_len=setup.seq_len)
        made: dict[str, tuple[nn.Module, float, str]] = {}
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            for name, how in (("fxsym width", {"param_ratio": 0.5, "round_to": width_step,
                                                 "search": False}),
                              ("fxsym width searched", {
                                  "search": True, "target_params": params // 2,
                                  "layers": setup.layers, "round_to": width_step}),
                              ("fxsym depth", {"layers": keep}),
                              ("fxsym both", {"layers": both_layers, "round_to": both_step,
                                              "target_params": params // 2,
                                              "search": False}),
                              ("fxsym searched", {"search": True,
                                                  "target_params": params // 2,
                                                  "round_to": width_step})):
                start = time.perf_counter()
                made[name] = (prune_fxsym(base_dir, Path(tmp), order, setup, **how),
                              time.perf_counter() - start, json.dumps(how))
        if ratio is None:  # the count nearest fxsym's width row's, which it is compared with
            ratio = tp_ratio(base, calib, n_params(made["fxsym width"][0]))
        for name, kind in (("Torch-Pruning magnitude", "magnitude"),
                           ("Torch-Pruning Taylor", "taylor")):
            start = time.perf_counter()
            made[name] = (tp_once(copy.deepcopy(base), calib, ratio, kind),
                          time.perf_counter() - start, f"ratio {ratio:.4f}")
        for name in ROWS:
            model, seconds, recipe = made.pop(name)
            pruned = perplexity(model, val_ids, setup.batch)
            recover(model, base, train_ids, setup, seed=1000 + seed,
                    label=f"recovering {name} (seed {seed})")
            cfg: Any = model.config
            raw[name].append({
                "seed": seed, "params": n_params(model), "ppl_pruned": pruned,
                "ppl_recovered": perplexity(model, val_ids, setup.batch),
                "prune_seconds": seconds, "how": recipe,
                "shape": {k: getattr(cfg, k) for k in (
                    "num_hidden_layers", "hidden_size", "intermediate_size",
                    "num_attention_heads", "num_key_value_heads")}})
            del model
        result = {"base": {**record, "params": params, "val_ppl": before,
                           "base_dir": str(base_dir)},
                  "seeds": seed + 1, "rows": raw}
        out.write_text(json.dumps(result, indent=1))
    return result


def spread(values: Sequence[float]) -> tuple[float, float, float, float]:
    """Mean, half the range, min and max."""
    return (statistics.fmean(values), (max(values) - min(values)) / 2, min(values),
            max(values))


def verdicts(result: dict[str, Any]) -> dict[str, str]:
    """Per fxsym row: better / worse than the best Torch-Pruning row (lowest mean recovered
    perplexity) when the ranges over the seeds do not overlap, else tie."""
    rows = result["rows"]
    rec = {name: [r["ppl_recovered"] for r in runs] for name, runs in rows.items()}
    tp_rows = [n for n in rec if n.startswith("Torch-Pruning")]
    best = min(tp_rows, key=lambda n: statistics.fmean(rec[n]))
    out = {}
    for name in rec:
        if name in tp_rows:
            out[name] = "(best Torch-Pruning)" if name == best else ""
            continue
        if max(rec[name]) < min(rec[best]):
            out[name] = "fxsym better"
        elif min(rec[name]) > max(rec[best]):
            out[name] = "fxsym worse"
        else:
            out[name] = "tie"
    return out


def render(result: dict[str, Any]) -> str:
    from fxsym.prune.console import render_table

    base = result["base"]
    verdict = verdicts(result)
    rows: list[list[str]] = [["base (unpruned)", f"{base['params']:,}", "100.0",
                              f"{base['val_ppl']:.2f}", "", "", "", ""]]

    def cell(values: Sequence[float]) -> str:
        mean, half, _, _ = spread(values)
        return f"{mean:.2f} ± {half:.2f}"

    for name, runs in result["rows"].items():
        counts = sorted({r["params"] for r in runs})
        shape = runs[0]["shape"]
        rows.append([
            name, " / ".join(f"{c:,}" for c in counts),
            " / ".join(f"{100 * c / base['params']:.1f}" for c in counts),
            f"{base['val_ppl']:.2f}", cell([r["ppl_pruned"] for r in runs]),
            cell([r["ppl_recovered"] for r in runs]),
            "L{num_hidden_layers} h{hidden_size} ffn{intermediate_size} "
            "q{num_attention_heads} kv{num_key_value_heads}".format(**shape),
            verdict[name]])
    return render_table(rows, ["setting", "params", "%", "ppl before", "ppl pruned",
                               "ppl recovered", "shape (seed 0)", "verdict"])


def main(argv: Sequence[str] | None = None, print_: Callable[[str], Any] = print) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a toy size (seconds)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--train-tokens", type=int, default=None)
    parser.add_argument("--recover-steps", type=int, default=None)
    parser.add_argument("--cache", type=Path,
                        default=Path(tempfile.gettempdir()) / "fxsym-prune-llm")
    parser.add_argument("--json", type=Path, default=None,
                        help="raw figures (default: CACHE/results-<setup>.json)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    setup = SMOKE if args.smoke else Setup()
    changes = {k: v for k, v in (("train_tokens", args.train_tokens),
                                 ("recover_steps", args.recover_steps)) if v is not None}
    if changes:
        setup = Setup(**{**asdict(setup), **changes})
    args.cache.mkdir(parents=True, exist_ok=True)
    fxsym.load_plugins()
    from transformers.utils import logging

    logging.disable_progress_bar()
    start = time.perf_counter()
    out = args.json or args.cache / f"results-{setup.key()}.json"
    result = run(setup, args.seeds, args.cache, out)
    result["seconds"] = time.perf_counter() - start
    out.write_text(json.dumps(result, indent=1))
    base = result["base"]
    print_(f"llama {base['params']:,} parameters, trained once on "
           f"{setup.train_tokens:,} tokens of Lib/*.py ({base['train_seconds']:.0f} s), "
           f"vocabulary {setup.vocab}, sequences of {setup.seq_len}; validation perplexity on "
           f"{setup.eval_tokens:,} held-out tokens; recovery: {setup.recover_steps} steps of "
           f"distillation from the base ({setup.batch} sequences a step); {args.seeds} seeds "
           "(calibration sample and recovery order); mean ± half the range")
    print_(render(result))
    print_(f"raw figures: {out} ({result['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
