"""A run of the workflow builds each config on the meta device once (issue 31 §4, the speed of
the search).

A checkpoint search plans every candidate with the sizes the config describes and applies the
candidates it scores, and each of those asks the hf plugin to build the model on the meta
device from a config (``fxsym_plugins_hf.configs.meta_build``): 147 builds of 26 distinct
configs on SmolLM2-135M, 36 s of an 85 s search. Inside a run (:mod:`fxsym.memo`) a config
built before is not built again; outside one nothing is kept."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_helpers import TEXT, checkpoint, tiny_config
from safetensors.torch import load_file

import fxsym
import fxsym_plugins_hf.configs as configs
import fxsym_plugins_hf.configs.builds as builds
from fxsym.memo import remembering


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_a_checkpoint_search_builds_each_config_once_and_prunes_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``prune_checkpoint``'s search asks for many meta builds of few configs and builds each
    config once; its candidates' damages and losses, its plan and the pruned weights are
    those of the same search building every config each time it is asked."""
    model = checkpoint(tmp_path / "in", "llama", num_hidden_layers=4)
    target = sum(p.numel() for p in model.parameters()) // 2
    options: dict[str, Any] = dict(calibration=[TEXT], target_params=target,
                                   calibration_tokens=64, seq_len=24, round_to=8, shortlist=2)
    with remembering() as run:
        once = fxsym.prune_checkpoint(tmp_path / "in", tmp_path / "once", **options)
        built = sum(kind == "meta_build" for kind, _ in run.answers)
    assert run.computed["meta_build"] == built
    assert run.asked["meta_build"] >= 3 * built

    def always(kind: str, key: Any, compute: Any) -> Any:
        return compute()

    monkeypatch.setattr(builds, "remembered", always)
    every = fxsym.prune_checkpoint(tmp_path / "in", tmp_path / "every", **options)
    assert once.to_json() == every.to_json()
    assert [(r["damage"], r["loss"]) for r in once.extra["search"]] == [
        (r["damage"], r["loss"]) for r in every.extra["search"]]
    first, second = _weights(tmp_path / "once"), _weights(tmp_path / "every")
    assert first.keys() == second.keys()
    for name, t in first.items():
        assert torch.equal(t, second[name]), name
    assert json.loads((tmp_path / "once" / "config.json").read_text()) == json.loads(
        (tmp_path / "every" / "config.json").read_text())


def test_meta_build_gives_a_config_built_before_in_the_run_only() -> None:
    """Inside a run, an equal config (a deep copy) gives the model built before; a changed
    field, or another default dtype, builds anew (the field's shapes follow); outside a run
    and after it, every call builds."""
    import transformers

    config = tiny_config("llama")
    model = transformers.AutoModelForCausalLM.from_config(config)
    with remembering():
        base = configs.meta_build(model, config)
        assert base is not None
        assert configs.meta_build(model, copy.deepcopy(config)) is base
        wider = copy.deepcopy(config)
        wider.intermediate_size = 3 * config.intermediate_size
        other = configs.meta_build(model, wider)
        assert other is not None and other is not base
        assert other.get_submodule("model.layers.0.mlp.up_proj").weight.shape[0] == (
            3 * config.intermediate_size)
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            doubled = configs.meta_build(model, config)
        finally:
            torch.set_default_dtype(default)
        assert doubled is not None and doubled is not base
        assert doubled.get_submodule("model.layers.0.mlp.up_proj").weight.dtype == torch.float64
    after = configs.meta_build(model, config)
    assert after is not None and after is not base
    assert configs.meta_build(model, config) is not after
