"""A uniform prune whose config cannot describe the result says why (issue 29 §6).

``--hidden`` on Gemma 2 keeps the embeddings' scale that the model derives from the hidden size
when it is built (``sqrt(64)``; a config of the new hidden size builds ``sqrt(32)``), and on
GPT-2 keeps attention heads of 16 that GPT-2 derives as ``n_embd // n_head``: neither config
has a field for the value, so the checkpoint is fxsym's own model type, and the plan's notes
(printed by ``fxsym prune``) name the value, the value a model built from the config has and
the field it follows. Phi-3 reads ``getattr(config, "head_dim", hidden // heads)``: a
``head_dim`` field describes its heads, so its checkpoint is a plain one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from ckpt_helpers import checkpoint

import fxsym
from fxsym.prune.cli import main

#: model type -> (config overrides, what the note says)
UNDESCRIBED = {
    "gemma2": (dict(head_dim=16), ["scalar_embed_scale is 8 in model.embed_tokens",
                                   "built from the config has 5.65685",
                                   "it follows hidden_size"]),
    "gpt2": (dict(n_embd=64, n_head=4, n_layer=2, n_positions=128),
             ["head_dim is 16 in transformer.h.0.attn", "built from the config has 8",
              "it follows n_embd"]),
}


@pytest.mark.parametrize("family", sorted(UNDESCRIBED))
def test_the_plan_says_what_the_config_cannot_describe(tmp_path: Path, family: str) -> None:
    """Before, the output was ``fxsym_pruned`` with no word of why."""
    overrides, says = UNDESCRIBED[family]
    src, out = tmp_path / "in", tmp_path / "out"
    checkpoint(src, family, **overrides)
    plan = fxsym.prune_checkpoint(src, out, sizes={"hidden": 32})
    notes = " ".join(plan.extra.get("notes") or ())
    assert all(s in notes for s in says), notes
    assert fxsym.prune.persist.read_manifest(out)["plan"].extra["notes"] == plan.extra["notes"]
    assert transformers.AutoConfig.from_pretrained(
        out, trust_remote_code=True).model_type == "fxsym_pruned"


def test_the_cli_prints_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    overrides, says = UNDESCRIBED["gemma2"]
    src, out = tmp_path / "in", tmp_path / "out"
    checkpoint(src, "gemma2", **overrides)
    assert main(["prune", str(src), "--hidden", "32", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert all(s in said for s in says), said
    assert "its config cannot describe the pruned model (scalar_embed_scale" in said


def test_the_command_shows_the_warning_as_one_fxsym_line(tmp_path: Path) -> None:
    """Before, the warning was Python's two lines: the issuing file and line, then the
    source line of the call."""
    overrides, says = UNDESCRIBED["gemma2"]
    src, out = tmp_path / "in", tmp_path / "out"
    checkpoint(src, "gemma2", **overrides)
    argv = ["prune", str(src), "--hidden", "32", "-o", str(out)]
    res = subprocess.run([sys.executable, "-c", "import sys\nfrom fxsym.prune.cli import main\n"
                          f"sys.exit(main({argv!r}))"], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    warned = [line for line in res.stderr.splitlines() if "ResizeWarning" in line]
    assert len(warned) == 1 and warned[0].startswith(
        "fxsym: ResizeWarning: Gemma2ForCausalLM.config does not describe"), res.stderr
    assert all(s in warned[0] for s in says)
    assert "configs.update_config(" not in res.stderr


def test_phi3_heads_wider_than_the_hidden_size_divides_are_a_plain_checkpoint(
        tmp_path: Path) -> None:
    """Before, Phi-3's ``--hidden 32`` (4 heads of 16) was written as ``fxsym_pruned``:
    its config derives ``head_dim`` 8; a ``head_dim`` field describes it."""
    src, out = tmp_path / "in", tmp_path / "out"
    model = checkpoint(src, "phi3", pad_token_id=0)
    plan = fxsym.prune_checkpoint(src, out, sizes={"hidden": 32})
    assert not plan.extra.get("notes")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert (loaded.config.model_type, loaded.config.hidden_size, loaded.config.head_dim) == (
        "phi3", 32, 16)
    plan.apply(model, fxsym.analyze(model))  # the same plan on the model in memory
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
