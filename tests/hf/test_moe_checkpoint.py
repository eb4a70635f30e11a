"""Mixture-of-experts checkpoint directories pruned by streaming (issue 22 §1, §5; the experts
groups of issue 21 §1): transformers 5 holds a layer's experts fused (``experts.gate_up_proj``
``[E, 2I, H]``, ``experts.down_proj`` ``[E, H, I]``) but ``save_pretrained`` writes one tensor
per expert and projection (Mixtral: ``block_sparse_moe.experts.{e}.w1/w2/w3.weight`` and the
router as ``block_sparse_moe.gate.weight``; Qwen3-MoE: ``mlp.experts.{e}.gate_proj/up_proj/
down_proj.weight``). The streamed prune reads and writes that layout through transformers' own
conversion mapping: its output is what ``save_pretrained`` of the in-memory pruned model
writes, name for name and tensor for tensor, and plain ``from_pretrained`` loads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from ckpt_helpers import TEXT, checkpoint, tokenizer
from safetensors import safe_open

import fxsym
from fxsym.prune.cli import main
from fxsym.prune.search import sizes_for

SHARD = 40_000  # bytes: several output shards for a tiny model

#: model_type -> config overrides (4 experts, 2 picked per token)
MOE: dict[str, dict[str, Any]] = {
    "mixtral": dict(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(head_dim=16, moe_intermediate_size=32, intermediate_size=48,
                      num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1),
}
EXPERTS_FIELD = {"mixtral": "num_local_experts", "qwen3_moe": "num_experts"}


def stored_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory by its stored name (one file or an index)."""
    index = directory / "model.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values()))
             if index.is_file() else ["model.safetensors"])
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(directory / f), framework="pt") as handle:
            out.update({k: handle.get_tensor(k) for k in handle.keys()})
    return out


def assert_streamed_is_in_memory(src: Path, out: Path, streamed: fxsym.Plan, work: Path,
                                 sizes: dict[str, int], layers: list[int] | None = None
                                 ) -> tuple[Any, dict[str, torch.Tensor]]:
    """The in-memory prune of the model stored in ``src`` (l2, uniform, ``sizes``) makes the
    choices of ``streamed``, and its ``save_pretrained`` (under ``work``) writes every name and
    tensor the streamed prune wrote to ``out``. The pruned model and ``out``'s tensors."""
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    sm = fxsym.analyze(model)
    in_memory = fxsym.plan(model, sm, importance="l2", sizes=sizes_for(sm, **sizes),
                           layers=layers)
    assert in_memory.choices() == streamed.choices()
    in_memory.apply(model, sm)
    model.save_pretrained(work / "reference")
    want, got = stored_tensors(work / "reference"), stored_tensors(out)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name
    return model, got


@pytest.mark.parametrize("layers", [None, [0, 2]])
@pytest.mark.parametrize("family", sorted(MOE))
def test_a_streamed_moe_prune_is_what_save_pretrained_writes_of_the_in_memory_one(
        tmp_path: Path, family: str, layers: list[int] | None) -> None:
    """l2 scores (both paths compute them), 3 of 4 experts per layer kept (a router picks 2),
    the hidden size and the experts' FFN width cut too (to multiples of 4: the grouped matmul
    of the fused experts wants rows of 16 bytes); with a layer dropped too."""
    src = tmp_path / "in"
    original = checkpoint(src, family, **MOE[family])
    assert any(".experts.0." in k for k in stored_tensors(src))  # one tensor per expert
    out = tmp_path / "out"
    sizes = {"experts": 3, "hidden": 48, "expert_ffn": 16}
    streamed = fxsym.prune_checkpoint(src, out, importance="l2", sizes=sizes, layers=layers,
                                      max_shard_size=SHARD)
    model, got = assert_streamed_is_in_memory(src, out, streamed, tmp_path, sizes, layers)
    experts = [g for g in streamed.groups if g.name.endswith("gate.weight:0")]
    assert experts and all(g.kept == 3 for g in experts)
    assert not any(".experts.3." in k for k in got) and any(".experts.2." in k for k in got)
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert getattr(pruned.config, EXPERTS_FIELD[family]) == 3
    assert pruned.config.num_hidden_layers == (3 if layers is None else 2)
    assert pruned.config.hidden_size == 48
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, pruned.state_dict()[name]), name
    ids = torch.tensor([[1, 5, 9, 12, 40, 7]])
    with torch.no_grad():
        logits = pruned(ids).logits
    assert logits.shape == (1, 6, original.config.vocab_size) and torch.isfinite(logits).all()


