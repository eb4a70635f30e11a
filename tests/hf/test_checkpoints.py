"""A pruned Hugging Face model saved with ``fxsym.save`` is a checkpoint transformers' own
loaders read correctly (issue 20 §5): a plain one after a plan the config can express, one of
fxsym's own model type that loads through ``auto_map`` with ``trust_remote_code`` otherwise,
and a loud failure from every loader that cannot handle it. Tiny configs, random weights,
nothing from the Hub (``HF_MODULES_CACHE`` is a directory of the test run: tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from conftest import CONFIGS, build

import fxsym
from fxsym.prune.cli import main
from fxsym.prune.persist import read_manifest
from fxsym.tracer import resolve_example_inputs

FAMILIES = ["llama", "qwen2", "gpt2", "bert"]


def _outputs(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


def _pruned(family: str, scope: str) -> tuple[torch.nn.Module, fxsym.Plan]:
    """A tiny model of ``family`` pruned by a plan of ``scope``, its weights then moved off
    the values a fresh model would have. A uniform plan keeps ``head_dim``, which GPT-2's and
    BERT's configs derive as ``hidden // heads`` (they could not express a smaller one)."""
    model = build(family)
    sm = fxsym.analyze(model)
    keep = [g.name for g in sm.groups() if any(s == "head_dim" for _, s in g.members)]
    ratio, exclude = (0.5, keep) if scope == "uniform" else (0.4, [])
    plan = fxsym.plan(model, sm, ratio=ratio, scope=scope, importance="l1", exclude=exclude)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fxsym.ResizeWarning)
        plan.apply(model, sm)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    return model, plan


def _auto(family: str) -> Any:
    return getattr(transformers, CONFIGS[family][0])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_uniform_plan_is_a_plain_checkpoint(family: str, tmp_path: Path) -> None:
    model, plan = _pruned(family, "uniform")
    assert not getattr(model.config, "fxsym_nonuniform", None)
    fxsym.save(model, tmp_path, plan)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == model.config.model_type
    assert config["architectures"] == [type(model).__name__] and "auto_map" not in config
    assert not (tmp_path / "fxsym_pruned.py").exists()
    inputs = resolve_example_inputs(model, None)
    again = _auto(family).from_pretrained(tmp_path)
    assert type(again) is type(model)
    torch.testing.assert_close(_outputs(again, inputs), _outputs(model, inputs), rtol=0, atol=0)
    fresh = build(family)  # fxsym reads the same directory
    fxsym.load(fresh, tmp_path)
    torch.testing.assert_close(_outputs(fresh, inputs), _outputs(model, inputs), rtol=0, atol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_non_uniform_plan_loads_through_auto_map_and_nothing_else(family: str,
                                                                    tmp_path: Path) -> None:
    model, plan = _pruned(family, "global")
    sizes = model.config.fxsym_nonuniform
    assert sizes  # the config cannot describe the model
    fxsym.save(model, tmp_path, plan)
    config = json.loads((tmp_path / "config.json").read_text())
    cls = type(model).__name__
    assert config["model_type"] == "fxsym_pruned"
    assert config["architectures"] == [f"FxsymPruned{cls}"]
    assert config["auto_map"] == {"AutoConfig": "fxsym_pruned.FxsymPrunedConfig",
                                  CONFIGS[family][0]: "fxsym_pruned.FxsymPrunedModel"}
    assert config["pruned_config"]["fxsym_nonuniform"] == sizes  # each module's size
    assert config["unpruned_config"]["model_type"] == model.config.model_type
    # every loader that cannot handle it fails, loudly
    for load in (transformers.AutoConfig.from_pretrained, _auto(family).from_pretrained):
        with pytest.raises(ValueError, match="trust_remote_code=True"):
            load(tmp_path)
    with pytest.raises(ValueError, match="fxsym_pruned"):
        transformers.AutoConfig.for_model(config["model_type"])
    with pytest.raises(RuntimeError, match="mismatch"):  # the weights fit no model of cls
        getattr(transformers, cls).from_pretrained(tmp_path)
    # the loader saved with it: the pruned model, of the original class
    again = _auto(family).from_pretrained(tmp_path, trust_remote_code=True)
    assert type(again) is type(model) and not again.training
    inputs = resolve_example_inputs(model, None)
    torch.testing.assert_close(_outputs(again, inputs), _outputs(model, inputs), rtol=0, atol=0)
    assert again.config.fxsym_nonuniform == sizes
    read = transformers.AutoConfig.from_pretrained(tmp_path, trust_remote_code=True)
    assert read.model_type == "fxsym_pruned" and read.model_class == cls
    copied = Path(os.environ["HF_MODULES_CACHE"])  # never the user's cache
    assert any(p.name == "fxsym_pruned.py" for p in copied.rglob("*.py"))
    # saved again over the first save (whose files its manifest lists): the same checkpoint
    fxsym.save(again, tmp_path, plan)
    assert json.loads((tmp_path / "config.json").read_text()) == config


def test_without_fxsym_the_loader_says_what_is_missing(tmp_path: Path) -> None:
    model, plan = _pruned("llama", "global")
    fxsym.save(model, tmp_path / "ckpt", plan)
    script = ("import sys; sys.modules['fxsym_plugins_hf'] = None\n"
              "import transformers\n"
              f"transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path / 'ckpt')!r}, "
              "trust_remote_code=True)\n")
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=600)
    assert res.returncode != 0
    assert "ImportError: this checkpoint was pruned by fxsym" in res.stderr, res.stderr[-2000:]
    assert "pip install fxsym" in res.stderr


def test_save_pretrained_of_a_non_uniform_model_does_not_load_as_the_original(
        tmp_path: Path) -> None:
    """transformers' own ``save_pretrained`` writes the original type with the largest sizes
    (and ``fxsym_nonuniform``): its loaders refuse the weights, which fit no such model."""
    model, _ = _pruned("llama", "global")
    model.save_pretrained(tmp_path)
    with pytest.raises(RuntimeError, match="mismatch"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize(("scope", "ratio", "model_type"), [
    ("uniform", "0.5", "llama"),
    ("uniform", "0.4", "fxsym_pruned"),  # hidden 39, 4 heads of 16: LlamaConfig refuses it
    ("global", "0.4", "fxsym_pruned")])
def test_fxsym_prune_of_a_transformers_model_writes_a_checkpoint(
        scope: str, ratio: str, model_type: str, tmp_path: Path, monkeypatch: Any) -> None:
    (tmp_path / "tinyllama.py").write_text(
        "import transformers\n"
        "def build():\n"
        "    cfg = transformers.AutoConfig.for_model('llama', hidden_size=64,\n"
        "        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,\n"
        "        num_key_value_heads=2, vocab_size=100)\n"
        "    return transformers.AutoModelForCausalLM.from_config(cfg)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fxsym.ResizeWarning)
        assert main(["prune", "tinyllama:build", "--ratio", ratio, "--scope", scope,
                     "-o", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["model_type"] == model_type
    plan = read_manifest(out)["plan"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        out, trust_remote_code=model_type == "fxsym_pruned")
    assert {n: tuple(p.shape) for n, p in loaded.named_parameters()} == {
        n: tuple(s) for n, s in plan.shapes.items()}
