"""The search sizes each width class from its own range (issue 29 §3).

A role's groups are not all one width: Llama 4's shared expert and routed experts read
``intermediate_size``, its dense MLP ``intermediate_size_mlp``; LFM2's short convolution reads
the hidden size, and is no FFN width at all; a model pruned by layer holds FFN widths of
several lengths. Where a size is read from is what the hf plugin probes
(``fxsym_group_sources``: the config field whose change changes the group's dims, by meta
builds), not what the numbers happen to be; groups of one role read from one source and as
long are one width class, each scaled by the same fraction of its own width. Checkpoints are
pruned by ``fxsym.prune_checkpoint(..., target_params=...)``, loaded with plain
``from_pretrained`` and compared with the same plan applied in memory. Tiny configs, random
weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from ckpt_helpers import LAYERED, TEXT, checkpoint, n_params

import fxsym
from fxsym.prune.search import group_sources, roles, search

BATCHES = [{"input_ids": torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(i))}
           for i in range(2)]

#: Llama 4: dense MLPs (``intermediate_size_mlp``) much wider than its experts and shared
#: expert (``intermediate_size``, 192)
LLAMA4 = dict(LAYERED["llama4_text"], num_hidden_layers=4, intermediate_size_mlp=1024)
#: LFM2: short convolutions on layers 0 and 2 (as wide as the hidden size), FFN 256
LFM2 = dict(LAYERED["lfm2"], num_hidden_layers=4)
#: qwen3_moe with a dense layer: dense FFN 128, expert FFN 32
DENSE_THEN_MOE = dict(num_hidden_layers=2, intermediate_size=128, moe_intermediate_size=32,
                      num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1], head_dim=16)


@pytest.fixture
def calib(tmp_path: Path) -> Path:
    path = tmp_path / "calib.txt"
    path.write_text(TEXT)
    return path


def _prune(src: Path, out: Path, calib: Path, ratio: float, **options: Any
           ) -> tuple[fxsym.Plan, int]:
    """``prune_checkpoint`` of ``src`` to ``ratio`` of its parameters by the search; the plan
    and the target."""
    model = transformers.AutoModelForCausalLM.from_pretrained(src)
    target = int(n_params(model) * ratio)
    options = {"round_to": 8, **options}
    plan = fxsym.prune_checkpoint(src, out, calibration=calib, search=True,
                                  target_params=target, calibration_tokens=128, seq_len=32,
                                  **options)
    return plan, target


def _kept(plan: fxsym.Plan, names: Any) -> set[int]:
    """The units ``plan`` keeps of each of the groups ``names``."""
    return {g.kept for g in plan.groups if g.name in set(names)}


def _assert_loads_as_in_memory(src: Path, out: Path, plan: fxsym.Plan, model_type: str) -> None:
    """``out`` loads with plain ``from_pretrained`` as ``model_type`` and gives the logits of
    the model of ``src`` pruned by ``plan`` in memory."""
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    plan.apply(model, fxsym.analyze(model))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert loaded.config.model_type == model_type
    assert n_params(loaded) == plan.params_after
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits,
                                   rtol=0, atol=0)


def test_llama4_widths_are_read_from_their_own_fields() -> None:
    """Llama 4: the dense MLP reads ``intermediate_size_mlp``, the shared expert and the
    experts ``intermediate_size`` (the plugin's sources); the experts' width (a stack of
    weights ``bmm`` multiplies, every token through every expert) is an expert FFN width, not
    an attention's, and the shared expert beside them a shared expert's, not a dense FFN."""
    torch.manual_seed(0)
    from ckpt_helpers import tiny_config

    model = transformers.AutoModelForCausalLM.from_config(tiny_config("llama4_text", **LLAMA4))
    sm = fxsym.analyze(model)
    r = roles(sm)
    sources = group_sources(sm)
    assert r.ffn == ("model.layers.0.feed_forward.gate_proj.out_features",
                     "model.layers.2.feed_forward.gate_proj.out_features")
    assert r.expert_ffn == ("model.layers.1.feed_forward.experts.gate_up_proj:2#0",
                            "model.layers.3.feed_forward.experts.gate_up_proj:2#0")
    assert r.shared_ffn == ("model.layers.1.feed_forward.shared_expert.gate_proj.out_features",
                            "model.layers.3.feed_forward.shared_expert.gate_proj.out_features")
    assert {sources[n] for n in r.ffn} == {"intermediate_size_mlp"}
    assert {sources[n] for n in (*r.expert_ffn, *r.shared_ffn)} == {"intermediate_size"}


def test_llama4_checkpoint_searches_each_width_from_its_own_range(
        tmp_path: Path, calib: Path) -> None:
    """A parameter target on Llama 4 (dense MLP 1024, experts and shared expert 192): every
    candidate gives each width the same fraction of its own (before: the shared expert was
    a dense FFN, asked the dense MLP's width, ``a dense FFN width 512: group ...shared_expert
    ... has 192 units``); the output loads with plain ``from_pretrained`` and equals the
    in-memory prune."""
    src, out = tmp_path / "in", tmp_path / "out"
    checkpoint(src, "llama4_text", **LLAMA4)
    plan, target = _prune(src, out, calib, 0.7)
    rows = plan.extra["search"]
    for row in rows:
        assert row["params"] <= target
        assert row["ffn"] <= 1024 and row["expert_ffn"] <= 192 and row["shared_ffn"] <= 192
        assert row["expert_ffn"] <= 192 * row["ffn"] // 1024 + 8  # one fraction, own steps
    assert any(row["ffn"] > 192 for row in rows)
    (best,) = [row for row in rows if row["kept"]]
    dense = [f"model.layers.{i}.feed_forward.gate_proj.out_features" for i in (0, 2)]
    shared = [f"model.layers.{i}.feed_forward.shared_expert.gate_proj.out_features"
              for i in (1, 3)]
    experts = [f"model.layers.{i}.feed_forward.experts.gate_up_proj:2#0" for i in (1, 3)]
    if best["layers"] == 4:
        assert _kept(plan, dense) <= {best["ffn"]}
        assert _kept(plan, shared) <= {best["shared_ffn"]}
        assert _kept(plan, experts) <= {best["expert_ffn"]}
    _assert_loads_as_in_memory(src, out, plan, "llama4_text")


def test_lfm2_short_convolution_is_no_ffn_width(tmp_path: Path, calib: Path) -> None:
    """LFM2's short convolution (``conv.in_proj``'s blocks) reads the hidden size and is as
    long: the hidden size again, no FFN width (before: a dense FFN width, and the search
    asked it the FFN's, ``a dense FFN width 128: group ...conv.in_proj.out_features#0 has 64
    units``). The search keeps it and sizes the FFN alone; the output loads with plain
    ``from_pretrained`` and equals the in-memory prune. (The hidden size is excluded: LFM2
    derives ``head_dim`` from it, so a narrower one is written as fxsym's own type.)"""
    src, out = tmp_path / "in", tmp_path / "out"
    model = checkpoint(src, "lfm2", **LFM2)
    r = roles(fxsym.analyze(model))
    conv = ("model.layers.0.conv.in_proj.out_features#0",
            "model.layers.2.conv.in_proj.out_features#0")
    assert set(conv) <= set(r.other) and not set(conv) & set(r.ffn)
    assert r.ffn == tuple(f"model.layers.{i}.feed_forward.w1.out_features" for i in range(4))
    plan, target = _prune(src, out, calib, 0.8, exclude=["model.embed_tokens.embedding_dim"])
    rows = plan.extra["search"]
    assert rows and all(row["params"] <= target and row["ffn"] < 256 for row in rows)
    assert all(g.kept == g.size for g in plan.groups if g.name in conv)
    _assert_loads_as_in_memory(src, out, plan, "lfm2")


def test_a_dense_then_moe_checkpoint_searches_each_role_in_its_range(
        tmp_path: Path, calib: Path) -> None:
    """qwen3_moe with a dense layer (dense FFN 128, expert FFN 32; the report of issue 29):
    every candidate keeps the dense width within 128 and the experts' within 32, each the
    same fraction of its own; the output loads with plain ``from_pretrained`` and equals the
    in-memory prune. (A regression guard: this passes on main since the roles landed.)"""
    src, out = tmp_path / "in", tmp_path / "out"
    checkpoint(src, "qwen3_moe", **DENSE_THEN_MOE)
    plan, target = _prune(src, out, calib, 0.7)
    rows = plan.extra["search"]
    assert rows and all(row["params"] <= target for row in rows)
    assert all(row["ffn"] <= 128 and row["expert_ffn"] <= 32 for row in rows)
    assert all(row["expert_ffn"] <= 32 * row["ffn"] // 128 + 8 for row in rows)
    _assert_loads_as_in_memory(src, out, plan, "qwen3_moe")


def test_widths_of_one_role_that_differ_are_classes_of_their_own() -> None:
    """A llama whose first MLP was pruned to 64 of 192 (a plan by layer): its dense FFN
    groups are two width classes, ``ffn 192`` and ``ffn 64``, each given the same fraction
    of its own width (before: one role, one width, the widest's, which the narrower group
    cannot take); the kept plan applies and runs."""
    from ckpt_helpers import tiny_config

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        tiny_config("llama", num_hidden_layers=2)).eval()
    sm = fxsym.analyze(model)
    fxsym.resize(model, sm, {"model.layers.0.mlp.gate_proj.out_features": 64})
    sm = fxsym.analyze(model)
    r = roles(sm)
    assert dict(r.classes) == {"ffn 64": ("model.layers.0.mlp.gate_proj.out_features",),
                               "ffn 192": ("model.layers.1.mlp.gate_proj.out_features",)}
    target = int(n_params(model) * 0.85)
    result = search(model, sm, target_params=target, batches=BATCHES, round_to=8,
                    fractions=(1.0,))
    for c in result.candidates:
        widths = dict(c.classes)
        assert c.params <= target and widths["ffn 64"] <= 64 and widths["ffn 192"] <= 192
        assert abs(widths["ffn 64"] / 64 - widths["ffn 192"] / 192) <= 8 / 64
        assert c.ffn == widths["ffn 192"]
    assert "ffn 64" in result.table() and "ffn 192" in result.table()
    result.plan.apply(model, sm)
    mlp = model.model.layers
    assert (mlp[0].mlp.gate_proj.out_features, mlp[1].mlp.gate_proj.out_features) == (
        dict(result.best.classes)["ffn 64"], dict(result.best.classes)["ffn 192"])
    with torch.no_grad():
        assert torch.isfinite(model(**BATCHES[0]).logits).all()


def test_widths_read_from_one_field_keep_one_width(tmp_path: Path, calib: Path) -> None:
    """DeepSeek-V3's ``moe_intermediate_size`` sizes its routed experts (fused, in steps of
    8) and its shared expert (one of width ``moe_intermediate_size``, any step: ``round_to``
    1): two roles, one field, as wide. Every candidate gives both one width (one range,
    both steps), so the config still describes the pruned model: plain ``from_pretrained``
    loads it, equal to the in-memory prune (before: different widths, written as fxsym's own type,
    ``moe_intermediate_size differs between modules``)."""
    src, out = tmp_path / "in", tmp_path / "out"
    checkpoint(src, "deepseek_v3", **dict(LAYERED["deepseek_v3"], num_hidden_layers=4))
    plan, target = _prune(src, out, calib, 0.7, round_to=1)
    rows = plan.extra["search"]
    assert rows and all(row["params"] <= target for row in rows)
    assert all(row["expert_ffn"] == row["shared_ffn"] and row["expert_ffn"] % 8 == 0
               for row in rows)
    assert any(row["expert_ffn"] < 32 for row in rows)
    _assert_loads_as_in_memory(src, out, plan, "deepseek_v3")
