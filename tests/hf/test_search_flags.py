"""One meaning for each combination of pruning options, the same in the CLI and the API
(issue 31 §3), and a warning where the default ranking is known to cost quality.

A parameter target without sizes is the architecture search (:func:`fxsym.prune.options.searches`):
at the depth of ``--layers K`` / ``layers=K`` when given (a width-only search), off with
``--no-search`` / ``search=False``. A checkpoint pruned by width without calibration text is
ranked by weight magnitude, with an :class:`fxsym.ImportanceWarning` (one line from the CLI)
unless ``l2`` was asked. Tiny llama checkpoints from ``AutoConfig.for_model``, random
weights."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from ckpt_helpers import checkpoint, n_params

import fxsym
from fxsym.prune.cli import main

transformers = pytest.importorskip("transformers")

SMALL = ["--calib-tokens", "64", "--seq-len", "16", "--round-to", "8"]


def _llama(path: Path) -> int:
    """A 3-layer llama checkpoint at ``path``; half its parameters."""
    return n_params(checkpoint(path, "llama", num_hidden_layers=3)) // 2


def test_a_layer_count_and_a_target_search_widths_at_that_depth_in_the_api(
        tmp_path: Path, calib: Path) -> None:
    """Before, ``layers=2`` with a target and calibration text made one activation plan of
    widths (the CLI did the same): now it is the width-only search at depth 2."""
    src = tmp_path / "in"
    target = _llama(src)
    plan = fxsym.prune_checkpoint(src, tmp_path / "out", calibration=calib, layers=2,
                                  target_params=target, calibration_tokens=64, seq_len=16,
                                  round_to=8)
    rows = plan.extra["search"]
    assert len(rows) > 1 and {r["layers"] for r in rows} == {2}
    assert [len(d.keep) for d in plan.depth] == [2] and plan.params_after <= target


def test_the_cli_and_the_api_make_the_same_width_only_search(
        tmp_path: Path, calib: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in"
    target = _llama(src)
    assert main(["prune", str(src), "--calib", str(calib), "--layers", "3",
                 "--target-params", str(target), *SMALL, "-o", str(tmp_path / "cli")]) == 0
    assert "candidates for" in capsys.readouterr().out
    by_cli = fxsym.prune.persist.read_manifest(tmp_path / "cli")["plan"]
    by_api = fxsym.prune_checkpoint(src, tmp_path / "api", calibration=calib, layers=3,
                                    target_params=target, calibration_tokens=64, seq_len=16,
                                    round_to=8)
    assert by_cli.extra["search"] == by_api.extra["search"]
    assert {r["layers"] for r in by_api.extra["search"]} == {3}
    assert by_cli.choices() == by_api.choices()


def test_no_search_is_one_plan_of_widths_in_the_cli_and_the_api(
        tmp_path: Path, calib: Path) -> None:
    src = tmp_path / "in"
    target = _llama(src)
    assert main(["prune", str(src), "--calib", str(calib), "--no-search",
                 "--target-params", str(target), *SMALL, "-o", str(tmp_path / "cli")]) == 0
    by_cli = fxsym.prune.persist.read_manifest(tmp_path / "cli")["plan"]
    by_api = fxsym.prune_checkpoint(src, tmp_path / "api", calibration=calib, search=False,
                                    target_params=target, calibration_tokens=64, seq_len=16,
                                    round_to=8)
    for plan in (by_cli, by_api):
        assert "search" not in plan.extra and plan.params_after <= target
    assert by_cli.choices() == by_api.choices()


def test_an_in_memory_layer_count_and_target_search_widths_at_that_depth(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, ``--layers 2 --target-params N`` on an in-memory model was one plan of widths
    (only ``--target-active-params`` searched at a fixed depth)."""
    target = n_params(_model()) // 3
    out = tmp_path / "out"
    code = main(["prune", "test_search_flags:_model", "--target-params", str(target),
                 "--layers", "2", "--round-to", "8", "-o", str(out)])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert "calib loss" in said.out
    plan = fxsym.prune.persist.read_manifest(out)["plan"]
    assert [len(d.keep) for d in plan.depth] == [2] and plan.params_after <= target


def _model() -> object:
    cfg = transformers.AutoConfig.for_model(
        "llama", hidden_size=64, intermediate_size=192, vocab_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


@pytest.mark.parametrize("how", [dict(ratio=0.3), dict(param_ratio=0.3),
                                 dict(sizes={"ffn": 96})], ids=["ratio", "param-ratio", "sizes"])
def test_widths_ranked_by_magnitude_by_default_warn(tmp_path: Path, how: dict[str, object]
                                                    ) -> None:
    src = tmp_path / "in"
    _llama(src)
    with pytest.warns(fxsym.ImportanceWarning, match="calibration text"):
        plan = fxsym.prune_checkpoint(src, tmp_path / "out", **how)  # type: ignore[arg-type]
    assert plan.importance == "l2"


def test_an_asked_magnitude_ranking_or_depth_positions_do_not_warn(tmp_path: Path) -> None:
    src = tmp_path / "in"
    _llama(src)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fxsym.ImportanceWarning)
        fxsym.prune_checkpoint(src, tmp_path / "a", ratio=0.3, importance="l2")
        fxsym.prune_checkpoint(src, tmp_path / "b", layers=[0, 2])


def test_the_cli_warns_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in"
    target = _llama(src)
    assert main(["prune", str(src), "--target-params", str(target), "-o",
                 str(tmp_path / "out")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "ImportanceWarning" in line]
    assert len(lines) == 1 and lines[0].startswith("fxsym: ImportanceWarning: ")
    assert "--calib FILE" in lines[0] and "--importance l2" in lines[0]


@pytest.mark.parametrize("args, says", [
    (["--search", "--ratio", "0.3", "--calib", "CALIB"], "--search searches candidates"),
    (["--search", "--target-params", "1000"], "give --calib FILE"),
    (["--no-search", "--target-active-params", "1000", "--calib", "CALIB"],
     "--target-active-params is met by the architecture search only"),
], ids=["search-without-target", "search-without-calib", "active-without-search"])
def test_search_flags_that_cannot_hold_are_refused(tmp_path: Path, calib: Path,
                                                   args: list[str], says: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "in", tmp_path / "out"
    _llama(src)
    args = [str(calib) if a == "CALIB" else a for a in args]
    assert main(["prune", str(src), *args, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("fxsym: ") and says in err, err
    assert not out.exists()
