"""Every option of ``fxsym prune`` is honoured or refused, never dropped (issue 22 §1, §4).

The architecture search (a parameter target on a model with a stack of residual blocks, in
memory or a checkpoint directory with ``--calib``) keeps the groups ``--exclude`` names whole
in every candidate and keeps ``--min-keep`` units; an option the way of pruning would not use
is a one-line error naming it, before anything is written. Tiny llama models from
``AutoConfig.for_model`` with random weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from ckpt_helpers import checkpoint, n_params, tiny_llama

import fxsym
from fxsym.prune.cli import main
from fxsym.prune.search import candidates, roles, search

transformers = pytest.importorskip("transformers")

HIDDEN = "model.embed_tokens.embedding_dim"
BATCHES = [{"input_ids": torch.randint(0, 128, (2, 12),
                                       generator=torch.Generator().manual_seed(i))}
           for i in range(2)]


def _cut(plan: fxsym.Plan) -> set[str]:
    return {c.name for c in plan.groups if c.keep is not None and len(c.keep) < c.size}


def test_the_search_keeps_excluded_groups_whole_in_every_candidate() -> None:
    model = tiny_llama()
    sm = fxsym.analyze(model)
    r = roles(sm)
    first_ffn = r.ffn[0]
    target = n_params(model) * 6 // 10
    found = candidates(model, sm, target_params=target, round_to=8,
                       exclude=[HIDDEN, first_ffn])
    assert found and {c.hidden for c in found} == {64}
    result = search(model, sm, target_params=target, batches=BATCHES, round_to=8,
                    exclude=[HIDDEN, first_ffn])
    for c in result.candidates:
        assert c.hidden == 64 and c.plan is not None
        assert not _cut(c.plan) & {HIDDEN, first_ffn}
        assert c.plan.params_after == c.params <= target  # counted with them whole
    assert any(c.plan is not None and _cut(c.plan) & set(r.ffn[1:])
               for c in result.candidates)  # the other FFN widths are searched


def test_the_search_keeps_min_keep_units() -> None:
    model = tiny_llama()
    sm = fxsym.analyze(model)
    result = search(model, sm, target_params=n_params(model) * 6 // 10, batches=BATCHES,
                    round_to=8, min_keep=56)
    assert all(c.hidden is not None and c.hidden >= 56 and (c.ffn or 0) >= 56
               for c in result.candidates)
    kept = {c.name: len(c.keep) for c in result.plan.groups if c.keep is not None}
    assert all(n >= 56 for n in kept.values()), kept


def _table_hiddens(out: str) -> set[int]:
    """The hidden column of the candidates table ``fxsym prune`` prints."""
    rows = out.split("parameters:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return {int(line.split()[1]) for line in rows if line.split() and line.split()[0].isdigit()}


def test_cli_search_in_memory_honours_exclude(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    target = n_params(tiny_llama()) // 2
    out = tmp_path / "out"
    code = main(["prune", "ckpt_helpers:tiny_llama", "--target-params", str(target),
                 "--round-to", "8", "--exclude", HIDDEN, "-o", str(out)])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert _table_hiddens(said.out) == {64}
    plan = fxsym.prune.persist.read_manifest(out)["plan"]
    assert HIDDEN not in _cut(plan) and plan.params_after <= target


def test_cli_search_of_a_checkpoint_honours_exclude(tmp_path: Path, calib: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "in", tmp_path / "out"
    target = n_params(checkpoint(src, "llama", num_hidden_layers=3)) // 2
    code = main(["prune", str(src), "--calib", str(calib), "--calib-tokens", "64",
                 "--seq-len", "16", "--target-params", str(target), "--round-to", "8",
                 "--exclude", HIDDEN, "-o", str(out)])
    said = capsys.readouterr()
    assert code == 0, said.err
    plan = fxsym.prune.persist.read_manifest(out)["plan"]
    assert {row["hidden"] for row in plan.extra["search"]} == {64}
    assert HIDDEN not in _cut(plan)
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert pruned.config.hidden_size == 64 and n_params(pruned) <= target


MODEL = "ckpt_helpers:tiny_llama"


@pytest.mark.parametrize("args, says", [
    (["--target-params", "200000", "--scope", "global"], "--scope global"),
    (["--hidden", "32", "--scope", "uniform"], "--scope uniform"),
    (["--layers", "0,2", "--scope", "global"], "--scope global"),
    (["--ratio", "0.3", "--batches", "2"], "--batches"),
    (["--ratio", "0.3", "--calib-tokens", "64"], "--calib-tokens"),
    (["--ratio", "0.3", "--seq-len", "16"], "--seq-len"),
    (["--ratio", "0.3", "--max-shard-size", "1MB"], "--max-shard-size"),
    (["--target-active-params", "200000", "--layers", "0,2"], "--target-active-params"),
], ids=["search-scope", "sizes-scope", "depth-scope", "batches", "calib-tokens", "seq-len",
        "shard", "active-positions"])
def test_in_memory_refusals(tmp_path: Path, args: list[str], says: str,
                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["prune", MODEL, *args, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("fxsym: ") and says in err, err
    assert not out.exists()


def test_active_target_without_blocks_is_refused(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prune", "fxsym.prune.demo:DemoNet", "--target-active-params", "1000",
                 "--input-shape", "1,3,16,16", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--target-active-params" in err and "--target-params" in err, err


def test_active_target_with_a_layer_count_searches_widths_at_that_depth(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, ``--layers 2`` made a depth-only plan and the active target was dropped."""
    target = n_params(tiny_llama()) // 3
    out = tmp_path / "out"
    code = main(["prune", MODEL, "--target-active-params", str(target), "--layers", "2",
                 "--round-to", "8", "-o", str(out)])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert "calib loss" in said.out
    plan = fxsym.prune.persist.read_manifest(out)["plan"]
    assert [len(d.keep) for d in plan.depth] == [2] and _cut(plan)