#: more families whose experts transformers' conversion mapping splits on save (shared experts:
#: qwen2_moe; Mixtral's names: phimoe; no conversion, experts saved fused: granitemoe)
MORE: dict[str, dict[str, Any]] = {
    "qwen2_moe": dict(moe_intermediate_size=32, intermediate_size=48, num_experts=4,
                      shared_expert_intermediate_size=24, decoder_sparse_step=1),
    "olmoe": dict(intermediate_size=32, num_experts=4),
    "phimoe": dict(intermediate_size=32, num_local_experts=4),
    "granitemoe": dict(intermediate_size=32, num_local_experts=4),
}


@pytest.mark.parametrize("family", sorted(MORE))
def test_more_moe_families_stream_what_save_pretrained_writes(tmp_path: Path,
                                                               family: str) -> None:
    src = tmp_path / "in"
    checkpoint(src, family, num_experts_per_tok=2, num_hidden_layers=2, **MORE[family])
    out = tmp_path / "out"
    streamed = fxsym.prune_checkpoint(src, out, importance="l2", sizes={"experts": 3})
    assert_streamed_is_in_memory(src, out, streamed, tmp_path, {"experts": 3})
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    field = "num_local_experts" if hasattr(pruned.config, "num_local_experts") else "num_experts"
    assert getattr(pruned.config, field) == 3
    fused = [p for n, p in pruned.named_parameters() if n.endswith("experts.gate_up_proj")]
    assert len(fused) == 2 and all(p.shape[0] == 3 for p in fused)

