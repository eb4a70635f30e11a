"""A plan says what its counts count: every parameter, and every parameter but the embedding
tables (issue 31 §3), found in the trace (a parameter of a call fed integer input), checked
against the resized model counted by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import fxsym
from fxsym.prune.cli import main


class Lookup(nn.Module):
    """A table read by ids through its own code (no ``nn.Embedding``)."""

    def __init__(self, rows: int, width: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(rows, width))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids]


class TinyLM(nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.embed = Lookup(50, 16)
        self.pos = nn.Embedding(8, 16)
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)
        self.head = nn.Linear(16, 50, bias=False)
        if tied:
            self.head.weight = self.embed.table

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) + self.pos(torch.arange(ids.shape[1]))
        h = h + self.down(torch.relu(self.up(h)))
        return self.head(h)


def _non_embedding(model: TinyLM) -> int:
    """By hand: all but the token and position tables (a tied head is the token table)."""
    tables = {id(model.embed.table), id(model.pos.weight)}
    return sum(p.numel() for p in model.parameters() if id(p) not in tables)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_the_plan_counts_non_embedding_parameters_before_and_after(tied: bool) -> None:
    torch.manual_seed(0)
    model = TinyLM(tied)
    ids = torch.randint(0, 50, (2, 8))
    sm = fxsym.analyze(model, example_inputs=(ids,))
    before = _non_embedding(model)
    assert before < sum(p.numel() for p in model.parameters())
    plan = fxsym.plan(model, sm, ratio=0.5, scope="uniform")
    assert plan.extra["non_embedding"]["before"] == before
    plan.apply(model, sm)
    assert plan.extra["non_embedding"]["after"] == _non_embedding(model) < before
    assert plan.params_after == sum(p.numel() for p in model.parameters())
    row = next(line for line in plan.summary().splitlines()
               if line.startswith("non-embedding parameters"))
    assert f"{before:,}" in row and f"{_non_embedding(model):,}" in row


def test_a_model_without_tables_has_no_non_embedding_count() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    sm = fxsym.analyze(model, example_inputs=(torch.randn(1, 4),))
    plan = fxsym.plan(model, sm, ratio=0.5)
    assert "non_embedding" not in plan.extra
    assert "non-embedding" not in plan.summary()


def test_the_cli_says_both_counts_reached(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "out"
    assert main(["prune", "test_nonembedding_counts:_llama", "--param-ratio", "0.5",
                 "--no-search", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    counts = json.loads((out / "fxsym.json").read_text())["plan"]["extra"]["non_embedding"]
    share = 100 * (counts["before"] - counts["after"]) / counts["before"]
    assert "non-embedding parameters" in said
    assert f"{share:.1f}% of its non-embedding parameters" in said


def _llama() -> nn.Module:
    import transformers

    cfg = transformers.AutoConfig.for_model(
        "llama", hidden_size=32, intermediate_size=64, vocab_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model: nn.Module = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    return model
