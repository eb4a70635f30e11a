"""A ``save_pretrained`` directory in, a pruned one out (issue 22 §1, §2, §5): tiny sharded
llama and Qwen2 checkpoints pruned to a parameter target with activation importance on
calibration text, loaded back with plain ``from_pretrained``; the streamed writer gives the
weights the in-memory path gives; bad calibration input is a typed error and the output
directory is left as it was, also when writing fails half way (fault injection).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import transformers
from ckpt_helpers import TEXT, checkpoint, n_params, on_reads

import fxsym
from fxsym.prune.checkpoint import read_calibration_text
from fxsym.prune.cli import main

SHARD = 40_000  # bytes: several output shards for a tiny model


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_sharded_checkpoint_pruned_to_a_parameter_target_loads_with_from_pretrained(
        tmp_path: Path, calib: Path, family: str) -> None:
    src = tmp_path / "in"
    model = checkpoint(src, family)
    assert (src / "model.safetensors.index.json").is_file()
    target = n_params(model) // 2
    out = tmp_path / "out"
    plan = fxsym.prune_checkpoint(src, out, calibration=calib, target_params=target,
                                  calibration_tokens=256, seq_len=32, round_to=8,
                                  max_shard_size=SHARD, search=False)  # one plan of widths
    assert plan.importance == "activation"
    assert plan.params_after <= target
    files = set(os.listdir(out))
    assert {"config.json", "generation_config.json", "tokenizer.json", "fxsym.json",
            "model.safetensors.index.json"} <= files
    assert len([f for f in files if f.endswith(".safetensors")]) > 1
    assert not any(f.startswith(".") for f in os.listdir(tmp_path))  # no temporary left
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(pruned) is type(model)
    assert n_params(pruned) == plan.params_after
    sizes = {g.name: g.kept for g in plan.groups}
    assert pruned.config.hidden_size == sizes["model.embed_tokens.embedding_dim"] < 64
    assert pruned.config.intermediate_size < 192
    assert not hasattr(pruned.config, "fxsym_nonuniform")
    assert pruned.generation_config.eos_token_id == model.generation_config.eos_token_id
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = tok("The quick brown fox", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = pruned(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()
    # Minitron's scores per unit and ShortGPT's per block are recorded with the plan
    assert len(plan.extra["block_importance"]) == model.config.num_hidden_layers


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_checkpoint_pruned_by_depth_loads_with_from_pretrained(
        tmp_path: Path, calib: Path, family: str) -> None:
    """Two of four layers kept, ranked by the block importance of the calibration run; with a
    width target too. The kept layers' tensors are the input's, renumbered."""
    src = tmp_path / "in"
    model = checkpoint(src, family, num_hidden_layers=4)
    out = tmp_path / "out"
    plan = fxsym.prune_checkpoint(src, out, calibration=calib, layers=2,
                                  calibration_tokens=128, seq_len=32, max_shard_size=SHARD)
    (depth,) = plan.depth
    assert len(depth.keep) == 2
    ranked = sorted(range(4), key=lambda i: -plan.extra["block_importance"][i])
    assert sorted(depth.keep) == sorted(ranked[:2])
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert pruned.config.num_hidden_layers == 2 and len(pruned.model.layers) == 2
    if getattr(model.config, "layer_types", None) is not None:
        assert len(pruned.config.layer_types) == 2
    for new, old in enumerate(depth.keep):
        assert torch.equal(pruned.model.layers[new].mlp.down_proj.weight,
                           model.model.layers[old].mlp.down_proj.weight)
    ids = torch.tensor([[1, 5, 9, 12, 40]])
    with torch.no_grad():
        assert torch.isfinite(pruned(ids).logits).all()
    # depth and width together, to a parameter target
    both = tmp_path / "both"
    target = n_params(model) // 3
    plan = fxsym.prune_checkpoint(src, both, calibration=calib, layers=3, target_params=target,
                                  calibration_tokens=128, seq_len=32, round_to=8)
    pruned = transformers.AutoModelForCausalLM.from_pretrained(both).eval()
    assert pruned.config.num_hidden_layers == 3
    assert n_params(pruned) == plan.params_after <= target
    with torch.no_grad():
        assert torch.isfinite(pruned(ids).logits).all()


@pytest.mark.parametrize("layers, chunk", [(None, 2**25), ([0, 2], 2**25), (None, 1000)])
def test_the_streamed_writer_gives_the_in_memory_weights(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layers: list[int] | None,
        chunk: int) -> None:
    """The same uniform plan (l2 scores, which both paths compute; the middle layer dropped
    too) applied by fxsym.plan + apply on the loaded model and by streaming the checkpoint:
    equal plans, equal tensors; also when every tensor is read a few rows at a time."""
    monkeypatch.setattr("fxsym.prune.checkpoint.tensors.CHUNK_BYTES", chunk)
    src = tmp_path / "in"
    checkpoint(src, "llama", tie_word_embeddings=True)
    out = tmp_path / "out"
    streamed = fxsym.prune_checkpoint(src, out, importance="l2", ratio=0.4, round_to=4,
                                      layers=layers, max_shard_size=SHARD)
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    sm = fxsym.analyze(model)
    in_memory = fxsym.plan(model, sm, importance="l2", ratio=0.4, round_to=4, scope="uniform",
                           layers=layers)
    assert in_memory.choices() == streamed.choices() and streamed.choices()
    in_memory.apply(model, sm)
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    want, got = model.state_dict(), pruned.state_dict()
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name
    assert pruned.lm_head.weight is pruned.model.embed_tokens.weight
    assert len(pruned.model.layers) == (3 if layers is None else 2)


def test_the_cli_prunes_a_checkpoint_directory(tmp_path: Path, calib: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in"
    model = checkpoint(src, "qwen2")
    out = tmp_path / "out"
    code = main(["prune", str(src), "--calib", str(calib), "--calib-tokens", "128",
                 "--seq-len", "32", "--param-ratio", "0.5", "--round-to", "8", "--layers", "2",
                 "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    assert f"saved to {out}" in capsys.readouterr().out
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert n_params(pruned) <= n_params(model) // 2
    assert pruned.config.num_hidden_layers == 2
    code = main(["prune", str(src), "--layers", "2", "-o", str(tmp_path / "x")])
    assert code == 2 and "calibration" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    (b"", "empty"),
    (b"  \n\n", "empty"),
    (b"caf\xe9 au lait\n", "not UTF-8"),
    (b'{"txt": "no text field"}\n', "text"),
])
def test_bad_calibration_text_is_a_typed_error(tmp_path: Path, content: bytes,
                                               message: str) -> None:
    path = tmp_path / "calib.jsonl"
    path.write_bytes(content)
    with pytest.raises(fxsym.CalibrationError, match=message):
        read_calibration_text(path)


def test_plain_text_and_json_lines_are_read(tmp_path: Path) -> None:
    plain = tmp_path / "a.txt"
    plain.write_text("{not json} but text\nsecond line\n", encoding="utf-8")
    assert read_calibration_text(plain) == ["{not json} but text\nsecond line\n"]
    lines = tmp_path / "b.jsonl"
    lines.write_text('{"text": "one"}\n\n{"text": "two", "id": 3}\n', encoding="utf-8")
    assert read_calibration_text(lines) == ["one", "two"]


def _occupied(out: Path) -> dict[str, bytes]:
    out.mkdir()
    (out / "keep.txt").write_bytes(b"the old contents")
    return {p.name: p.read_bytes() for p in out.iterdir()}


@pytest.mark.parametrize("case", ["empty", "encoding", "no-tokenizer", "not-a-checkpoint",
                                  "no-weights"])
def test_bad_input_leaves_the_output_as_it_was(tmp_path: Path, case: str) -> None:
    src = tmp_path / "in"
    checkpoint(src, "llama", with_tokenizer=case != "no-tokenizer", num_hidden_layers=2)
    calib = tmp_path / "calib.txt"
    calib.write_bytes({"empty": b"", "encoding": b"\xff\xfe\x00bad"}.get(case, TEXT.encode()))
    if case == "not-a-checkpoint":
        (src / "config.json").unlink()
    if case == "no-weights":
        for f in src.glob("*.safetensors*"):
            f.unlink()
    out = tmp_path / "out"
    before = _occupied(out)
    error = fxsym.CalibrationError if case in ("empty", "encoding", "no-tokenizer") else (
        fxsym.CheckpointError)
    with pytest.raises(error):
        fxsym.prune_checkpoint(src, out, calibration=calib, ratio=0.5, seq_len=16,
                               calibration_tokens=64, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(os.listdir(tmp_path)) == ["calib.txt", "in", "out"]


def test_a_failure_while_writing_shards_leaves_the_output_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tenth tensor read while shards are written fails: shards are on disk by then,
    in the temporary sibling, which is removed; the output keeps its old contents."""

    src = tmp_path / "in"
    checkpoint(src, "llama", num_hidden_layers=2)
    out = tmp_path / "out"
    before = _occupied(out)
    reads: list[Path] = []

    def fail(name: str) -> None:
        reads.extend(tmp_path.glob(".out.fxsym-*/*.safetensors"))
        if len(reads) >= 2:
            raise OSError(5, "Input/output error (injected)")

    on_reads(monkeypatch, fail)
    with pytest.raises(fxsym.CheckpointError, match="injected"):
        fxsym.prune_checkpoint(src, out, importance="l2", ratio=0.5, max_shard_size=SHARD,
                               force=True)
    assert reads  # shards were written when it failed
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(os.listdir(tmp_path)) == ["in", "out"]
