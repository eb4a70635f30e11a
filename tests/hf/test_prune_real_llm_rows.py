"""``benchmarks/prune_real_llm.py``'s own parts, on a tiny llama checkpoint (the benchmark itself
prunes and distils a 135M-parameter model for hours and is not run here): its ShortGPT
baseline, written from the paper independently of fxsym, keeps the layers fxsym's depth prune
keeps and saves a model ``from_pretrained`` reads; its table judges the rows after recovery
only beyond the spread, and says when fewer seeds were recovered than pruned."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from ckpt_helpers import TEXT, checkpoint

import fxsym


def _bench() -> ModuleType:
    folder = pathlib.Path(__file__).parents[2] / "benchmarks"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location("prune_real_llm", folder / "prune_real_llm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shortgpt_keeps_the_layers_fxsym_depth_keeps(tmp_path: Path) -> None:
    """ShortGPT's block influence from hooks on the transformers model, 2 of 4 layers kept: the
    saved model's logits are those of the base with the same two layers alone (hand-built
    reference) and those of ``fxsym.prune_checkpoint(layers=2)`` on the same calibration."""
    from transformers import AutoModelForCausalLM

    bench = _bench()
    torch.manual_seed(0)
    base = checkpoint(tmp_path / "base", "llama", num_hidden_layers=4)
    info = bench.shortgpt(str(tmp_path / "base"), str(tmp_path / "short"), [TEXT], 96, 32, 2)
    kept = [i for i in range(4) if i not in info["removed"]]
    assert len(kept) == 2 and len(info["influence"]) == 4
    assert sorted(info["influence"], reverse=True)[:2] == [info["influence"][i] for i in
                                                           sorted(kept, key=lambda i:
                                                                  -info["influence"][i])]
    fxsym.load_plugins()
    fxsym.prune_checkpoint(tmp_path / "base", tmp_path / "fx", layers=2, calibration=[TEXT],
                           calibration_tokens=96, seq_len=32)

    ids = torch.randint(3, 300, (2, 24))
    base.model.layers = torch.nn.ModuleList(base.model.layers[i] for i in kept)
    for new, layer in enumerate(base.model.layers):
        layer.self_attn.layer_idx = new
    base.config.num_hidden_layers = 2
    with torch.no_grad():
        reference = base(input_ids=ids, use_cache=False).logits
        short = AutoModelForCausalLM.from_pretrained(tmp_path / "short").eval()
        fx = AutoModelForCausalLM.from_pretrained(tmp_path / "fx", trust_remote_code=True).eval()
        assert short.config.num_hidden_layers == 2
        torch.testing.assert_close(short(input_ids=ids, use_cache=False).logits, reference)
        torch.testing.assert_close(fx(input_ids=ids, use_cache=False).logits, reference)


def _runs(english: list[float], after: list[float | None]) -> list[dict[str, Any]]:
    runs = []
    for seed, (before, recovered) in enumerate(zip(english, after)):
        run = {"seed": seed, "params": 500, "non_embedding": 400, "english": before,
               "code": before, "seconds": 1.0, "peak_kb": 1024, "shape": "L2 h8"}
        if recovered is not None:
            run.update({"english after": recovered, "code after": recovered,
                        "recover_seconds": 2.0})
        runs.append(run)
    return runs


def test_table_judges_recovered_rows_beyond_the_spread_only() -> None:
    """After recovery, a fxsym row whose range lies below Torch-Pruning's is *better*, one whose
    range overlaps it a *tie*, and a row recovered for one seed of three has no verdict and
    says so."""
    bench = _bench()
    result = {"base": {"params": 1000, "non_embedding": 800, "english": 5.0, "code": 5.0,
                       "shape": "L4 h8"},
              "rows": {"0.5": {
                  bench.TP_ROW: _runs([50, 52, 54], [20.0, 21.0, 22.0]),
                  "fxsym search": _runs([40, 41, 42], [15.0, 16.0, 17.0]),
                  "fxsym width search": _runs([40, 41, 42], [19.0, 21.5, 23.0]),
                  "fxsym depth": _runs([60, 61, 62], [30.0, None, None])}}}
    lines = {line.split(" (")[0]: line for line in bench.render(result).splitlines()}
    assert "better / better" in lines["fxsym search"].split("16.0 (15.0-17.0)")[-1]
    assert "tie / tie" in lines["fxsym width search"].split("21.2 (19.0-23.0)")[-1]
    assert "[1 seed]" in lines["fxsym depth"]
    assert "worse / worse" in lines["fxsym depth"]
    assert lines["fxsym depth"].count("better") + lines["fxsym depth"].count("tie") == 0
