"""Checkpoints storing one tensor that transformers' loading splits into several parameters
(issue 29, the streamed sweep's gap 4).

HRM's ``attn.gqkv_proj`` is chunked into four equal parts (``self_attn.gate_proj``, ``q_proj``,
``k_proj``, ``v_proj``) and its ``mlp.gate_up_proj`` into two; Sarvam-MoE's
``attention.query_key_value`` is split into q, k and v by their sizes (grouped-query
attention); Lara's ``linear_attn.in_proj`` into the gated delta net's four input projections.
``save_pretrained`` writes the fused tensor and ``from_pretrained`` splits it (transformers'
conversion mapping); ``fxsym prune`` refused them as "config.json and the weights disagree".
The streamed prune now reads the parameters through transformers' conversion, writes the
pruned ones back fused, exactly as ``save_pretrained`` of the in-memory pruned model writes
them, and plain ``from_pretrained`` of the output computes the in-memory pruned model's logits.
A pruned layout transformers' loading cannot split back is refused, naming the stored tensor
and its parameters. (Streamed scores, block importance and candidate losses against the model
loaded whole: ``tests/hf/test_streamed_families.py``, which holds these families.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from ckpt_helpers import LAYERED, checkpoint
from test_moe_checkpoint import stored_tensors

import fxsym
import fxsym.prune.checkpoint as ckpt
import fxsym.prune.checkpoint.tensors as ckpt_tensors
from fxsym.errors import CheckpointError
from fxsym.prune.search import sizes_for

#: family -> (the fused stored tensor of layer 0, the parameters transformers splits it into,
#: prune_checkpoint's operation): the heads (HRM: 3 of 4 in each of gate, q, k, v; Sarvam: 1 of
#: 2 key/value heads) and the hidden size cut the fused tensor's rows and columns; Lara's is
#: read and written whole (its linear attention is a boundary) beside its experts
CASES: dict[str, tuple[str, list[str], dict[str, Any]]] = {
    "hrm_text": ("model.H_module.layers.0.attn.gqkv_proj.weight",
                 [f"model.H_module.layers.0.self_attn.{p}_proj.weight"
                  for p in ("gate", "q", "k", "v")], dict(ratio=0.25)),
    "sarvam_moe": ("model.layers.0.attention.query_key_value.weight",
                   [f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"],
                   dict(sizes=dict(kv_heads=1, hidden=48, experts=3))),
    "lara_mini": ("model.layers.0.linear_attn.in_proj.weight",
                  [f"model.layers.0.linear_attn.in_proj_{p}.weight"
                   for p in ("qkv", "z", "b", "a")], dict(sizes=dict(experts=3))),
}


def _prune_both_ways(tmp_path: Path, family: str, layers: list[int] | None = None
                     ) -> tuple[dict[str, torch.Tensor], torch.nn.Module]:
    """The family's checkpoint pruned by streaming (l2, uniform) and in memory by the same
    plan: the streamed output's tensors (checked equal to ``save_pretrained`` of the in-memory
    pruned model, name for name) and the in-memory pruned model."""
    src, out = tmp_path / "in", tmp_path / "out"
    checkpoint(src, family, num_hidden_layers=4, **LAYERED[family])
    fused, _, operation = CASES[family]
    assert fused in stored_tensors(src)
    scope = dict(scope="uniform") if "ratio" in operation else {}  # sizes say where already
    streamed = fxsym.prune_checkpoint(src, out, importance="l2", layers=layers, **scope,
                                      **operation)
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    sm = fxsym.analyze(model)
    given = dict(operation)
    if "sizes" in given:
        given["sizes"] = sizes_for(sm, **given["sizes"])
    in_memory = fxsym.plan(model, sm, importance="l2", layers=layers, **scope, **given)
    assert in_memory.choices() == streamed.choices()
    in_memory.apply(model, sm)
    model.save_pretrained(tmp_path / "reference")
    want, got = stored_tensors(tmp_path / "reference"), stored_tensors(out)
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits,
                                   rtol=0, atol=0)
    return got, model


@pytest.mark.parametrize("family", sorted(CASES))
def test_a_split_stored_checkpoint_prunes_as_in_memory(tmp_path: Path, family: str) -> None:
    """The fused tensor stays one stored tensor: the pruned parameters it becomes,
    concatenated in transformers' order (the heads cut its rows, the hidden size its
    columns)."""
    got, model = _prune_both_ways(tmp_path, family)
    fused, parts, _ = CASES[family]
    assert torch.equal(got[fused], torch.cat([model.get_parameter(p) for p in parts]))
    if family != "lara_mini":
        assert got[fused].shape != stored_tensors(tmp_path / "in")[fused].shape


@pytest.mark.parametrize(("family", "layers", "new"),
                         [("lara_mini", [1, 2, 3], 1), ("sarvam_moe", [0, 1, 3], 2)])
def test_a_split_stored_checkpoint_pruned_by_depth_renumbers_the_fused_tensors(
        tmp_path: Path, family: str, layers: list[int], new: int) -> None:
    """A kept layer's fused tensor is written under its new number (Lara: linear attention
    layer 2 becomes layer 1; Sarvam: layer 3 becomes 2), none under a dropped layer's."""
    got, model = _prune_both_ways(tmp_path, family, layers=layers)
    fused, parts, _ = CASES[family]
    assert model.config.num_hidden_layers == 3
    written = fused.replace("layers.0.", f"layers.{new}.")
    assert torch.equal(got[written], torch.cat([
        model.get_parameter(p.replace("layers.0.", f"layers.{new}.")) for p in parts]))
    assert sum(".in_proj.weight" in n or ".query_key_value." in n for n in got) == sum(
        ".in_proj.weight" in n or ".query_key_value." in n
        for n in stored_tensors(tmp_path / "in")) - 1


