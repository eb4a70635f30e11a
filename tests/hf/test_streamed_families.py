"""Streamed = in memory, family by family (issue 29 §1).

A checkpoint is calibrated block by block (:func:`fxsym.prune.checkpoint.stream_activations`) and
its candidates scored block by block (:func:`fxsym.prune.checkpoint.stream_loss`, and all together
as the search scores them: :func:`fxsym.prune.checkpoint.stream_losses`). Each must equal
the same computation on the model loaded whole by ``from_pretrained``: the activation scores
of every group (:func:`fxsym.importance.activation`), each block's ``1 - cos`` between its
input and output hidden states (hooks on the loaded model), and a pruned candidate's
next-token loss (the plan applied to the loaded model, run batch by batch).

The families are those whose layers differ: sliding windows on some layers (gemma2,
gemma3_text with local and global rotary, qwen2 / qwen3 with ``max_window_layers``, cohere2,
olmo3, exaone4, gpt_oss, mistral), no-rope layers (smollm3), dense-then-MoE stacks (qwen2_moe's
``mlp_only_layers``, qwen3_moe, deepseek_v3's ``first_k_dense_replace``) and hybrid
attention / state-space / convolution stacks (jamba, bamba, falcon_h1, granitemoehybrid,
zamba2 with its shared attention block called from several layers, qwen3_next's linear
attention, lfm2); llama is the plain reference. The windows are
smaller than the calibration sequences, so a window that is replayed to the wrong layer
changes the scores (it did: 3-44 % on 3-7 groups of each windowed family before the streamed
run became the model's own program).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from ckpt_helpers import LAYERED, TEXT, block_importance, checkpoint

import fxsym
import fxsym.prune.checkpoint as ckpt
import fxsym.prune.checkpoint.tensors as ckpt_tensors
from fxsym.prune.search.losses import loss_of

#: the layers a depth candidate keeps, where not 0, 1, 3: Jamba's attention period gives no
#: Mamba, attention, attention (refused, tests/hf/test_depth_families.py)
DEPTH = {"jamba": [1, 2, 3]}


@pytest.mark.parametrize("family", sorted(LAYERED))
def test_streamed_runs_are_the_in_memory_runs(tmp_path: Path, family: str) -> None:
    """Scores, block importance and a width and a depth candidate's loss, streamed and in
    memory, agree to float32 rounding (3 batches of up to 24 tokens, windows of 6)."""
    src = tmp_path / "in"
    checkpoint(src, family, num_hidden_layers=4, **LAYERED[family])
    reader = ckpt.open_checkpoint(src)
    batches = reader.calibration([TEXT], tokens=64, seq_len=24)
    assert len(batches) == 3
    meta = reader.build()
    tensors = ckpt_tensors.Tensors(reader.directory, reader.tensor_files(), reader.stored(meta))
    ckpt_tensors.load_buffers(meta, tensors)
    sm = fxsym.analyze(meta)
    streamed = ckpt.stream_activations(meta, sm, tensors, batches)

    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    model_sm = fxsym.analyze(model)
    loaded = fxsym.importance.activation(batches, consumers_only=True)(model, model_sm)
    assert streamed.scores.keys() == loaded.keys() and loaded
    for name, scores in loaded.items():
        torch.testing.assert_close(streamed.scores[name], scores, rtol=1e-5, atol=1e-8,
                                   msg=lambda m, name=name: f"{name}: {m}")
    prefix, blocks = ckpt.block_list(model)  # type: ignore[misc]
    assert streamed.blocks == prefix
    torch.testing.assert_close(torch.tensor(streamed.block_importance),
                               torch.tensor(block_importance(model, blocks, batches)),
                               rtol=1e-5, atol=1e-7)

    lay = fxsym.importance.layout(meta, sm)

    def given(m: Any, s: Any) -> dict[str, torch.Tensor]:
        return streamed.scores

    candidates = [fxsym.plan(meta, sm, importance=given, ratio=0.25, scope="uniform")]
    if sm.depth_groups():
        candidates.append(fxsym.plan(meta, sm, importance=given,
                                     layers=DEPTH.get(family, [0, 1, 3])))
    alone = [ckpt.stream_loss(meta, sm, tensors, lay, c, batches) for c in candidates]
    for candidate, got in zip(candidates, alone):
        in_memory = loss_of(model, model_sm, candidate, batches, None, None)  # the search's
        assert got == pytest.approx(in_memory, rel=1e-5), candidate
    together = ckpt.stream_losses(meta, sm, tensors, lay, [*candidates, *candidates], batches)
    assert together == pytest.approx(alone + alone, rel=1e-6)  # the search's run: read once
