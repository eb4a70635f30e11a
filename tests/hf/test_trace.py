"""Trace preparation: graphs equal eager on new shapes, nothing patched outlives a trace,
default inputs, the meta device, and life without transformers."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import transformers
import transformers.masking_utils as masking_utils
from conftest import build
from transformers.models.llama import modeling_llama

import fxsym
from fxsym.tracer import resolve_example_inputs
from fxsym_plugins_hf import inputs as hf_inputs
from fxsym_plugins_hf.masks import MaskLeaf, mask_builders


def _padded_inputs(model: torch.nn.Module, batch: int, seq: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 100, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, seq - 3:] = 0  # right padding on one row
    inputs = {"input_ids": ids, "attention_mask": mask}
    if model.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = torch.randint(0, 100, (batch, 4), generator=gen)
    return inputs


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "t5"])
def test_traced_graph_equals_eager_on_new_shapes_with_padding(family: str) -> None:
    model = build(family)
    gm = fxsym.trace(model)  # traced at (2, 8) with no padding
    masks = [n for n in gm.graph.nodes if isinstance(n.target, MaskLeaf)]
    assert masks, "the mask builders are single opaque calls"
    for batch, seq in ((2, 8), (3, 12)):
        inputs = _padded_inputs(model, batch, seq)
        with torch.no_grad():
            expected = model(**inputs).logits
            got = gm(**inputs)["logits"]
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_nothing_patched_outlives_the_trace_even_when_it_raises() -> None:
    seen: dict[str, object] = {}

    class Boom(modeling_llama.LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, **kwargs):  # type: ignore[no-untyped-def]
            out = super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
            cfg = self.config
            seen.update(use_cache=cfg.use_cache, attn=cfg._attn_implementation,
                        mask=modeling_llama.create_causal_mask, out=out)
            raise RuntimeError("boom")

    model = Boom(build("llama").config).eval()
    cfg = model.config
    vars(cfg)["_attn_implementation_internal"] = "flash_attention_2"  # not traceable on meta
    with pytest.raises(fxsym.TraceError, match="boom"):
        fxsym.trace(model)
    assert seen["use_cache"] is False and seen["attn"] == "sdpa"
    assert seen["mask"] is not masking_utils.create_causal_mask  # patched during the trace
    assert cfg.use_cache is True and cfg._attn_implementation == "flash_attention_2"
    assert modeling_llama.create_causal_mask is masking_utils.create_causal_mask
    assert isinstance(seen["out"]["logits"], torch.fx.Proxy)  # the whole model was traced
    builders = set(map(id, mask_builders().values()))
    for name, mod in list(sys.modules.items()):  # no wrapper left in any transformers module
        if name.partition(".")[0] == "transformers" and mod is not None:
            for value in list(vars(mod).values()):
                wrapped = getattr(value, "__wrapped__", None) if callable(value) else None
                assert id(wrapped) not in builders, (name, value)


def test_default_example_inputs_follow_the_family() -> None:
    keys = {
        "gpt2": {"input_ids", "attention_mask"},
        "bert": {"input_ids", "attention_mask"},
        "t5": {"input_ids", "attention_mask", "decoder_input_ids"},
        "vit": {"pixel_values"},
    }
    for family, expected in keys.items():
        model = build(family)
        inputs = resolve_example_inputs(model, None)
        assert isinstance(inputs, dict) and set(inputs) == expected, family
        if "input_ids" in inputs:
            assert inputs["input_ids"].dtype == torch.long
            assert int(inputs["input_ids"].max()) < model.config.vocab_size
        else:
            assert inputs["pixel_values"].shape == (2, 3, 32, 32)
    assert hf_inputs.example_inputs(torch.nn.Linear(2, 2)) is None  # not a transformers model


def test_meta_device_model_is_analyzed_without_allocating() -> None:
    model = build("llama", device="meta", num_hidden_layers=3)
    sm = fxsym.analyze(model)
    assert all(p.is_meta for p in model.parameters())
    reference = fxsym.analyze(build("llama", num_hidden_layers=3))
    assert [(g.name, g.size) for g in sm.groups()] == [
        (g.name, g.size) for g in reference.groups()]
    assert len(sm.groups()) == 1 + 3 * 3  # hidden; heads, queries_per_kv, MLP per layer


def test_loading_the_hf_plugin_and_analyzing_other_models_never_imports_transformers() -> None:
    code = """
