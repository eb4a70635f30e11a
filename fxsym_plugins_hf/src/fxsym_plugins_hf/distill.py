"""Recovery of a pruned language model by logit distillation from the model it was pruned from
(Minitron's second half): :func:`distill`, and
``python -m fxsym_plugins_hf.distill STUDENT TEACHER --text FILE -o OUT``.

The student (the pruned checkpoint) learns the teacher's next-token distributions on the
user's text: the loss is the KL divergence ``KL(teacher || student)`` of the two models'
softmaxes at ``temperature`` (times ``temperature**2``, so that its gradients keep their
scale), per token, averaged over the tokens, mixed with the student's next-token cross
entropy when ``ce_weight`` > 0 (``(1 - ce_weight) * KL + ce_weight * CE``). The training is
transformers' :class:`~transformers.Trainer` (its optimizer, AdamW; its schedule, linear
decay after a warm-up; its seeding and its device placement) with one override,
``compute_loss``: no training loop of fxsym's own.

Both checkpoints are read with plain ``from_pretrained`` (a checkpoint fxsym pruned to sizes
that differ between layers, model type ``fxsym_pruned``, with ``trust_remote_code=True``:
its ``fxsym_pruned.py`` calls the installed fxsym), in float32. The text (plain text or JSON
lines with ``"text"``: :func:`fxsym.prune.checkpoint.read_calibration_text`) is tokenised with the
student's tokenizer (the teacher's if the student has none), each text followed by the end
of sequence token, and cut into sequences of ``seq_len`` tokens; the trainer draws shuffled
batches of them, again and again for ``steps`` steps.

The output is written atomically (:func:`fxsym.prune.persist.replace_directory`) and keeps what
the student's directory carried: the tokenizer's files, ``fxsym.json`` (the plan: the
training changed values, not shapes) and any other file beside the weights. A checkpoint
whose ``config.json`` describes the model is saved by ``save_pretrained`` in the student's
stored dtype (plain ``from_pretrained`` loads it); an ``fxsym_pruned`` one by
:func:`fxsym.save` with the plans of its ``fxsym.json`` (``save_pretrained`` would write the
unpruned model's ``config.json`` for it, which no reader could load), so it loads as it did.

Memory: the teacher is held in memory whole, in float32, beside the student, the student's
gradients and AdamW's two moments (about 4 bytes * (teacher + 4 * student) parameters, plus
the activations of one batch and both models' logits, ``batch_size * seq_len * vocab`` floats
each). Streaming the teacher block by block, or precomputing its top-k logits, is not done
(future work): a teacher larger than memory cannot be used here.

Refusals (:class:`fxsym.CheckpointError`): a student or teacher ``from_pretrained`` cannot
read, vocabularies that differ (the models' output sizes, or the two tokenizers'
vocabularies), no tokenizer in either directory, an output that is, holds or is inside an
input; (:class:`fxsym.CalibrationError`) a text file that is empty or not text, or shorter
than one sequence.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fxsym.errors import CalibrationError, CheckpointError, FxsymError

__all__ = ["DistillResult", "Losses", "distill", "main"]

#: the files of a checkpoint directory the output writes anew (the rest is carried over)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".index.json", ".pt", ".pth", ".msgpack", ".h5")
_WRITTEN = {"config.json", "generation_config.json"}
#: the most tokens of held-out text evaluated
MAX_EVAL_TOKENS = 1 << 16


@dataclass(frozen=True)
class Losses:
    """A model's losses on held-out text: its next-token cross entropy (nats per token) and
    ``KL(teacher || student)`` at temperature 1 (nats per token), over ``tokens`` tokens."""

    ce: float
    kl: float
    tokens: int

    @property
    def perplexity(self) -> float:
        """``exp(ce)``."""
        return math.exp(self.ce)


@dataclass(frozen=True)
class DistillResult:
    """What :func:`distill` did: the checkpoint written, the steps trained, the tokens of
    training text available, the training loss logged first and last (the distillation loss
    averaged over the logging period), the held-out losses before and after (``None``
    without held-out text) and the seconds the training took."""

    output: Path
    steps: int
    train_tokens: int
    first_loss: float
    last_loss: float
    seconds: float
    before: Losses | None = None
    after: Losses | None = None
    log: list[tuple[int, float]] = field(default_factory=list)


def distill(student_dir: str | os.PathLike[str], teacher_dir: str | os.PathLike[str],
            output: str | os.PathLike[str], *, text: str | os.PathLike[str],
            heldout: str | os.PathLike[str] | None = None, steps: int = 200,
            batch_size: int = 4, seq_len: int = 256, lr: float = 1e-4,
            temperature: float = 1.0, ce_weight: float = 0.0, warmup_steps: int | None = None,
            eval_tokens: int = 2048, seed: int = 0, progress: bool = True) -> DistillResult:
    """Train the checkpoint ``student_dir`` to match ``teacher_dir``'s logits on the text of
    file ``text`` for ``steps`` steps of ``batch_size`` sequences of ``seq_len`` tokens, and
    write it to ``output`` (see the module's description). ``heldout`` (a text file) is
    evaluated before and after on its first ``eval_tokens`` tokens. ``progress`` prints a
    line to stderr every twentieth of the run."""
    from fxsym.prune.checkpoint import calibration_bytes, read_calibration_text
    from fxsym.prune.paths import check_new_output, overlap

    if steps < 1 or batch_size < 1 or seq_len < 2 or lr <= 0 or temperature <= 0 \
            or not 0 <= ce_weight <= 1 or eval_tokens < 2:
        raise CheckpointError("steps, batch_size >= 1, seq_len >= 2, lr > 0, temperature > 0, "
                              "0 <= ce_weight <= 1 and eval_tokens >= 2 are needed")
    student_path, teacher_path = Path(student_dir), Path(teacher_dir)
    for source in (student_path, teacher_path):
        if not source.is_dir():
            raise CheckpointError(f"{source}: not a directory (give what save_pretrained "
                                  "wrote)")
        why = overlap(source, output)
        if why is None and os.path.exists(output):
            why = overlap(output, source)
        if why is not None:
            raise CheckpointError(f"{why}; give an output outside the inputs")
    check_new_output(Path(os.path.abspath(output)))
    tokens_needed = steps * batch_size * seq_len
    texts = read_calibration_text(text, limit=calibration_bytes(tokens_needed))
    held = (read_calibration_text(heldout, limit=calibration_bytes(eval_tokens))
            if heldout is not None else None)

    tokenizer, tokenizer_dir = _tokenizer(student_path, teacher_path)
    ids = _token_ids(tokenizer, texts, tokens_needed)
    if len(ids) < seq_len:
        raise CalibrationError(f"{text} holds {len(ids)} tokens, fewer than one sequence of "
                               f"{seq_len}: give more text or a smaller seq_len")
    train = [ids[i:i + seq_len] for i in range(0, len(ids) - seq_len + 1, seq_len)]
    evaluation = None
    if held is not None:
        held_ids = _token_ids(tokenizer, held, min(eval_tokens, MAX_EVAL_TOKENS))
        if len(held_ids) < 2:
            raise CalibrationError(f"{heldout} holds fewer than 2 tokens")
        evaluation = [held_ids[i:i + seq_len] for i in range(0, len(held_ids), seq_len)]
        evaluation = [s for s in evaluation if len(s) >= 2]
    torch.manual_seed(seed)
    student = _load(student_path, "student")
    teacher = _load(teacher_path, "teacher")
    for p in teacher.parameters():
        p.requires_grad_(False)
    _check_vocabularies(student, teacher, student_path, teacher_path)
    stored_dtype = _stored_dtype(student_path)
    before = _evaluate(student, teacher, evaluation) if evaluation else None

    start = time.monotonic()
    log = _train(student, teacher, train, steps=steps, batch_size=batch_size, lr=lr,
                 temperature=temperature, ce_weight=ce_weight, seed=seed,
                 warmup_steps=warmup_steps, progress=progress)
    seconds = time.monotonic() - start
    after = _evaluate(student, teacher, evaluation) if evaluation else None
    out = _write(student, student_path, tokenizer, tokenizer_dir, Path(output), stored_dtype)
    return DistillResult(output=out, steps=steps, train_tokens=len(train) * seq_len,
                         first_loss=log[0][1] if log else float("nan"),
                         last_loss=log[-1][1] if log else float("nan"), seconds=seconds,
                         before=before, after=after, log=log)


def _load(directory: Path, role: str) -> Any:
    """The model of ``directory`` by ``AutoModelForCausalLM.from_pretrained``, float32, eval;
    an ``fxsym_pruned`` checkpoint through its ``fxsym_pruned.py``."""
    import transformers

    from .checkpoint import MODEL_TYPE

    remote = _model_type(directory) == MODEL_TYPE
    try:
        with _no_bars():
            model = transformers.AutoModelForCausalLM.from_pretrained(
                directory, dtype=torch.float32, local_files_only=True,
                trust_remote_code=remote)
    except Exception as exc:
        raise CheckpointError(f"the {role} {directory} could not be read by from_pretrained: "
                              f"{type(exc).__name__}: {' '.join(str(exc).split())}") from exc
    return model.float().eval()  # type: ignore[no-untyped-call]


@contextmanager
def _no_bars() -> Iterator[None]:
    """transformers' progress bars (loading and writing weights) off for the block: the
    command's output is its own lines."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def _model_type(directory: Path) -> str | None:
    import json

    try:
        data = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    found = data.get("model_type") if isinstance(data, dict) else None
    return found if isinstance(found, str) else None


def _stored_dtype(directory: Path) -> torch.dtype:
    """The dtype the student's ``config.json`` says its weights are stored in (float32 if
    it does not say)."""
    import json

    try:
        data = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return torch.float32
    if isinstance(data, dict) and isinstance(data.get("pruned_config"), dict):
        data = data["pruned_config"]
    name = data.get("dtype", data.get("torch_dtype")) if isinstance(data, dict) else None
    found = getattr(torch, name, None) if isinstance(name, str) else None
    return found if isinstance(found, torch.dtype) and found.is_floating_point \
        else torch.float32


def _tokenizer(student: Path, teacher: Path) -> tuple[Any, Path]:
    """The student's tokenizer (the teacher's if the student has none) and its directory;
    :class:`CheckpointError` if neither has one or the two tokenizers' vocabularies differ."""
    from transformers import AutoTokenizer

    from .checkpoint import MODEL_TYPE

    found: dict[Path, Any] = {}
    for directory in (student, teacher):
        # an fxsym_pruned config names fxsym's own loader, which the model is read with too
        remote = _model_type(directory) == MODEL_TYPE
        try:
            tok = AutoTokenizer.from_pretrained(directory, local_files_only=True,
                                                trust_remote_code=remote)
        except Exception:
            continue
        if callable(tok) and not isinstance(tok, bool):
            found[directory] = tok
    if not found:
        raise CheckpointError(f"neither {student} nor {teacher} holds a tokenizer "
                              "(AutoTokenizer.from_pretrained reads none) to tokenise the text")
    if len(found) == 2 and found[student].get_vocab() != found[teacher].get_vocab():
        raise CheckpointError(f"the tokenizers of {student} and {teacher} have different "
                              "vocabularies: a student distils only from a teacher of its own "
                              "vocabulary")
    where = student if student in found else teacher
    return found[where], where


def _check_vocabularies(student: Any, teacher: Any, student_dir: Path, teacher_dir: Path
                        ) -> None:
    s = student.get_output_embeddings().weight.shape[0]
    t = teacher.get_output_embeddings().weight.shape[0]
    if s != t:
        raise CheckpointError(f"the student {student_dir} predicts {s} tokens and the teacher "
                              f"{teacher_dir} {t}: their vocabularies differ, the logits "
                              "cannot be compared")


def _token_ids(tokenizer: Any, texts: Sequence[str], limit: int) -> list[int]:
    """The first ``limit`` token ids of ``texts``, each text followed by the end of sequence
    token (as fxsym's calibration tokenises)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    ids: list[int] = []
    for one in texts:
        ids.extend(tokenizer(one, add_special_tokens=False)["input_ids"])
        if isinstance(eos, int):
            ids.append(eos)
        if len(ids) >= limit:
            break
    return ids[:limit]


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                      labels: torch.Tensor | None = None, *, temperature: float = 1.0,
                      ce_weight: float = 0.0) -> torch.Tensor:
    """``(1 - ce_weight) * T² * KL(teacher_T || student_T) + ce_weight * CE``: the KL per
    token (summed over the vocabulary, averaged over the tokens) of the softmaxes at
    temperature ``T``, and the student's next-token cross entropy on ``labels`` (the input
    ids: the logits at a position predict the next one)."""
    import torch.nn.functional as F

    s = student_logits.float().flatten(0, -2)
    t = teacher_logits.float().flatten(0, -2)
    kl = F.kl_div(F.log_softmax(s / temperature, dim=-1), F.log_softmax(t / temperature, dim=-1),
                  log_target=True, reduction="sum") / s.shape[0] * temperature ** 2
    if ce_weight == 0 or labels is None:
        return kl
    ce = F.cross_entropy(student_logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten())
    return (1 - ce_weight) * kl + ce_weight * ce


def _train(student: Any, teacher: Any, sequences: list[list[int]], *, steps: int,
           batch_size: int, lr: float, temperature: float, ce_weight: float, seed: int,
           warmup_steps: int | None, progress: bool) -> list[tuple[int, float]]:
    """Train ``student`` with transformers' ``Trainer``; return the logged losses by step."""
    import tempfile

    import transformers
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    every = max(1, steps // 20)
    log: list[tuple[int, float]] = []
    started = time.monotonic()

    class Distiller(transformers.Trainer):
        def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            ids = inputs["input_ids"]
            if next(teacher.parameters()).device != ids.device:
                teacher.to(ids.device)
            with torch.no_grad():
                target = teacher(input_ids=ids, use_cache=False).logits
            outputs = model(input_ids=ids, use_cache=False)
            loss = distillation_loss(outputs.logits, target, ids, temperature=temperature,
                                     ce_weight=ce_weight)
            return (loss, outputs) if return_outputs else loss

    class Lines(transformers.TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
                   **kwargs: Any) -> None:
            if logs and "loss" in logs:
                log.append((int(state.global_step), float(logs["loss"])))
                if progress:
                    print(f"distill: step {state.global_step}/{steps}  loss "
                          f"{float(logs['loss']):.4f}  ({time.monotonic() - started:.0f} s)",
                          file=sys.stderr, flush=True)

    data = [{"input_ids": torch.tensor(s)} for s in sequences]
    with tempfile.TemporaryDirectory(prefix="fxsym-distill-") as scratch:
        args = transformers.TrainingArguments(
            output_dir=scratch, max_steps=steps, per_device_train_batch_size=batch_size,
            learning_rate=lr, warmup_steps=(max(1, steps // 10) if warmup_steps is None
                                            else warmup_steps),
            lr_scheduler_type="linear", logging_steps=every, logging_first_step=True,
            save_strategy="no", report_to=[], seed=seed, data_seed=seed,
            disable_tqdm=True, remove_unused_columns=False, dataloader_num_workers=0,
            dataloader_pin_memory=False)
        trainer = Distiller(model=student, args=args, train_dataset=data,
                            data_collator=_collate, callbacks=[Lines()])
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        trainer.train()
    student.eval()
    return log


def _collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.stack([r["input_ids"] for r in rows])}


@torch.no_grad()
def _evaluate(student: Any, teacher: Any, sequences: list[list[int]]) -> Losses:
    """The student's next-token cross entropy and its KL to the teacher (temperature 1),
    per token, over ``sequences`` (on the student's device)."""
    import torch.nn.functional as F

    device = next(student.parameters()).device
    teacher.to(device)
    ce_sum = kl_sum = 0.0
    ce_n = kl_n = 0
    for seq in sequences:
        ids = torch.tensor([seq], device=device)
        s = student(input_ids=ids, use_cache=False).logits.float()[0]
        t = teacher(input_ids=ids, use_cache=False).logits.float()[0]
        ce_sum += float(F.cross_entropy(s[:-1], ids[0, 1:], reduction="sum"))
        ce_n += len(seq) - 1
        kl_sum += float(F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), log_target=True,
                                 reduction="sum"))
        kl_n += len(seq)
    return Losses(ce=ce_sum / ce_n, kl=kl_sum / kl_n, tokens=kl_n)


