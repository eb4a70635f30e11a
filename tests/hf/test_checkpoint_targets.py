"""Targets on checkpoint directories (issue 22 §4 on §1's streamed path): what ``fxsym prune``
offers for an in-memory model works on a ``save_pretrained`` directory, streamed. Sizes by
role (``--hidden --ffn --heads --kv-heads --layers``) give the weights the in-memory plan
gives; ``--target-params`` / ``--target-active-params`` search uniform candidates, each scored
by its next-token loss on the calibration text computed layer by layer on the pruned tensors
(equal to the in-memory loss of the same plan), the table printed; impossible targets are
typed errors and ``OUT`` is left as it was. Tiny sharded llama and Qwen2 directories, loaded
back with plain ``from_pretrained``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from ckpt_helpers import checkpoint, n_params

import fxsym
from fxsym.prune.checkpoint import open_checkpoint, read_calibration_text
from fxsym.prune.cli import main
from fxsym.prune.search import active_params, sizes_for

SHARD = 40_000


def _loss(model: torch.nn.Module, batches: list[Any]) -> float:
    """Mean next-token cross-entropy over the batches (as the search scores a candidate)."""
    total = 0.0
    with torch.no_grad():
        for b in batches:
            logits = model(**b).logits
            ids = b["input_ids"]
            total += float(torch.nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten()))
    return total / len(batches)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_sizes_by_role_stream_the_in_memory_plan(tmp_path: Path, family: str) -> None:
    src = tmp_path / "in"
    checkpoint(src, family, num_hidden_layers=3)
    out = tmp_path / "out"
    sizes = dict(hidden=48, ffn=96, heads=2, kv_heads=1)
    streamed = fxsym.prune_checkpoint(src, out, importance="l2", sizes=sizes, layers=[0, 2],
                                      max_shard_size=SHARD)
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    sm = fxsym.analyze(model)
    in_memory = fxsym.plan(model, sm, importance="l2", sizes=sizes_for(sm, **sizes),
                           layers=[0, 2])
    assert in_memory.choices() == streamed.choices()
    in_memory.apply(model, sm)
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    c = pruned.config
    assert (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
            c.num_hidden_layers) == (48, 96, 2, 1, 2)
    want, got = model.state_dict(), pruned.state_dict()
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_parameter_target_searches_candidates_scored_by_streamed_loss(
        tmp_path: Path, calib: Path, family: str, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in"
    original = checkpoint(src, family, num_hidden_layers=4)
    target = n_params(original) // 2
    out = tmp_path / "out"
    code = main(["prune", str(src), "--calib", str(calib), "--calib-tokens", "192",
                 "--seq-len", "32", "--target-params", str(target), "--round-to", "8",
                 "-o", str(out)])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert "calib loss" in said.out and "<- kept" in said.out
    assert ", candidate 1 of " in said.err  # progress: each candidate's blocks scored
    plan = fxsym.prune.persist.read_manifest(out)["plan"]
    table = plan.extra["search"]
    assert len(table) >= 5 and {c["layers"] for c in table} >= {4, 3, 2}
    assert all(c["params"] <= target for c in table)
    (best,) = [c for c in table if c["kept"]]
    assert best["loss"] == min(c["loss"] for c in table if c["scored"])
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    cfg = pruned.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (
        best["layers"], best["hidden"], best["ffn"])
    assert n_params(pruned) == plan.params_after <= target
    # the streamed score is the in-memory loss of the same plan on the same tokens
    texts = read_calibration_text(calib)
    batches = open_checkpoint(src).calibration(texts, tokens=192, seq_len=32)
    torch.testing.assert_close(_loss(pruned, batches), best["loss"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("keep", [4, 3])
def test_a_number_of_layers_fixes_the_searched_depth(tmp_path: Path, calib: Path,
                                                     keep: int) -> None:
    src = tmp_path / "in"
    original = checkpoint(src, "llama", num_hidden_layers=4)
    target = n_params(original) // 2
    plan = fxsym.prune_checkpoint(src, tmp_path / "out", calibration=calib, search=True,
                                  target_params=target, layers=keep, calibration_tokens=128,
                                  seq_len=32, round_to=8)
    table = plan.extra["search"]
    assert len(table) >= 2 and {c["layers"] for c in table} == {keep}
    assert len({c["hidden"] for c in table}) == len(table)
    assert all(c["params"] <= target for c in table)
    (best,) = [c for c in table if c["kept"]]
    pruned = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert (pruned.config.num_hidden_layers, pruned.config.hidden_size) == (keep, best["hidden"])
    with pytest.raises(fxsym.PlanError, match="positions of layers"):
        fxsym.prune_checkpoint(src, tmp_path / "other", calibration=calib, search=True,
                               target_params=target, layers=[0, 1], calibration_tokens=128,
                               seq_len=32, round_to=8)
    assert not (tmp_path / "other").exists()


def test_an_active_parameter_target_on_a_checkpoint(tmp_path: Path, calib: Path) -> None:
    src = tmp_path / "in"
    original = checkpoint(src, "llama", num_hidden_layers=4)
    sm = fxsym.analyze(original)
    active, _ = active_params(original, sm)
    target = active // 2
    out = tmp_path / "out"
    plan = fxsym.prune_checkpoint(src, out, calibration=calib, target_active_params=target,
                                  calibration_tokens=128, seq_len=32, round_to=8)
    assert plan.extra["search"] and all(c["params"] <= target for c in plan.extra["search"])
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    active_after, skipped = active_params(pruned, fxsym.analyze(pruned))
    assert active_after <= target and skipped == {"model.embed_tokens.weight"}
    assert n_params(pruned) == active_after + pruned.model.embed_tokens.weight.numel()
    ids = torch.tensor([[1, 5, 9, 12, 40]])
    with torch.no_grad():
        assert torch.isfinite(pruned(ids).logits).all()


def _occupied(out: Path) -> dict[str, bytes]:
    out.mkdir()
    (out / "keep.txt").write_bytes(b"the old contents")
    return {p.name: p.read_bytes() for p in out.iterdir()}


@pytest.mark.parametrize("args, says", [
    (["--heads", "3"], "multiple"),
    (["--kv-heads", "3"], "key/value heads 3"),
    (["--hidden", "65"], "up to 64"),
    (["--experts", "2"], "experts"),
    (["--layers", "7"], "layers"),
    (["--target-params", "1000"], "1,000"),
    (["--target-active-params", "1000"], "1,000"),
    (["--target-active-params", "1000000"], "--calib"),
], ids=["heads", "kv-heads", "hidden", "experts", "layers", "params", "active", "no-calib"])
def test_impossible_targets_are_typed_errors_and_out_is_untouched(
        tmp_path: Path, calib: Path, args: list[str], says: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2)
    out = tmp_path / "out"
    before = _occupied(out)
    with_calib = [] if says == "--calib" else ["--calib", str(calib), "--calib-tokens", "64",
                                               "--seq-len", "16"]
    code = main(["prune", str(src), *args, *with_calib, "-o", str(out), "--force"])
    err = capsys.readouterr().err
    last = err.rstrip("\n").split("\n")[-1]
    assert code == 2 and last.startswith("fxsym: ") and says in last, err
    assert "Traceback" not in err and "[1/2] model.layers.0" not in err  # before calibrating
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]


def test_long_steps_show_progress(tmp_path: Path, calib: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Reading and scoring every weight (l2), calibrating layer by layer and writing shards
    each say where they are (one line a step when stderr is not a terminal)."""
    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2)
    capsys.readouterr()
    assert main(["prune", str(src), "--importance", "l2", "--ratio", "0.5", "--layers", "1",
                 "--calib", str(calib), "--calib-tokens", "64", "--seq-len", "16",
                 "-o", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "] model.layers.1.mlp.down_proj.weight\n" in err  # a weight read and scored
    assert "[2/2] model.layers.1\n" in err  # the calibration run, block by block
    assert "] model.safetensors\n" in err  # a shard written