def test_parameters_sized_apart_cannot_be_stored_in_equal_chunks(tmp_path: Path) -> None:
    """HRM's loading splits gqkv_proj into four equal chunks: gate, q, k and v written with
    different row counts would load back as other parameters. The stored layout refuses them
    before anything is written, naming the stored tensor and the parameters, never as
    "config.json and the weights disagree"."""
    src = tmp_path / "in"
    checkpoint(src, "hrm_text", num_hidden_layers=4, **LAYERED["hrm_text"])
    reader = ckpt.open_checkpoint(src)
    meta = reader.build()
    stored = reader.stored(meta)
    assert stored is not None
    layer = "model.H_module.layers.0.self_attn."
    parts = [layer + p for p in ("gate_proj.weight", "q_proj.weight", "k_proj.weight",
                                 "v_proj.weight")]
    assert all(stored.fused[p] == ["model.H_module.layers.0.attn.gqkv_proj.weight"]
               for p in parts)
    alike = {p: torch.empty(48, 64, device="meta") for p in parts}
    assert {n: tuple(t.shape) for n, t in stored.store(meta, alike).items()} == {
        "model.H_module.layers.0.attn.gqkv_proj.weight": (192, 64)}
    apart = dict(alike, **{parts[1]: torch.empty(32, 64, device="meta")})
    with pytest.raises(CheckpointError) as refused:
        stored.store(meta, apart)
    message = str(refused.value)
    assert "gqkv_proj" in message and all(p in message for p in parts)
    assert "disagree" not in message


def test_every_parameter_a_fused_tensor_becomes_is_found(tmp_path: Path) -> None:
    """Sarvam-MoE: query_key_value gives q_proj, k_proj and v_proj (asked of transformers'
    conversion, run on meta tensors), read in one go as the model holds them."""
    src = tmp_path / "in"
    checkpoint(src, "sarvam_moe", num_hidden_layers=4, **LAYERED["sarvam_moe"])
    reader = ckpt.open_checkpoint(src)
    meta = reader.build()
    tensors = ckpt_tensors.Tensors(reader.directory, reader.tensor_files(), reader.stored(meta))
    tensors.check(meta)
    layer = "model.layers.1.self_attn."
    names = [layer + p for p in ("q_proj.weight", "k_proj.weight", "v_proj.weight")]
    assert names in tensors.units()
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    for name, t in tensors.read(names).items():
        assert torch.equal(t, model.get_parameter(name)), name


@pytest.mark.parametrize("family", ["hrm_text", "sarvam_moe"])
def test_a_global_plan_keeps_the_parameters_of_a_fused_tensor_apart(tmp_path: Path,
                                                                    family: str) -> None:
    """A plan whose sizes differ between layers is written in the model's own names (the
    config cannot describe it): q, k and v apart, as fxsym.load and
    ``from_pretrained(trust_remote_code=True)`` read them, tensor for tensor the in-memory
    plan's model."""
    src, out = tmp_path / "in", tmp_path / "out"
    checkpoint(src, family, num_hidden_layers=4, **LAYERED[family])
    streamed = fxsym.prune_checkpoint(src, out, importance="l2", ratio=0.3, scope="global")
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    sm = fxsym.analyze(model)
    plan = fxsym.plan(model, sm, importance="l2", ratio=0.3, scope="global")
    assert plan.choices() == streamed.choices()
    plan.apply(model, sm)
    fused, parts, _ = CASES[family]
    got = stored_tensors(out)
    assert fused not in got and all(p in got for p in parts)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    want, have = model.state_dict(), loaded.state_dict()
    assert want.keys() == have.keys()
    for name in want:
        assert torch.equal(want[name], have[name]), name
    ids = torch.randint(3, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(input_ids=ids).logits,
                                   model(input_ids=ids).logits, rtol=0, atol=0)