def _write(student: Any, student_dir: Path, tokenizer: Any, tokenizer_dir: Path, out: Path,
           dtype: torch.dtype) -> Path:
    """Write the trained ``student`` into ``out`` atomically, carrying the student
    directory's other files (see the module's description)."""
    import fxsym
    from fxsym.prune.paths import check_new_output, kind
    from fxsym.prune.persist import MANIFEST, read_manifest, replace_directory

    from .checkpoint import MODEL_TYPE, MODULE

    out = Path(os.path.abspath(out))
    check_new_output(out)
    remote = _model_type(student_dir) == MODEL_TYPE
    rewritten = set(_WRITTEN)
    if remote:
        rewritten |= {MANIFEST, f"{MODULE}.py"}
    student.to(dtype)
    try:
        with replace_directory(out) as tmp:
            for entry in sorted(os.listdir(student_dir)):
                path = student_dir / entry
                if entry in rewritten or entry.endswith(_WEIGHT_SUFFIXES) \
                        or entry.startswith(".") or not path.is_file() or kind(path) is not None:
                    continue
                shutil.copy2(path, tmp / entry, follow_symlinks=True)
            if tokenizer_dir != student_dir:
                tokenizer.save_pretrained(tmp)
            if remote:
                saved = read_manifest(student_dir)
                fxsym.save(student, tmp, saved["plan"], source=saved["source"],
                           history=saved["history"])
            else:
                with _no_bars():
                    student.save_pretrained(tmp)
    except FxsymError:
        raise
    except Exception as exc:
        raise CheckpointError(f"could not write {out}: {type(exc).__name__}: {exc}") from exc
    finally:
        student.float()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fxsym_plugins_hf.distill STUDENT TEACHER --text FILE -o OUT``: exit 0,
    or 2 with one ``fxsym:`` line on stderr when refused."""
    parser = argparse.ArgumentParser(
        prog="python -m fxsym_plugins_hf.distill",
        description="Recover a pruned checkpoint (STUDENT) by distilling the logits of the "
                    "model it was pruned from (TEACHER) on your text; write a checkpoint "
                    "from_pretrained loads. The teacher is held in memory.")
    parser.add_argument("student", help="the pruned checkpoint directory")
    parser.add_argument("teacher", help="the original checkpoint directory")
    parser.add_argument("--text", required=True,
                        help="training text: plain text, or JSON lines with \"text\"")
    parser.add_argument("-o", "--output", required=True, help="a new or empty directory")
    parser.add_argument("--heldout", help="text evaluated before and after (perplexity, KL)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--ce-weight", type=float, default=0.0,
                        help="weight of the next-token cross entropy mixed with the KL")
    parser.add_argument("--eval-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    try:
        result = distill(args.student, args.teacher, args.output, text=args.text,
                         heldout=args.heldout, steps=args.steps, batch_size=args.batch_size,
                         seq_len=args.seq_len, lr=args.lr, temperature=args.temperature,
                         ce_weight=args.ce_weight, eval_tokens=args.eval_tokens,
                         seed=args.seed, progress=not args.quiet)
    except FxsymError as exc:
        print(f"fxsym: {exc}", file=sys.stderr)
        return 2
    print(f"distilled {result.steps} steps in {result.seconds:.0f} s: training loss "
          f"{result.first_loss:.4f} -> {result.last_loss:.4f}")
    if result.before is not None and result.after is not None:
        b, a = result.before, result.after
        print(f"held-out ({a.tokens} tokens): perplexity {b.perplexity:.2f} -> "
              f"{a.perplexity:.2f}, KL to the teacher {b.kl:.4f} -> {a.kl:.4f}")
    print(f"wrote {result.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