def test_the_cli_prunes_the_experts_of_a_checkpoint_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in"
    checkpoint(src, "qwen3_moe", **MOE["qwen3_moe"])
    out = tmp_path / "out"
    code = main(["prune", str(src), "--experts", "2", "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    assert f"saved to {out}" in capsys.readouterr().out
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert pruned.config.num_experts == 2
    assert pruned.model.layers[0].mlp.experts.gate_up_proj.shape[0] == 2
    with torch.no_grad():
        assert torch.isfinite(pruned(torch.tensor([[1, 5, 9, 12]])).logits).all()
    code = main(["prune", str(src), "--experts", "1", "-o", str(tmp_path / "x")])
    assert code != 0 and "at least 2" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def busy_experts_checkpoint(directory: Path, family: str) -> Any:
    """A checkpoint whose every token goes to experts 1 and 3 in every layer, while experts 0
    and 2 hold the largest weights: channel 0 of every token embedding is large and positive
    (the residual stream keeps it), and each router reads only channel 0, up for experts 1
    and 3, down for 0 and 2."""
    config = transformers.AutoConfig.for_model(
        family, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, max_position_embeddings=128, bos_token_id=1,
        eos_token_id=2, tie_word_embeddings=False, **MOE[family])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 20.0
        for layer in model.model.layers:
            layer.mlp.gate.weight.zero_()
            layer.mlp.gate.weight[:, 0] = torch.tensor([-5.0, 2.0, -5.0, 1.0])
            for e in (0, 2):
                layer.mlp.experts.gate_up_proj[e] *= 3
                layer.mlp.experts.down_proj[e] *= 3
    model.save_pretrained(directory, max_shard_size="200KB")
    tokenizer(300).save_pretrained(directory)
    return model


@pytest.mark.parametrize("family", sorted(MOE))
def test_calibration_keeps_the_experts_the_tokens_are_routed_to(tmp_path: Path,
                                                                 family: str) -> None:
    """--experts 2 on calibration text: the streamed router load and activation keep experts
    1 and 3 of every layer (weight norms would keep 0 and 2); recorded in plan.extra."""
    src = tmp_path / "in"
    busy_experts_checkpoint(src, family)
    calib = tmp_path / "calib.txt"
    calib.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "out"
    plan = fxsym.prune_checkpoint(src, out, calibration=calib, calibration_tokens=256,
                                  seq_len=32, sizes={"experts": 2}, max_shard_size=SHARD)
    experts = {c.name: sorted(c.keep or ()) for c in plan.groups
               if c.name.endswith("gate.weight:0")}
    assert len(experts) == 2 and all(keep == [1, 3] for keep in experts.values())
    for name in experts:
        load = plan.extra["expert_load"][name]
        assert load[0] == load[2] == 0 and load[1] > 0 and load[3] > 0
        assert sum(load) == pytest.approx(1.0)  # routing weights of a token sum to 1
        assert plan.extra["expert_activation"][name][1] > 0
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert getattr(pruned.config, EXPERTS_FIELD[family]) == 2
    with torch.no_grad():
        assert torch.isfinite(pruned(torch.tensor([[1, 5, 9, 12]])).logits).all()
    by_weights = fxsym.prune_checkpoint(src, tmp_path / "l2", importance="l2",
                                        sizes={"experts": 2})
    assert all(sorted(c.keep or ()) == [0, 2] for c in by_weights.groups
               if c.name in experts)


@pytest.mark.parametrize("family", sorted(MOE))
def test_streamed_calibration_scores_are_the_in_memory_ones(
        tmp_path: Path, family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Layer by layer (each layer's experts made from their stored tensors) or the whole
    loaded model at once: the same activation scores for every group, experts included."""
    import fxsym.prune.checkpoint as ckpt
    import fxsym.prune.checkpoint.run as run

    src = tmp_path / "in"
    checkpoint(src, family, num_hidden_layers=2, **MOE[family])
    runs: list[ckpt.StreamedScores] = []

    def recorded(*args: Any, **kwargs: Any) -> ckpt.StreamedScores:
        runs.append(real(*args, **kwargs))
        return runs[-1]

    real = ckpt.stream_activations
    monkeypatch.setattr(run, "stream_activations", recorded)
    fxsym.prune_checkpoint(src, tmp_path / "out", calibration=[TEXT], calibration_tokens=96,
                           seq_len=32, sizes={"experts": 3})
    (streamed,) = runs
    batches = ckpt.open_checkpoint(src).calibration([TEXT], tokens=96, seq_len=32)
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    sm = fxsym.analyze(model)
    loaded = fxsym.importance.activation(batches, consumers_only=True)(model, sm)
    routed = {g.name for g in sm.groups() if g.routed}
    assert len(routed) == 2 and routed <= set(streamed.usage["expert_load"])
    assert streamed.scores.keys() == loaded.keys()
    for name, scores in loaded.items():
        assert torch.allclose(streamed.scores[name], scores, rtol=1e-4, atol=1e-7), name
        if name in routed:
            assert scores.sum() > 0


def test_a_plan_the_config_cannot_describe_keeps_the_model_layout(tmp_path: Path) -> None:
    """Sizes that differ between layers (scope="global"): the output is read back by
    fxsym.load (through from_pretrained with trust_remote_code), which reads the model's own
    names, so the experts are written fused, as the model holds them; sharded."""
    src = tmp_path / "in"
    checkpoint(src, "qwen3_moe", **MOE["qwen3_moe"])
    out = tmp_path / "out"
    streamed = fxsym.prune_checkpoint(src, out, importance="l2", ratio=0.3, scope="global",
                                      max_shard_size=SHARD)
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    sm = fxsym.analyze(model)
    in_memory = fxsym.plan(model, sm, importance="l2", ratio=0.3, scope="global")
    assert in_memory.choices() == streamed.choices()
    in_memory.apply(model, sm)
    assert json.loads((out / "config.json").read_text())["model_type"] == "fxsym_pruned"
    assert (out / "model.safetensors.index.json").is_file()
    stored = stored_tensors(out)
    assert "model.layers.0.mlp.experts.gate_up_proj" in stored
    assert not any(".experts.0." in k for k in stored)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name


def test_deepseek_routing_groups_and_the_stored_router_bias(tmp_path: Path) -> None:
    """DeepSeek-V3: experts pruned in whole routing groups (4 groups of 2 -> 2), the router's
    score correction bias a stored buffer: read from the files (the calibration routes with
    it), resized with the experts and written as resized; the output is what save_pretrained
    of the in-memory prune writes, and calibration scores each routing group."""
    config = transformers.AutoConfig.for_model(
        "deepseek_v3", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, vocab_size=300, max_position_embeddings=64,
        first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=4,
        qk_nope_head_dim=4, v_head_dim=8, n_routed_experts=8, n_group=4, topk_group=2,
        num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1, bos_token_id=1,
        eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    bias = model.model.layers[1].mlp.gate.e_score_correction_bias
    bias.copy_(torch.arange(8.0) / 10)
    src = tmp_path / "in"
    model.save_pretrained(src, max_shard_size="200KB")
    tokenizer(300).save_pretrained(src)
    out = tmp_path / "out"
    streamed = fxsym.prune_checkpoint(src, out, importance="l2", sizes={"experts": 4},
                                      max_shard_size=SHARD)
    _, got = assert_streamed_is_in_memory(src, out, streamed, tmp_path, {"experts": 4})
    kept = got["model.layers.1.mlp.gate.e_score_correction_bias"]
    assert kept.shape == (4,) and kept.ne(0).any()
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert pruned.config.n_routed_experts == 4 and pruned.config.n_group == 2
    calibrated = fxsym.prune_checkpoint(src, tmp_path / "calibrated", calibration=[TEXT],
                                        calibration_tokens=128, seq_len=32,
                                        sizes={"experts": 4})
    (load,) = calibrated.extra["expert_load"].values()
    assert len(load) == 4 and sum(load) > 0  # one number per routing group


def test_the_cli_meets_an_active_parameter_target_on_a_moe_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--target-active-params: each expert tensor counts top_k / E of its entries; the search
    over uniform candidates (the experts kept) is scored layer by layer, each layer's experts
    made from their stored tensors; the table is printed."""
    from fxsym.prune.search import active_params

    src = tmp_path / "in"
    original = checkpoint(src, "mixtral", num_hidden_layers=2, **dict(MOE["mixtral"],
                                                                      intermediate_size=64))
    calib = tmp_path / "calib.txt"
    calib.write_text(TEXT, encoding="utf-8")
    active, _ = active_params(original, fxsym.analyze(original))
    target = active * 6 // 10
    out = tmp_path / "out"
    code = main(["prune", str(src), "--calib", str(calib), "--calib-tokens", "128",
                 "--seq-len", "32", "--target-active-params", str(target), "--round-to", "16",
                 "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    assert "calib loss" in capsys.readouterr().out
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert active_params(pruned, fxsym.analyze(pruned))[0] <= target
    assert pruned.config.num_local_experts == 4
    assert any(".experts.0.w1.weight" in k for k in stored_tensors(out))
    with torch.no_grad():
        assert torch.isfinite(pruned(torch.tensor([[1, 5, 9, 12]])).logits).all()


def test_weight_scores_give_each_parameter_back_before_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scoring a checkpoint by its weights holds one parameter at a time, and the memory of
    each (its tensor, the fused experts made from the stored ones, its float64 scores) goes
    back to the system before the next is read: without that the C library kept it, and
    the peak of a MoE checkpoint grew with every layer scored (benchmarks/prune_ckpt_scale.py
    --moe --importance l2). Every read of the scoring follows a trim."""
    import fxsym.prune.checkpoint.scores as scores
    from fxsym.prune.checkpoint.tensors import Tensors

    src = tmp_path / "in"
    checkpoint(src, "mixtral", **MOE["mixtral"])
    events: list[str] = []
    trim, one = scores.trim, Tensors.one

    def trimmed() -> None:
        events.append("trim")
        trim()

    def read(self: Any, name: str) -> torch.Tensor:
        events.append(name)
        return one(self, name)

    monkeypatch.setattr(scores, "trim", trimmed)
    monkeypatch.setattr(Tensors, "one", read)
    fxsym.prune_checkpoint(src, tmp_path / "out", importance="l2", sizes={"experts": 3})
    reads = [i for i, e in enumerate(events) if e != "trim"]
    assert len(reads) > 10 and any(".experts." in events[i] for i in reads)
    assert all(events[i - 1] == "trim" for i in reads), events[:12]
