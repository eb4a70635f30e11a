"""A checkpoint directory pruned by a plan its config cannot describe (issue 22 §1): sizes
that differ between layers (``scope="global"``). The output is a directory ``fxsym.load``
reads, sharded safetensors with their index beside the plan, and whose ``config.json`` no
reader mistakes for the original: ``from_pretrained(OUT, trust_remote_code=True)`` gives the
model the in-memory path gives, tensor for tensor."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import transformers
from ckpt_helpers import checkpoint

import fxsym
from fxsym.prune.cli import main

SHARD = 40_000  # bytes: several output shards for a tiny model


def _in_memory(src: Path, ratio: float) -> tuple[torch.nn.Module, fxsym.Plan]:
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    sm = fxsym.analyze(model)
    plan = fxsym.plan(model, sm, importance="l2", ratio=ratio, scope="global")
    plan.apply(model, sm)
    return model, plan


#: a MoE family too: its experts are stored one tensor per expert, fused in the model
MOE = dict(head_dim=16, moe_intermediate_size=32, intermediate_size=48, num_experts=4,
           num_experts_per_tok=2, decoder_sparse_step=1)


@pytest.mark.parametrize("family, tied", [("llama", True), ("qwen2", False),
                                          ("qwen3_moe", False)])
def test_a_global_plan_writes_a_sharded_directory_fxsym_loads(
        tmp_path: Path, family: str, tied: bool) -> None:
    src = tmp_path / "in"
    original = checkpoint(src, family, tie_word_embeddings=tied,
                          **(MOE if family == "qwen3_moe" else {}))
    out = tmp_path / "out"
    streamed = fxsym.prune_checkpoint(src, out, importance="l2", ratio=0.3, scope="global",
                                      max_shard_size=SHARD)
    model, plan = _in_memory(src, 0.3)
    assert streamed.choices() == plan.choices()
    per_layer = [{n.split(f"layers.{i}.")[1]: tuple(p.shape)
                  for n, p in model.named_parameters() if f"layers.{i}." in n} for i in range(3)]
    assert per_layer[0] != per_layer[1] or per_layer[1] != per_layer[2]  # not uniform
    files = set(os.listdir(out))
    assert {"config.json", "fxsym.json", "fxsym_pruned.py", "model.safetensors.index.json",
            "tokenizer.json", "generation_config.json"} <= files
    assert "model.safetensors" not in files
    assert len([f for f in files if f.endswith(".safetensors")]) > 1
    assert json.loads((out / "config.json").read_text())["model_type"] == "fxsym_pruned"
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        transformers.AutoModelForCausalLM.from_pretrained(out)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert type(loaded) is type(original) and not loaded.training
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name
    if tied:
        assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    ids = torch.tensor([[1, 5, 9, 12, 40]])
    with torch.no_grad():  # qwen3_moe's grouped_mm experts: widths kept in multiples of 8
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)
    # fxsym.load on a fresh model of the unpruned config reads the same shards
    fresh = transformers.AutoModelForCausalLM.from_config(original.config).eval()
    fxsym.load(fresh, out)
    for name, t in fresh.state_dict().items():
        assert torch.equal(t, want[name]), name


def test_the_cli_says_which_kind_of_directory_it_wrote(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2)
    assert main(["prune", str(src), "--ratio", "0.3", "--scope", "global",
                 "-o", str(tmp_path / "g")]) == 0
    said = capsys.readouterr().out
    assert "trust_remote_code=True" in said and "differs between modules" in said
    assert main(["prune", str(src), "--ratio", "0.5", "--round-to", "8",
                 "-o", str(tmp_path / "u")]) == 0
    said = capsys.readouterr().out
    assert "AutoModelForCausalLM.from_pretrained" in said and "trust_remote_code" not in said
