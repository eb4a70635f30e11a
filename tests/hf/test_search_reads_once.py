"""The search reads the checkpoint once (issue 31 §4): its candidates are scored in one
streamed run (:func:`fxsym.prune.checkpoint.stream_losses`), every tensor read once for all of them,
with the losses each gets scored alone (:func:`fxsym.prune.checkpoint.stream_loss`). Reads are
counted where safetensors reads a tensor's bytes (``ckpt_helpers.on_reads``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_helpers import TEXT, block_importance, checkpoint, on_reads

import fxsym
import fxsym.prune.checkpoint as ckpt
import fxsym.prune.checkpoint.tensors as ckpt_tensors


def _opened(src: Path, **overrides: Any) -> tuple[Any, Any, Any, Any, list[Any]]:
    """A tiny llama checkpoint written to ``src`` and opened for streaming: the model written,
    its meta model (buffers loaded) with its analysis, the tensors and calibration batches."""
    model = checkpoint(src, "llama", **overrides)
    reader = ckpt.open_checkpoint(src)
    batches = reader.calibration([TEXT], tokens=64, seq_len=24)
    meta = reader.build()
    tensors = ckpt_tensors.Tensors(reader.directory, reader.tensor_files(), reader.stored(meta))
    ckpt_tensors.load_buffers(meta, tensors)
    return model, meta, fxsym.analyze(meta), tensors, batches


def _setup(src: Path) -> tuple[Any, Any, Any, Any, list[Any], list[fxsym.Plan]]:
    _, meta, sm, tensors, batches = _opened(src, num_hidden_layers=4)
    lay = fxsym.importance.layout(meta, sm)
    scores = ckpt.stream_activations(meta, sm, tensors, batches).scores

    def given(m: Any, s: Any) -> dict[str, torch.Tensor]:
        return scores

    plans = [fxsym.plan(meta, sm, importance=given, ratio=0.25, scope="uniform"),
             fxsym.plan(meta, sm, importance=given, layers=[0, 2, 3]),
             fxsym.plan(meta, sm, importance=given, layers=[1, 3], ratio=0.5, scope="uniform")]
    return meta, sm, tensors, lay, batches, plans


def test_candidates_scored_together_read_each_tensor_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    meta, sm, tensors, lay, batches, plans = _setup(tmp_path / "in")
    alone = [ckpt.stream_loss(meta, sm, tensors, lay, p, batches) for p in plans]
    reads: Counter[str] = Counter()
    on_reads(monkeypatch, lambda name: reads.update([name]))
    together = ckpt.stream_losses(meta, sm, tensors, lay, plans, batches)
    assert together == pytest.approx(alone, rel=1e-6)
    assert reads and max(reads.values()) == 1, reads.most_common(3)
    # layer 1 is kept by two of the three candidates, read once; nothing is read twice
    assert sum(n.startswith("model.layers.1.") for n in reads) == len(
        [n for n in tensors.files if n.startswith("model.layers.1.")])


def test_one_at_a_time_reads_them_again(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The counting can fail: scored one at a time, the shared layers are read again."""
    meta, sm, tensors, lay, batches, plans = _setup(tmp_path / "in")
    reads: Counter[str] = Counter()
    on_reads(monkeypatch, lambda name: reads.update([name]))
    for p in plans:
        ckpt.stream_loss(meta, sm, tensors, lay, p, batches)
    assert max(reads.values()) == 3


def test_the_search_of_a_checkpoint_scores_its_candidates_in_one_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``prune_checkpoint``'s search: each block tensor is read by the calibration run, the
    scoring run of its shortlist (four candidates by default) and the writer — three times,
    however many candidates (before: once per candidate more)."""
    src = tmp_path / "in"
    model = checkpoint(src, "llama", num_hidden_layers=4)
    target = sum(p.numel() for p in model.parameters()) // 2
    reads: Counter[str] = Counter()
    on_reads(monkeypatch, lambda name: reads.update([name]))
    plan = fxsym.prune_checkpoint(src, tmp_path / "out", calibration=[TEXT],
                                  target_params=target, calibration_tokens=64, seq_len=24,
                                  round_to=8)
    assert len(plan.extra["search"]) > 3
    blocks = {n: k for n, k in reads.items() if n.startswith("model.layers.")}
    assert blocks and max(blocks.values()) <= 3, Counter(blocks.values())
    scored = [r["loss"] for r in plan.extra["search"] if r["scored"]]
    assert len(scored) == 4 and torch.isfinite(torch.tensor(scored)).all()


def test_the_calibration_pass_reads_a_tied_embedding_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedding tied to the head is read once by the calibration pass, kept from the
    embedding's call to the head's (before: read again for the head, 21 % of SmolLM2's
    checkpoint): the pass reads every stored tensor once, its bytes the checkpoint's, and the
    block importance is the whole model's."""
    model, meta, sm, tensors, batches = _opened(tmp_path / "in", num_hidden_layers=3,
                                                tie_word_embeddings=True)
    reads: Counter[str] = Counter()
    on_reads(monkeypatch, lambda name: reads.update([name]))
    streamed = ckpt.stream_activations(meta, sm, tensors, batches)
    assert "lm_head.weight" not in tensors.files
    assert reads == Counter(dict.fromkeys(tensors.files, 1)), reads.most_common(2)
    assert tensors.bytes_read == tensors.stored_bytes()
    assert streamed.block_importance == pytest.approx(
        block_importance(model, model.model.layers, batches), rel=1e-5, abs=1e-7)


def test_a_search_reads_the_checkpoint_at_most_three_times(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``prune_checkpoint``'s width search (every candidate keeps the 4 layers, so the writer
    reads every tensor) on a checkpoint whose embedding is tied to its head: every tensor,
    the embedding too, is read by the calibration pass, the scoring of every candidate and
    the writer, once each; the bytes read are at most three times the checkpoint's (before:
    the tied embedding once more, 3.09 times the checkpoint)."""
    src = tmp_path / "in"
    model = checkpoint(src, "llama", num_hidden_layers=4, tie_word_embeddings=True)
    target = sum(p.numel() for p in model.parameters()) // 2
    reads: Counter[str] = Counter()
    on_reads(monkeypatch, lambda name: reads.update([name]))
    plan = fxsym.prune_checkpoint(src, tmp_path / "out", calibration=[TEXT],
                                  target_params=target, calibration_tokens=64, seq_len=24,
                                  round_to=8, shortlist=None, layers=4)
    assert len(plan.extra["search"]) > 1 and all(r["scored"] for r in plan.extra["search"])
    assert reads["model.embed_tokens.weight"] <= 3 and max(reads.values()) <= 3, \
        reads.most_common(3)
    read = plan.extra["read"]
    assert read["bytes"] <= 3 * read["checkpoint"], read