import sys, torch, fxsym
pm = fxsym.load_plugins()
assert pm.has_plugin("hf") and "transformers" not in sys.modules
model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
sm = fxsym.analyze(model)  # every hook asked, the hf plugin's included
assert [g.name for g in sm.groups()] == ["0.out_features"], sm.groups()
assert "transformers" not in sys.modules
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr


def test_without_transformers_core_and_nn_work_and_the_hf_plugin_says_why() -> None:
    code = """
import sys
sys.modules["transformers"] = None  # an import blocker: `import transformers` raises
import warnings
warnings.simplefilter("ignore")
import torch, fxsym
pm = fxsym.load_plugins()
failed = {f.name: f for f in pm.failed}
assert "hf" in failed and "nn" not in failed, failed
assert failed["hf"].distribution == "fxsym-plugins-hf", failed["hf"]
assert "transformers" in failed["hf"].error, failed["hf"]
model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
sm = fxsym.analyze(model, example_inputs=(torch.randn(2, 3),))
assert [g.name for g in sm.groups()] == ["0.out_features"]
from fxsym.prune.cli import main
main(["plugins"])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("hf "))
    assert "fxsym-plugins-hf" in line and "INACTIVE" in line and "transformers" in line
    assert any(ln.startswith("nn ") for ln in out.stdout.splitlines())


def test_transformers_is_really_installed() -> None:
    assert transformers.__version__.split(".")[0] >= "5"


def test_data_dependent_rope_is_a_leaf_that_updates_at_run_time() -> None:
    rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    model = build("llama", rope_parameters=rope, max_position_embeddings=16)
    sm = fxsym.analyze(model)
    assert [g.name for g in sm.groups()] == [g.name for g in fxsym.analyze(build("llama")).groups()]
    assert "forward" not in vars(model.model.rotary_emb)  # the meta path is gone after tracing
    gm = sm.graph_module
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"
            and "rotary" in str(n.target)] == ["model.rotary_emb"]
    for seq in (8, 40):  # 40 > 16 positions: the dynamic update runs inside the leaf
        ids = torch.randint(0, 100, (2, seq))
        mask = torch.ones(2, seq, dtype=torch.long)
        with torch.no_grad():
            torch.testing.assert_close(gm(input_ids=ids, attention_mask=mask)["logits"],
                                       model(input_ids=ids, attention_mask=mask).logits)


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_token_ids_alone_trace_and_analyze(family: str) -> None:
    """No attention mask: the mask builders see position ids only (a packed-sequence check
    that depends on data is skipped at trace time, and runs for real in the graph)."""
    model = build(family)
    ids = torch.randint(0, 100, (2, 8))
    sm = fxsym.analyze(model, example_inputs={"input_ids": ids})
    assert not [e for e in sm.trace_report if e.kind in ("unknown-value", "leaf-fallback")]
    reference = fxsym.analyze(model)
    assert [g.name for g in sm.groups()] == [g.name for g in reference.groups()]
    gm = sm.graph_module
    for seq in (8, 11):
        ids = torch.randint(0, 100, (3, seq))
        with torch.no_grad():
            torch.testing.assert_close(gm(input_ids=ids)["logits"], model(input_ids=ids).logits)


def test_positional_example_inputs() -> None:
    model = build("gpt2")
    ids = torch.randint(0, 100, (2, 7))
    sm = fxsym.analyze(model, example_inputs=(ids,))
    assert [n.target for n in sm.graph_module.graph.nodes if n.op == "placeholder"] == [
        "input_ids"]
    assert [g.name for g in sm.groups()] == [g.name for g in fxsym.analyze(model).groups()]