@pytest.mark.parametrize("args, says", [
    (["--ratio", "0.3", "--input-shape", "1,8"], "--input-shape"),
    (["--ratio", "0.3", "--batches", "2"], "--batches"),
    (["--ratio", "0.3", "--importance", "l2", "--seq-len", "16"], "--seq-len"),
    (["--ratio", "0.3", "--importance", "l2", "--calib", "CALIB"], "--calib"),
    (["--target-params", "100000", "--calib", "CALIB", "--scope", "global"], "--scope global"),
    (["--hidden", "32", "--importance", "l2", "--scope", "uniform"], "--scope uniform"),
], ids=["input-shape", "batches", "seq-len-no-calib", "calib-unused", "search-scope",
        "sizes-scope"])
def test_checkpoint_refusals(tmp_path: Path, calib: Path, args: list[str], says: str,
                             capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "in", tmp_path / "out"
    checkpoint(src, "llama", num_hidden_layers=2)
    args = [str(calib) if a == "CALIB" else a for a in args]
    assert main(["prune", str(src), *args, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("fxsym: ") and says in err, err
    assert not out.exists()


@pytest.mark.parametrize("how, says", [
    (dict(search=True, ratio=0.5, calibration_tokens=64, seq_len=16), "search=True"),
    (dict(importance="l2", ratio=0.5), "calibration text with importance 'l2'"),
    (dict(search=True, target_params=100_000, scope="global"), "scope"),
], ids=["search-without-target", "calibration-unused", "search-scope"])
def test_prune_checkpoint_refuses_what_it_would_not_use(tmp_path: Path, calib: Path,
                                                        how: dict[str, Any], says: str) -> None:
    src, out = tmp_path / "in", tmp_path / "out"
    checkpoint(src, "llama", num_hidden_layers=2)
    with pytest.raises(fxsym.PlanError, match=says):
        fxsym.prune_checkpoint(src, out, calibration=calib, **how)
    assert not out.exists()


def test_an_in_memory_prune_of_a_transformers_model_ends_with_from_pretrained(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, the output ended with ``saved to DIR``: the last line now says the directory
    is a checkpoint ``from_pretrained`` loads, and it does, computing what the pruned model
    computed."""
    out = tmp_path / "out"
    assert main(["prune", MODEL, "--hidden", "32", "-o", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert f"AutoModelForCausalLM.from_pretrained({str(out)!r})" in last, last
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert pruned.config.hidden_size == 32
    expected = fxsym.load(tiny_llama(), out)
    ids = BATCHES[0]["input_ids"]
    torch.testing.assert_close(pruned(ids).logits, expected(ids).logits)
